"""A provider's 5xx answer over the in-memory world: it comes after the whole request was
written and cannot prove the request was not processed (Mailgun accepted requests and answered
504), so the attempt is ambiguous and evidence decides: the provider's query API, or its
tagged webhooks, before any recipient goes to the next provider. A refusal the provider
documents as "not processed" (a 429, an unreachable provider) still fails over at once."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import orjson
import pytest

from sandbox import signing
from services.consumers import protocol
from shared.core.models import Chunk
from shared.delivery.attempts import chunk_line
from shared.delivery.batchstore import NewBatch
from shared.delivery.domain_capacity import CapacityGate, CapacityRules
from shared.outbound.hook_store import Endpoint
from shared.outbound.user_hooks import FakeUserHooks
from shared.providers.base import Receipt
from tests.fakes.delivery import FakeDomainVolumes
from tests.fakes.world import World, answered

A, B = "ann@example.org", "bob@example.org"
SERVER_ERRORS = [500, 502, 503, 504]
MG_KEY = "unit-mailgun-signing-key"


async def _quiet(w: World) -> None:
    """Deliver everything ready, without letting any time pass."""
    while await w.step():
        pass


def _calls(w: World) -> list[tuple[str, str, list[str]]]:
    """Every provider call as (attempt tag, provider, addresses), in attempt order."""
    out = [
        (c.attempt, code, sorted(r.email for r in c.recipients))
        for code, provider in w.providers.items()
        for c in provider.sent
    ]
    return sorted(out, key=lambda call: int(call[0].split(".")[1]))


async def _evidence(w: World, batch: NewBatch) -> dict[str, set[str]]:
    """Each recipient's accepted attempts (one each means sent exactly once)."""
    return {
        r["email"]: set(r["evidence"] or ()) for r in await w.recipients.batch_rows(batch.batch_id)
    }


def _stamped(w: World, code: str, times: list[datetime]) -> None:
    """Provider ``code`` accepts its next call, noting when it came."""

    async def accept(chunk: Chunk) -> Receipt:
        times.append(w.clock.now)
        return Receipt(code, 202, f"{code}-ok")

    w.providers[code].answers.append(accept)


@pytest.mark.parametrize("status", SERVER_ERRORS)
async def test_a_5xx_leaves_the_attempt_ambiguous_and_sends_nothing_elsewhere(status: int) -> None:
    """The attempt waits for evidence: no other provider is called, the recipients stay
    queued, the call counts against the provider's health, and the sending domain's capacity
    keeps the recipients (they may have gone out)."""
    volumes = FakeDomainVolumes()
    w = World(
        capacity=CapacityGate(volumes), capacity_rules=CapacityRules(enabled=True, initial=1000)
    )
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(answered("sg", status))
    await _quiet(w)

    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (attempt.state, attempt.decision) == ("ambiguous", None)
    assert attempt.error == f"transient|HTTP {status}"
    assert w.providers["mg"].sent == []
    assert await w.states(batch) == {A: "queued", B: "queued"}
    assert w.counter("ambiguous", provider="sg") == 1
    assert w.counter("attempts_failed", provider="sg", kind="transient") == 0
    assert [counts[:2] for counts in w.dispatcher.tally.counts.values()] == [[1, 1]]
    assert [day["sent"] for day in volumes.days.values()] == [2]


@pytest.mark.parametrize("status", SERVER_ERRORS)
async def test_a_provider_that_accepted_and_answered_5xx_gets_each_recipient_once(
    status: int,
) -> None:
    """The regression measured on the real stack: Mailgun accepts and answers 504; its query
    API shows the request, so nobody is sent again through SendGrid."""
    w = World(chain="mg,sg")
    batch = await w.accept(A, B)
    w.providers["mg"].answers.append(answered("mg", status))
    w.providers["mg"].found = frozenset({A, B})
    await w.settle()

    assert _calls(w) == [("c.0", "mg", [A, B])]
    assert await _evidence(w, batch) == {A: {"c.0"}, B: {"c.0"}}
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (attempt.state, attempt.resolution, attempt.decision) == ("resolved", "accepted", "done")
    assert {r["event"] for r in (await w.rows(batch)).values()} == {"sent"}


@pytest.mark.parametrize(
    ("found", "resent"), [(frozenset(), [A, B]), (frozenset({A}), [B])], ids=["none", "some"]
)
async def test_a_5xx_moves_on_only_what_the_query_api_did_not_find_once_it_is_due(
    found: frozenset[str], resent: list[str]
) -> None:
    """The next provider gets the recipients the query API has no record of, and not before
    the query is due (SAFEDELIVR_PROVIDERS_QUERY_AFTER)."""
    w = World(query_after=60)
    batch = await w.accept(A, B)
    start = w.clock.now
    w.providers["sg"].answers.append(answered("sg", 503))
    w.providers["sg"].found = found
    moved_on: list[datetime] = []
    _stamped(w, "mg", moved_on)
    await w.settle()

    assert _calls(w) == [("c.0", "sg", [A, B]), ("c.1", "mg", resent)]
    assert [(t - start).total_seconds() >= 60 for t in moved_on] == [True]
    assert len(w.providers["sg"].lookups) == 1
    first, _ = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert first.resolution == ("not_accepted" if not found else "partial")
    assert await _evidence(w, batch) == {e: {"c.0" if e in found else "c.1"} for e in (A, B)}


async def test_without_a_query_api_a_5xx_moves_on_after_the_webhook_window() -> None:
    """No query API and no webhook: the recipients go to the next provider only once the
    webhook window has passed without any event."""
    w = World(webhook_window=600, resolve_interval=30)
    batch = await w.accept(A)
    start = w.clock.now
    w.providers["sg"].answers.append(answered("sg", 502))
    w.providers["sg"].found = None
    moved_on: list[datetime] = []
    _stamped(w, "mg", moved_on)
    await w.settle()

    assert [(t - start).total_seconds() >= 600 for t in moved_on] == [True]
    first, _ = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (first.state, first.resolution) == ("resolved", "not_accepted")
    assert await _evidence(w, batch) == {A: {"c.1"}}


def _accepted_event(batch: NewBatch, email: str, tag: str) -> bytes:
    """Mailgun's ``accepted`` webhook for ``email``, carrying our variables and the attempt's
    tag, as a shared (not bulk) message has them."""
    event_data = {
        "event": "accepted",
        "id": uuid.uuid4().hex,
        "timestamp": time.time(),
        "recipient": email,
        "user-variables": {"batch_id": str(batch.batch_id), "chunk": "0", "sd_attempt": tag},
    }
    signature = signing.mailgun_signature(MG_KEY, int(time.time()))
    return orjson.dumps({"signature": signature, "event-data": event_data})


async def test_a_tagged_webhook_showing_acceptance_settles_a_5xx_without_a_resend() -> None:
    """Mailgun answers 504 and has no usable query API; its ``accepted`` webhooks for the
    attempt arrive: both recipients count as sent by it, and SendGrid is never called."""
    w = World(chain="mg,sg", query_after=60, webhook_window=600)
    batch = await w.accept(A, B)
    w.providers["mg"].answers.append(answered("mg", 504))
    w.providers["mg"].found = None
    await _quiet(w)
    for email in (A, B):
        assert (await w.intake.receive("mg", _accepted_event(batch, email, "c.0")))["applied"]
    await w.settle()

    assert _calls(w) == [("c.0", "mg", [A, B])]
    assert await _evidence(w, batch) == {A: {"c.0"}, B: {"c.0"}}
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert attempt.resolution == "accepted"


async def test_a_429_still_fails_over_at_once() -> None:
    """A 429 is documented as not processed: the next provider is called straight away."""
    w = World()
    batch = await w.accept(A)
    start = w.clock.now
    w.providers["sg"].answers.append(answered("sg", 429))
    await _quiet(w)

    assert _calls(w) == [("c.0", "sg", [A]), ("c.1", "mg", [A])]
    assert w.clock.now == start
    first, _ = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (first.state, first.error) == ("rejected", "transient|HTTP 429")


async def test_users_are_told_a_5xx_call_was_confirmed_not_sent_by_the_query_api() -> None:
    """The user's webhooks hear that SendGrid's 503 was confirmed not sent by its query API,
    the hand-over to Mailgun, and Mailgun's acceptance."""
    hooks = FakeUserHooks()
    w = World(user_hooks=hooks)
    batch = await w.accept(A)
    endpoint = Endpoint(
        user_id=batch.user_id, endpoint_id=uuid.uuid4(), url="https://hooks.example/x",
        events=frozenset(), secret="whsec_x", created_at=datetime.now(UTC),
    )  # fmt: skip
    hooks.add(batch.user_id, endpoint)
    w.providers["sg"].answers.append(answered("sg", 503, b'{"errors":[{"message":"down"}]}'))
    await w.settle()

    told = [orjson.loads(q.body) for q in hooks.queued[endpoint.endpoint_id]]
    assert [
        (t["type"], t["data"]["provider"], t["data"]["outcome"], t["data"]["evidence"])
        for t in told
    ] == [
        ("recipient.attempt", "sg", "confirmed not sent", "provider query"),
        ("recipient.failed_over", "sg", "to mg", "provider query"),
        ("recipient.attempt", "mg", "accepted", "api"),
    ]
    assert told[0]["data"]["reason"] == "HTTP 503: down"


async def test_a_late_5xx_after_a_presumed_death_leaves_the_outcome_to_the_evidence() -> None:
    """Our call outlived its lease and was marked ambiguous; the 503 it then gets proves
    nothing, so the query API decides: Ann, whom SendGrid took, is not sent again."""
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(answered("sg", 503))
    w.providers["sg"].found = frozenset({A})
    await w.step()
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None

    async def presumed_dead(point: str, job: protocol.Job) -> None:
        (attempt,) = await w.attempts.line(job.batch_id, job.line)
        assert await w.attempts.transition(
            job.batch_id, job.line, job.attempt, expect={"state": "calling"},
            values={"state": "ambiguous", "checks": attempt.checks + 1},
        )  # fmt: skip

    w.fault_points["answered"] = presumed_dead
    await w.deliver(message)
    del w.fault_points["answered"]
    await w.settle()

    assert _calls(w) == [("c.0", "sg", [A, B]), ("c.1", "mg", [B])]
    first, _ = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert first.resolution == "partial"
    assert await _evidence(w, batch) == {A: {"c.0"}, B: {"c.1"}}
