"""Users' webhook events: filters, webhook-ids, payloads, what is queued for whom, and in
which slices (pure)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from shared.outbound.hook_queue import ENQUEUE_BYTES, ENQUEUE_SLICE, Queued, enqueued
from shared.outbound.hook_store import Endpoint
from shared.outbound.user_hooks import (
    EVENT_TYPES,
    EventsError,
    HookEvent,
    message_id,
    parse_events,
    payload,
    queued_for,
    shown_events,
    wants,
)

AT = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _event(type_: str = "recipient.delivered", source: str = "ev-1", **kw: object) -> HookEvent:
    values: dict[str, object] = {
        "type": type_,
        "source_id": source,
        "occurred_at": AT,
        "batch_id": uuid.UUID(int=1),
        "log_id": uuid.UUID(int=2),
        "email": "ann@example.com",
        **kw,
    }
    return HookEvent(**values)  # type: ignore[arg-type]


def _endpoint(events: frozenset[str] = frozenset(), *, enabled: bool = True) -> Endpoint:
    return Endpoint(
        uuid.uuid4(), uuid.uuid4(), "https://h.example/x", events, "whsec_x", AT, enabled
    )


@pytest.mark.parametrize("requested", [None, [], ["*"]])
def test_no_filter_or_a_star_means_every_event(requested: list[str] | None) -> None:
    """Stored as the empty set, shown as ``["*"]``."""
    assert parse_events(requested) == frozenset()
    assert shown_events(parse_events(requested)) == ["*"]


def test_named_types_are_kept() -> None:
    """A filter of known types is stored as given."""
    assert parse_events(["recipient.sent", "recipient.bounced"]) == {
        "recipient.sent",
        "recipient.bounced",
    }


def test_an_unknown_type_is_refused_by_name() -> None:
    """The error names the type that does not exist."""
    with pytest.raises(EventsError, match=r"recipient\.exploded"):
        parse_events(["recipient.sent", "recipient.exploded"])


def test_a_star_with_types_is_refused() -> None:
    """``*`` alone, or types."""
    with pytest.raises(EventsError):
        parse_events(["*", "recipient.sent"])


def test_a_filter_selects_its_types_only() -> None:
    """An empty filter wants everything; a named one only its types."""
    assert all(wants(frozenset(), t) for t in EVENT_TYPES)
    assert wants(frozenset({"recipient.sent"}), "recipient.sent")
    assert not wants(frozenset({"recipient.sent"}), "recipient.opened")


def test_the_same_source_is_the_same_message() -> None:
    """The webhook-id depends on the source and the type only."""
    first = message_id(_event(source="sg-123"))
    again = message_id(_event(source="sg-123", occurred_at=AT + timedelta(hours=1)))

    assert first == again
    assert first.startswith("msg_")
    assert message_id(_event(source="sg-124")) != first
    assert message_id(_event("recipient.bounced", source="sg-123")) != first


def test_the_payload_carries_the_recipient_and_the_evidence() -> None:
    """``{type, timestamp, data}`` with the fields of the contract."""
    body = orjson.loads(
        payload(
            _event(
                "recipient.attempt",
                provider="sg",
                attempt=2,
                outcome="timed out",
                evidence="provider query",
                attempt_id="att-7",
            )
        )
    )

    assert body == {
        "type": "recipient.attempt",
        "timestamp": AT.isoformat(),
        "data": {
            "batch_id": str(uuid.UUID(int=1)),
            "log_id": str(uuid.UUID(int=2)),
            "email": "ann@example.com",
            "provider": "sg",
            "attempt": 2,
            "outcome": "timed out",
            "evidence": "provider query",
            "reason": None,
            "attempt_id": "att-7",
            "occurred_at": AT.isoformat(),
        },
    }


def test_events_are_queued_in_order_of_occurrence() -> None:
    """Events of one call given out of order are queued oldest first."""
    endpoint = _endpoint()
    late = _event("recipient.delivered", "b", occurred_at=AT + timedelta(seconds=2))
    early = _event("recipient.sent", "a", occurred_at=AT)

    rows = queued_for([endpoint], [late, early])

    assert [r.type for r in rows] == ["recipient.sent", "recipient.delivered"]


def test_an_endpoint_disabled_after_failing_keeps_collecting_what_happens() -> None:
    """Turned off by its failures, its events wait for it to be enabled again."""
    failed = dataclasses.replace(
        _endpoint(enabled=False), disabled_at=AT, disabled_reason="failing for a day"
    )

    rows = queued_for([failed], [_event("recipient.sent")])

    assert [r.endpoint_id for r in rows] == [failed.endpoint_id]


def test_only_enabled_endpoints_that_want_the_type_get_it() -> None:
    """An endpoint its user disabled and one filtering the type out get nothing."""
    everything, opens_only = _endpoint(), _endpoint(frozenset({"recipient.opened"}))
    disabled = _endpoint(enabled=False)

    rows = queued_for([everything, opens_only, disabled], [_event("recipient.sent")])

    assert [r.endpoint_id for r in rows] == [everything.endpoint_id]


def test_an_event_of_an_unknown_type_cannot_be_made() -> None:
    """A wiring mistake fails where it is made, not at a user's endpoint."""
    with pytest.raises(ValueError, match="unknown webhook event type"):
        _event("recipient.exploded")


def test_an_event_needs_an_aware_time() -> None:
    """Naive datetimes are refused (timestamps are UTC on the wire)."""
    with pytest.raises(ValueError, match="timezone"):
        _event(occurred_at=datetime(2026, 11, 26, 12, 0))  # noqa: DTZ001


def test_webhook_events_with_long_bodies_are_queued_in_slices_under_the_threshold() -> None:
    """A chunk's thousand events with 4 kB bodies (1,000-character reasons) are queued in
    logged batches of at most ENQUEUE_BYTES of bodies (each written twice), in order, under
    the 50 KiB ``batch_size_fail_threshold`` Cassandra has by default; short ones 25 at a
    time."""
    endpoint = uuid.uuid4()
    long = [Queued(endpoint, f"msg_{i}", "recipient.bounced", b"x" * 4_000) for i in range(1_000)]
    short = [Queued(endpoint, f"msg_{i}", "recipient.sent", b"x" * 400) for i in range(1_000)]

    cut = enqueued(long)

    assert [i for run in cut for i in run] == list(range(1_000))
    assert all(sum(2 * len(long[i].body) for i in run) <= ENQUEUE_BYTES for run in cut)
    assert ENQUEUE_BYTES < 50 * 1024
    assert {len(run) for run in enqueued(short)} == {ENQUEUE_SLICE}
