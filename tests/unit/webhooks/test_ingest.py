"""The webhook ingest shell over the in-memory twins: what each provider event does to its
recipient, the timeline, the stats, the suppression list and the broker."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest

from shared.core.batch_ids import accepted_at
from shared.core.errors import DependencyUnavailable, PublishError
from shared.core.models import LogJob
from shared.core.webhook_events import ProviderEvent
from shared.delivery.batchstore import NewBatch
from shared.delivery.handoff import HandOff, Routing
from shared.delivery.recipients import log_id_for
from shared.infra.current import Current
from shared.infra.topology import log_key
from tests.fakes.cassandra import OPERATION_KINDS
from tests.fakes.world import World

A, B = "a@example.org", "b@example.org"


def event(batch: NewBatch, kind: str, *, email: str = A, **fields: object) -> ProviderEvent:
    """An event of ``kind`` for ``email`` of ``batch``, tagged with its chunk's first attempt."""
    values: dict[str, object] = {
        "provider": "sg",
        "event_id": uuid.uuid4().hex,
        "kind": kind,
        "raw_event": kind,
        "email": email,
        "occurred_at": accepted_at(batch.batch_id) + timedelta(seconds=10),
        "batch_id": batch.batch_id,
        "chunk": 0,
        "log_id": log_id_for(batch.batch_id, email),
        "attempt": "c.0",
        "message_id": "sg-1",
        "reason": None,
        "provider_side": False,
        "suppress": False,
    }
    values.update(fields)
    return ProviderEvent(**values)  # type: ignore[arg-type]


def timeline(w: World, batch_id: uuid.UUID, log_id: uuid.UUID) -> dict[str, dict[str, object]]:
    """A recipient's timeline entries by event id."""
    return {e: row for (b, log, _, e), row in w.db.events.items() if (b, log) == (batch_id, log_id)}


async def test_a_delivery_makes_the_recipient_a_success_and_counts_it_once() -> None:
    w = World()
    batch = await w.sent(A, B)
    ev = event(batch, "delivered")
    assert await w.ingest.apply(ev) == "applied"
    assert await w.ingest.apply(ev) == "applied"  # the provider retried the webhook
    assert await w.states(batch) == {A: "success", B: "queued"}
    log_id = log_id_for(batch.batch_id, A)
    assert timeline(w, batch.batch_id, log_id) == {
        ev.event_id: {"kind": "delivered", "provider": "sg", "attempt": "c.0", "counted": True}
    }
    assert await w.counts(batch) == {"queued": 2, "success": 1}
    assert (await w.stat_row(batch, A) or {})["outcome"] == "success"
    assert await w.stat_row(batch, B) is None


async def test_a_hard_bounce_fails_the_recipient_and_suppresses_the_address() -> None:
    w = World()
    batch = await w.sent(A)
    await w.ingest.apply(event(batch, "bounced", reason="550 no such user", suppress=True))
    row = (await w.rows(batch))[A]
    assert (await w.states(batch), row["reason_detail"]) == ({A: "failed"}, "550 no such user")
    assert await w.suppressions.suppressed(batch.user_id, [A]) == {A: "bounced"}
    assert await w.counts(batch) == {"queued": 1, "failed": 1, "bounced": 1}
    stat = await w.stat_row(batch, A) or {}
    assert (stat["outcome"], stat["bounced"]) == ("failed", True)
    assert dict(row["providers"]) == {"sg": "bounced: 550 no such user"}  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("kind", "raw", "reason", "mark"),
    [
        ("complained", "spamreport", None, "complained"),
        ("unsubscribed", "unsubscribe", None, "unsubscribed"),
        ("dropped", "dropped", "Unsubscribed Address", "unsubscribed"),
        ("dropped", "failed/permanent/suppress-complaint", None, "complained"),
        ("bounced", "bounce", "550 no such user", None),
        ("dropped", "dropped", "Bounced Address", None),
    ],
)
async def test_a_suppression_is_marked_as_the_recipients_own_when_they_made_it(
    kind: str, raw: str, reason: str | None, mark: str | None
) -> None:
    """A complaint or an unsubscribe (or a provider's drop for one) marks the suppression
    ``by_recipient``, so only an operator can lift it; a bounce does not."""
    w = World()
    batch = await w.sent(A)
    await w.ingest.apply(event(batch, kind, raw_event=raw, reason=reason, suppress=True))

    assert w.db.suppressions[(batch.user_id, A)]["by_recipient"] == mark


async def test_an_event_for_an_unknown_batch_is_kept_as_an_orphan() -> None:
    w = World()
    batch = await w.sent(A)
    stray = event(batch, "delivered", batch_id=uuid.uuid1())
    assert await w.ingest.apply(stray) == "orphan"
    assert (stray.provider, stray.occurred_at.date(), stray.event_id) in w.db.orphans
    assert await w.states(batch) == {A: "queued"}


async def test_an_event_naming_no_recipient_of_its_chunk_is_an_orphan_and_counts_nothing() -> None:
    w = World()
    batch = await w.sent(A)
    stray = event(batch, "delivered", email="x@example.org")  # its log id is in no chunk
    assert await w.ingest.apply(stray) == "orphan"
    assert await w.ingest.apply(event(batch, "delivered", chunk=1)) == "orphan"  # wrong chunk
    assert await w.counts(batch) == {"queued": 1}
    assert await w.states(batch) == {A: "queued"}


async def test_an_event_without_ids_is_matched_by_address_case_insensitively() -> None:
    w = World()
    batch = await w.sent(A, B)
    ev = event(batch, "delivered", email=B, chunk=None, log_id=None)
    assert await w.ingest.apply(replace(ev, email="B@Example.ORG")) == "applied"
    assert await w.states(batch) == {A: "queued", B: "success"}
    unknown = replace(event(batch, "delivered", chunk=None, log_id=None), email="x@example.org")
    assert await w.ingest.apply(unknown) == "orphan"


async def test_a_provider_side_drop_hands_the_recipient_to_the_next_provider_once() -> None:
    w = World()
    batch = await w.sent(A)
    drop = event(batch, "dropped", provider_side=True, reason="provider blocklist")
    await w.ingest.apply(drop)
    await w.ingest.apply(drop)  # the webhook again
    await w.settle()
    assert w.providers["mg"].emails() == [A]
    row = (await w.rows(batch))[A]
    assert row["superseded"] == frozenset({"c.0"})
    assert await w.states(batch) == {A: "queued"}
    assert w.ingest.metrics.resends.labels("sg")._value.get() == 1  # the replay is superseded


async def test_a_drop_is_handed_over_along_the_chain_in_force_when_it_is_applied() -> None:
    """The webhooks process's live settings pause Mailgun after its ingest was built: a
    SendGrid drop then finds no provider left in the running chain and is given up."""
    w = World()
    routing = Current(Routing(("sg", "mg"), 4))
    ingest = replace(w.ingest, handoff=HandOff(w.attempts, w.recipients, w.broker, routing))  # type: ignore[arg-type]
    batch = await w.sent(A)
    routing.set(Routing(("sg",), 4))

    await ingest.apply(event(batch, "dropped", provider_side=True, reason="provider blocklist"))
    await w.settle()

    assert w.providers["mg"].sent == []
    assert await w.states(batch) == {A: "failed"}
    assert (await w.rows(batch))[A]["superseded"] == frozenset({"c.0"})


async def test_a_failure_of_a_handed_over_attempt_decides_nothing() -> None:
    w = World()
    batch = await w.sent(A)
    await w.ingest.apply(event(batch, "dropped", provider_side=True))
    await w.settle()
    late = event(batch, "bounced", reason="550", suppress=True)
    await w.ingest.apply(late)
    assert await w.states(batch) == {A: "queued"}
    log_id = log_id_for(batch.batch_id, A)
    assert timeline(w, batch.batch_id, log_id)[late.event_id]["counted"] is False
    delivered = event(batch, "delivered", provider="mg", attempt="r.0")
    await w.ingest.apply(delivered)
    assert await w.states(batch) == {A: "success"}


async def test_a_deferral_schedules_a_deadline_check_after_the_configured_deadline() -> None:
    w = World()
    batch = await w.sent(A)
    w.broker.take()
    ev = event(batch, "deferred", reason="421 try later")
    await w.ingest.apply(ev)
    (check,) = w.broker.take()
    log_id = log_id_for(batch.batch_id, A)
    assert check.routing_key == log_key("sg", log_id)
    assert check.delay == 3600  # the deadline's own delay queue
    assert check.message_id == f"{log_id}:deferral:{ev.event_id}"
    assert LogJob.decode(check.body).deferral == "c.0"
    assert (await w.rows(batch))[A]["event"] == "deferred"


async def test_a_late_deferral_of_a_final_recipient_changes_nothing() -> None:
    w = World()
    batch = await w.sent(A)
    await w.ingest.apply(event(batch, "delivered"))
    w.broker.take()
    await w.ingest.apply(event(batch, "deferred"))
    assert w.broker.take() == []
    assert await w.states(batch) == {A: "success"}


async def test_a_deferral_still_standing_at_its_deadline_resends_elsewhere() -> None:
    w = World()
    batch = await w.sent(A)
    await w.ingest.apply(event(batch, "deferred"))
    await w.settle()
    assert w.providers["mg"].emails() == [A]


@pytest.mark.parametrize("kind", ["opened", "clicked", "complained"])
async def test_engagement_and_complaints_count_without_changing_the_outcome(kind: str) -> None:
    w = World()
    batch = await w.sent(A)
    await w.ingest.apply(event(batch, "delivered"))
    engaged = event(batch, kind, url="https://example.org/x")
    await w.ingest.apply(engaged)
    await w.ingest.apply(engaged)  # the provider retried the webhook
    assert await w.states(batch) == {A: "success"}
    assert await w.counts(batch) == {"queued": 1, "success": 1, kind: 1}
    assert (await w.stat_row(batch, A) or {})[kind] is True


async def test_the_batch_owner_is_read_once_and_unknown_batches_are_not_remembered() -> None:
    w = World()
    batch = await w.sent(A, B)
    await w.ingest.apply(event(batch, "delivered"))
    await w.ingest.apply(event(batch, "delivered", email=B))
    assert w.db.calls.count("batches.owner") == 1
    later = uuid.uuid1()
    ev = event(batch, "delivered", batch_id=later)
    assert await w.ingest.apply(ev) == "orphan"
    assert await w.ingest.apply(ev) == "orphan"
    assert w.db.calls.count("batches.owner") == 3


async def test_apply_all_counts_what_it_applied_and_what_matched_nothing() -> None:
    w = World()
    batch = await w.sent(A)
    counts = await w.ingest.apply_all(
        [event(batch, "delivered"), event(batch, "delivered", batch_id=None)]
    )
    assert counts == {"applied": 1, "orphans": 1}


async def test_the_owner_cache_forgets_the_oldest_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.ingest import ingest

    monkeypatch.setattr(ingest, "OWNER_CACHE", 1)
    w = World()
    first, second = await w.sent(A), await w.sent(B)
    for batch, email in ((first, A), (second, B), (first, A)):
        await w.ingest.apply(event(batch, "delivered", email=email))
    assert w.db.calls.count("batches.owner") == 3


async def test_a_hand_off_whose_publish_was_unconfirmed_is_marked_when_its_event_returns() -> None:
    """The broker took the re-send job but its confirm was lost, so the delivery failed and
    the provider retries it; meanwhile the other provider delivered. The retried event finds
    the recipient final: it still marks the first attempt handed over, or the recipient would
    look sent twice, and the first provider's later failures would count against it."""
    w = World()
    batch = await w.sent(A)
    drop = event(batch, "dropped", provider_side=True, reason="provider blocklist")
    w.broker.fail(PublishError("not confirmed"), delivered=True)
    with pytest.raises(PublishError):
        await w.ingest.apply(drop)
    await w.settle()
    assert w.providers["mg"].emails() == [A]
    await w.ingest.apply(event(batch, "delivered", provider="mg", attempt="r.0"))
    assert (await w.rows(batch))[A]["superseded"] is None
    w.broker.take()
    await w.ingest.apply(drop)  # the provider's retry
    row = (await w.rows(batch))[A]
    assert (row["superseded"], await w.states(batch)) == (frozenset({"c.0"}), {A: "success"})
    assert w.broker.take() == []  # nothing re-sent: the recipient is final


async def test_an_event_applied_through_an_outage_counts_once() -> None:
    """The recipient's state and its stat row are one write: an event whose write was stored
    but not confirmed is applied again by the retried delivery, and counts once."""
    w = World()
    batch = await w.sent(A, B)
    ev = event(batch, "bounced", email=B, chunk=None, log_id=None, reason="550", suppress=True)
    w.db.fail("recipients.locate", DependencyUnavailable("cassandra", "timeout"))
    with pytest.raises(DependencyUnavailable):
        await w.ingest.apply(ev)
    assert await w.counts(batch) == {"queued": 2}
    w.db.fail("recipients.reported", DependencyUnavailable("cassandra", "timeout"), applied=True)
    with pytest.raises(DependencyUnavailable):
        await w.ingest.apply(ev)
    assert await w.ingest.apply(ev) == "applied"
    assert await w.states(batch) == {A: "queued", B: "failed"}
    assert await w.counts(batch) == {"queued": 2, "failed": 1, "bounced": 1}


C, D = "c@example.org", "d@example.org"


async def _snapshot(w: World, *batches: NewBatch) -> object:
    """Everything a delivery's events write: rows with their stamps, timelines, stat rows,
    stats, suppressions and the resends handed over."""
    out: list[object] = [
        dict(w.db.events),
        # a suppression's version is its write time: rewritten, the same suppression
        {
            k: {c: v for c, v in row.items() if c != "version"}
            for k, row in w.db.suppressions.items()
        },
        w.ingest.metrics.resends.labels("sg")._value.get(),
    ]
    for b in batches:
        rows = await w.rows(b)
        out += [rows, await w.counts(b), [await w.stat_row(b, e) for e in sorted(rows)]]
    return out


def _marks(row: dict[str, object] | None) -> dict[str, object]:
    """What a stat row counts (not whose it is)."""
    return {k: v for k, v in (row or {}).items() if k != "log_id"}


def _post(first: NewBatch, second: NewBatch) -> list[ProviderEvent]:
    """One SendGrid delivery over two batches, some recipients reported on more than once."""
    return [
        event(first, "sent", email=A, raw_event="processed"),
        event(first, "delivered", email=A),
        event(first, "bounced", email=B, reason="550 no such user", suppress=True),
        event(second, "delivered", email=C),
        event(second, "opened", email=C),
        event(second, "delivered", email=D, chunk=None, log_id=None),
        event(first, "opened", email=A),
    ]


async def test_a_delivery_over_several_batches_lands_every_outcome_and_counts_each_once() -> None:
    w = World()
    first, second = await w.sent(A, B), await w.sent(C, D)
    answer = await w.ingest.apply_all(_post(first, second))
    assert answer == {"applied": 7, "orphans": 0}
    assert await w.states(first) == {A: "success", B: "failed"}
    assert await w.states(second) == {C: "success", D: "success"}
    assert await w.counts(first) == {
        "queued": 2,
        "success": 1,
        "failed": 1,
        "bounced": 1,
        "opened": 1,
    }
    assert await w.counts(second) == {"queued": 2, "success": 2, "opened": 1}
    assert await w.suppressions.suppressed(first.user_id, [B]) == {B: "bounced"}
    assert len(timeline(w, first.batch_id, log_id_for(first.batch_id, A))) == 3


async def test_a_replayed_delivery_changes_nothing() -> None:
    w = World()
    first, second = await w.sent(A, B), await w.sent(C, D)
    post = _post(first, second)
    await w.ingest.apply_all(post)
    before = await _snapshot(w, first, second)
    await w.ingest.apply_all(post)
    assert await _snapshot(w, first, second) == before


@pytest.mark.parametrize(
    ("point", "applied"),
    [
        ("recipients.reported_many.stats", False),
        ("recipients.reported_many.stats", True),
        ("recipients.reported_many.states", False),
        ("recipients.reported_many.states", True),
        ("suppressions.add", False),
    ],
)
async def test_a_delivery_failed_half_way_then_replayed_converges_and_counts_once(
    point: str, applied: bool
) -> None:
    """A delivery whose writes fail part way (a stat or state batch lost or landed unconfirmed,
    or a suppression after the first round's states are in), twice: the provider's next retry
    converges to what one clean delivery leaves, each outcome counted once."""
    clean = World()
    c1, c2 = await clean.sent(A, B), await clean.sent(C, D)
    await clean.ingest.apply_all(_post(c1, c2))

    w = World()
    first, second = await w.sent(A, B), await w.sent(C, D)
    post = _post(first, second)
    w.db.fail(point, DependencyUnavailable("cassandra", "timeout"), applied=applied)
    w.db.fail(point, DependencyUnavailable("cassandra", "timeout"), applied=applied)
    with pytest.raises(DependencyUnavailable):
        await w.ingest.apply_all(post)
    with pytest.raises(DependencyUnavailable):
        await w.ingest.apply_all(post)
    assert await w.ingest.apply_all(post) == {"applied": 7, "orphans": 0}
    for mine, theirs in ((first, c1), (second, c2)):
        assert await w.states(mine) == await clean.states(theirs)
        assert await w.counts(mine) == await clean.counts(theirs)
        for email in await w.states(mine):
            assert _marks(await w.stat_row(mine, email)) == _marks(
                await clean.stat_row(theirs, email)
            )
    assert len(w.db.events) == len(clean.db.events)


async def test_a_one_event_delivery_is_one_write() -> None:
    """A delivery of one event (a Mailgun post) writes its state, its stat row and its
    timeline row as one logged batch, as applying the event alone does: one write."""
    w = World()
    batch = await w.sent(A, B)
    await w.ingest.apply_all([event(batch, "delivered")])  # the batch's day is known active
    before = len(w.db.calls)
    answer = await w.ingest.apply_all([event(batch, "delivered", email=B)])
    writes = [op for op in w.db.calls[before:] if OPERATION_KINDS[op] != "read"]
    assert (answer, writes) == ({"applied": 1, "orphans": 0}, ["recipients.reported"])
    assert await w.counts(batch) == {"queued": 2, "success": 2}


async def test_a_later_event_in_one_delivery_is_decided_on_the_row_the_earlier_left() -> None:
    """A delivery reporting a recipient delivered, then a provider-side drop of the same
    attempt, hands nothing over: the drop is decided once the delivery is written."""
    w = World()
    batch = await w.sent(A)
    drop = event(batch, "dropped", provider_side=True, reason="provider blocklist")
    await w.ingest.apply_all([event(batch, "delivered"), drop])
    await w.settle()
    assert await w.states(batch) == {A: "success"}
    assert w.providers["mg"].emails() == []
    assert w.ingest.metrics.resends.labels("sg")._value.get() == 0
