"""Routing keys and queue declarations (pure)."""

from __future__ import annotations

import re
import uuid

import pytest

from shared.infra.topology import (
    DELAY_HEADER,
    Topology,
    batch_key,
    dispatch_key,
    log_key,
    parse_routing_key,
)
from tests.fakes.broker import topic_matches

ID = uuid.UUID("0b3c1a9e-8d1f-11ef-9a3b-0242ac120002")


@pytest.mark.parametrize(
    ("key", "kind", "provider", "attempt"),
    [
        (f"batch.{ID}", "batch", None, 0),
        (f"sg.{ID}", "dispatch", "sg", 0),
        (f"mg.{ID}.retry.1", "dispatch", "mg", 1),
        (f"log.sg.{ID}", "log", "sg", 0),
        (f"log.mg.{ID}.retry.12", "log", "mg", 12),
        (f"bulk.sg.{ID}", "dispatch", "sg", 0),
        (f"bulk.mg.{ID}.retry.3", "dispatch", "mg", 3),
    ],
)
def test_parse_round_trips(key: str, kind: str, provider: str | None, attempt: int) -> None:
    """Every key parses into its parts and prints back to itself."""
    parsed = parse_routing_key(key)

    assert (parsed.kind, parsed.id, parsed.provider, parsed.attempt) == (
        kind,
        ID,
        provider,
        attempt,
    )
    assert parsed.lane == ("bulk" if key.startswith("bulk.") else "transactional")
    assert str(parsed) == key


def test_a_bulk_dispatch_key_starts_with_bulk() -> None:
    """The first word is ``bulk``, so the transactional ``<ns>.#`` bindings never match it."""
    assert dispatch_key("sg", ID, 2, "bulk") == f"bulk.sg.{ID}.retry.2"
    assert dispatch_key("sg", ID, 2, "transactional") == f"sg.{ID}.retry.2"


def test_retry_count_is_read_from_the_last_segment() -> None:
    """The Go original read the retry count from the wrong segment; ours reads the number."""
    assert parse_routing_key(dispatch_key("mg", ID, 3)).attempt == 3
    assert parse_routing_key(log_key("sg", ID, 2)).attempt == 2


@pytest.mark.parametrize(
    "key",
    [
        "batch.not-a-uuid",
        f"xx.{ID}",
        f"sg.{ID}.retry",
        f"sg.{ID}.retry.0",
        f"sg.{ID}.again.1",
        f"sg.{ID}.retry.x",
        f"log.{ID}",
        f"log.zz.{ID}",
        f"sg{ID}.retry.1",
        "",
        "bulk",
        f"bulk.{ID}",
        f"bulk.log.sg.{ID}",
        f"bulk.batch.{ID}",
        f"bulk.bulk.sg.{ID}",
        f"bulk.sg.{ID}.retry.0",
    ],
)
def test_bad_keys_are_refused(key: str) -> None:
    """Anything that is not one of our key shapes raises ValueError naming the key."""
    with pytest.raises(ValueError, match=re.escape(f"routing key: {key!r}")):
        parse_routing_key(key)


def test_batch_key_shape() -> None:
    """New batches are published as batch.<uuid>."""
    assert batch_key(ID) == f"batch.{ID}"


def test_unknown_provider_cannot_build_a_key() -> None:
    """Keys are only built for known provider codes."""
    with pytest.raises(ValueError, match="unknown provider code 'postmark'"):
        dispatch_key("postmark", ID)


def test_log_keys_are_bound_for_every_provider() -> None:
    """The original's log.* keys were unroutable; every provider has a log queue binding."""
    t = Topology(exchange="x")
    bindings = {key for spec in t.work_queues() for _, key in spec.bindings}

    assert {"batch.#", "sg.#", "mg.#", "log.sg.#", "log.mg.#"} <= bindings


def test_each_provider_has_a_bulk_queue_bound_to_its_bulk_keys_only() -> None:
    """A bulk chunk reaches the provider's bulk queue and no other; a transactional chunk
    never reaches it."""
    t = Topology(exchange="x")
    bulk = dispatch_key("mg", ID, 1, "bulk")
    plain = dispatch_key("mg", ID, 1)

    def routes(key: str) -> set[str]:
        return {
            spec.name
            for spec in t.work_queues()
            for _, pattern in spec.bindings
            if topic_matches(pattern, key)
        }

    assert routes(bulk) == {t.bulk_queue("mg")} == {"x.mg.bulk"}
    assert routes(plain) == {t.provider_queue("mg")}
    assert t.lane_queue("mg", "bulk") == t.bulk_queue("mg")
    assert t.lane_queue("mg", "transactional") == t.provider_queue("mg")
    assert t.sender_queues("sg") == ("x.sg", "x.sg.bulk", "x.log.sg")


def test_work_queues_are_quorum_with_dead_lettering() -> None:
    """Work queues are quorum queues with a delivery limit and an at-least-once DLX."""
    t = Topology(exchange="x", delivery_limit=7)
    for spec in t.work_queues():
        assert spec.arguments["x-queue-type"] == "quorum"
        assert spec.arguments["x-delivery-limit"] == 7
        assert spec.arguments["x-dead-letter-exchange"] == "x.dlx"
        assert spec.arguments["x-dead-letter-strategy"] == "at-least-once"


def test_delay_queues_dead_letter_back_to_the_main_exchange() -> None:
    """Each delay tier is a TTL queue that expires into the main exchange, routed by header."""
    t = Topology(exchange="x", delay_tiers=(5, 30))
    specs = {s.name: s for s in t.delay_queues()}

    assert specs["x.delay.30s"].arguments["x-message-ttl"] == 30_000
    assert specs["x.delay.30s"].arguments["x-dead-letter-exchange"] == "x"
    assert specs["x.delay.30s"].header_binding == (
        "x.delay",
        {"x-match": "all", DELAY_HEADER: "30"},
    )


@pytest.mark.parametrize(("wanted", "tier"), [(0.1, 5), (5, 5), (6, 30), (999, 30)])
def test_delay_tier_rounds_up_to_a_declared_tier(wanted: float, tier: int) -> None:
    """A wait maps to the smallest tier at least as long, else the longest tier."""
    assert Topology(delay_tiers=(5, 30)).delay_tier_for(wanted) == tier


def test_a_wake_key_names_its_endpoint() -> None:
    """``whook.<uuid>`` parses back to the endpoint it was made for."""
    from shared.infra.topology import parse_wake_key, wake_key

    assert parse_wake_key(wake_key(ID)) == ID


@pytest.mark.parametrize("key", ["whook", "whook.nope", f"hook.{ID}", f"batch.{ID}"])
def test_anything_else_is_not_a_wake_key(key: str) -> None:
    """Other keys and malformed ids are refused."""
    from shared.infra.topology import parse_wake_key

    with pytest.raises(ValueError):
        parse_wake_key(key)


def test_wake_ups_have_a_quorum_queue_of_their_own() -> None:
    """``whook.#`` is bound to the hooks queue, which dead-letters like every work queue."""
    t = Topology(exchange="x")
    (spec,) = [q for q in t.work_queues() if q.name == t.hooks_queue]

    assert spec.bindings == (("x", "whook.#"),)
    assert spec.arguments["x-queue-type"] == "quorum"
    assert spec.arguments["x-dead-letter-exchange"] == t.dead_letter_exchange


def test_the_deployed_topology_has_every_webhook_retry_tier() -> None:
    """Each delay of users' webhook retries (up to 8 h) is a delay queue of its own."""
    from shared.infra.config import Settings
    from shared.infra.resources import topology_for
    from shared.outbound.outbound_retry import DELAYS

    tiers = topology_for(Settings()).all_delay_tiers

    assert set(DELAYS) <= set(tiers)
    assert max(tiers) == 28800
