"""The store contract: what the consumers and the webhook service rely on from each store,
asserted identically of the in-memory twin and of the real store on Cassandra."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from shared.batchstore import NewBatch, log_id_for
from shared.precedence import accepted_at, visible
from shared.stats import batch_day
from shared.webhook_events import ProviderEvent
from tests.contracts.conftest import Stores
from tests.fakes.world import new_batch


def _batch(*emails: str, chunk_size: int = 2, batch_id: uuid.UUID | None = None) -> NewBatch:
    return new_batch(*emails, chunk_size=chunk_size, batch_id=batch_id)


async def _stored(stores: Stores, *emails: str, chunk_size: int = 2) -> NewBatch:
    batch = _batch(*emails, chunk_size=chunk_size)
    await stores.batches.write(batch)
    await stores.batches.index(batch)
    return batch


def _at(batch: NewBatch, seconds: float) -> datetime:
    """A moment ``seconds`` after the batch was accepted."""
    return accepted_at(batch.batch_id) + timedelta(seconds=seconds)


def _event(batch: NewBatch, kind: str = "delivered", **fields: object) -> ProviderEvent:
    values: dict[str, object] = {
        "provider": "sg",
        "event_id": uuid.uuid4().hex,
        "kind": kind,
        "raw_event": kind,
        "email": "a@example.org",
        "occurred_at": _at(batch, 5),
        "batch_id": batch.batch_id,
        "chunk": 0,
        "log_id": batch.recipients[0].log_id,
        "attempt": "c.0",
        "message_id": None,
        "reason": None,
        "provider_side": False,
        "suppress": False,
    }
    values.update(fields)
    return ProviderEvent(**values)  # type: ignore[arg-type]


async def test_a_written_batch_has_a_header_an_owner_and_an_address_index(stores: Stores) -> None:
    batch = await _stored(stores, "a@example.org", "B@Example.org", "c@example.org")
    header = await stores.batches.header(batch.batch_id)
    assert header is not None
    assert (header.user_id, header.chunk_count, header.status) == (batch.user_id, 2, "accepted")
    assert await stores.batches.owner(batch.batch_id) == batch.user_id
    assert await stores.batches.locate(batch.batch_id, "b@EXAMPLE.org") == (
        0,
        batch.recipients[1].log_id,
    )
    assert await stores.batches.locate(batch.batch_id, "c@example.org") == (
        1,
        batch.recipients[2].log_id,
    )


async def test_an_unknown_batch_has_no_header_owner_or_recipient(stores: Stores) -> None:
    unknown = uuid.uuid1()
    assert await stores.batches.header(unknown) is None
    assert await stores.batches.owner(unknown) is None
    assert await stores.batches.locate(unknown, "a@example.org") is None


async def test_set_status_changes_the_headers_status(stores: Stores) -> None:
    batch = await _stored(stores, "a@example.org")
    await stores.batches.set_status(batch.batch_id, "dispatched")
    header = await stores.batches.header(batch.batch_id)
    assert header is not None and header.status == "dispatched"


def _sign_bit_pair() -> tuple[uuid.UUID, str, str]:
    """A batch id and two addresses whose log ids differ first in the sign bit of a byte of
    their clock sequence, so that Cassandra's order (signed bytes) and Python's (unsigned)
    disagree."""
    for n in range(10_000):
        batch_id = uuid.uuid1()
        a, b = f"s{n}a@example.org", f"s{n}b@example.org"
        x, y = log_id_for(batch_id, a).bytes[8:], log_id_for(batch_id, b).bytes[8:]
        first = next((i for i in range(8) if x[i] != y[i]), None)
        if first is not None and (x[first] ^ y[first]) & 0x80:
            return batch_id, a, b
    raise AssertionError("no such pair")


async def test_recipients_of_a_chunk_come_in_cassandras_timeuuid_order(stores: Stores) -> None:
    batch_id, a, b = _sign_bit_pair()
    batch = _batch(a, b, batch_id=batch_id)
    await stores.batches.write(batch)
    rows = await stores.recipients.chunk_rows(batch_id, 0)
    # Same time: ordered by the clock sequence and node as *signed* bytes.
    signed = sorted(
        batch.recipients,
        key=lambda r: [int.from_bytes([x], signed=True) for x in r.log_id.bytes[8:]],
    )
    assert [r["email"] for r in rows] == [r.email for r in signed]
    python_order = sorted(batch.recipients, key=lambda r: r.log_id)
    assert [r.email for r in signed] != [r.email for r in python_order]


async def test_recipients_start_queued_in_their_chunks(stores: Stores) -> None:
    batch = await _stored(stores, "a@example.org", "b@example.org", "c@example.org")
    first = await stores.recipients.chunk_rows(batch.batch_id, 0)
    assert sorted(r["email"] for r in first) == ["a@example.org", "b@example.org"]
    assert {visible(r).state for r in first} == {"queued"}
    assert sorted(r["email"] for r in await stores.recipients.batch_rows(batch.batch_id))[:2] == [
        "a@example.org",
        "b@example.org",
    ]
    assert (await stores.recipients.batch_rows(batch.batch_id))[-1]["email"] == "c@example.org"
    assert await stores.recipients.one(batch.batch_id, 1, uuid.uuid1()) is None


async def test_acceptance_records_evidence_and_the_provider(stores: Stores) -> None:
    batch = await _stored(stores, "a@example.org")
    log_id = batch.recipients[0].log_id
    for _ in range(2):  # a replay writes the same cells
        await stores.recipients.accepted(
            batch.batch_id,
            0,
            [log_id],
            provider="sg",
            tag="c.0",
            when=_at(batch, 1),
            message_id="m-1",
        )
    row = await stores.recipients.one(batch.batch_id, 0, log_id)
    assert row is not None
    assert (row["event"], visible(row).state) == ("sent", "queued")
    assert dict(row["providers"]) == {"sg": "sent"}
    assert dict(row["message_ids"]) == {"sg": "m-1"}
    assert set(row["evidence"]) == {"c.0"}


async def test_a_failed_call_changes_only_the_providers_map(stores: Stores) -> None:
    batch = await _stored(stores, "a@example.org")
    log_id = batch.recipients[0].log_id
    await stores.recipients.call_failed(
        batch.batch_id, 0, [log_id], provider="sg", result="failed: 500", when=_at(batch, 1)
    )
    row = await stores.recipients.one(batch.batch_id, 0, log_id)
    assert row is not None
    assert (row["event"], visible(row).state) == ("queued", "queued")
    assert dict(row["providers"]) == {"sg": "failed: 500"}
    assert row["evidence"] is None


@pytest.mark.parametrize("give_up_first", [True, False])
async def test_provider_evidence_outranks_a_give_up_in_either_order(
    stores: Stores, give_up_first: bool
) -> None:
    batch = await _stored(stores, "a@example.org")
    log_id = batch.recipients[0].log_id

    async def give_up() -> None:
        await stores.recipients.give_up(
            batch.batch_id, batch.user_id, 0, [log_id], reason="all failed", when=_at(batch, 9)
        )

    async def delivered() -> None:
        await stores.recipients.reported(
            batch.batch_id,
            batch.user_id,
            0,
            log_id,
            provider="mg",
            provider_result="delivered",
            message_id=None,
            stage_rank=3,
            rank=3,
            when=_at(batch, 2),
            event="delivered",
            state="success",
            reason=None,
            evidence="c.1",
        )

    first, second = (give_up, delivered) if give_up_first else (delivered, give_up)
    await first()
    await second()
    row = await stores.recipients.one(batch.batch_id, 0, log_id)
    assert row is not None and visible(row).state == "success"
    day = batch_day(batch.batch_id)
    assert await stores.stats.keys(batch.user_id, day, "success") == {str(log_id)}
    assert await stores.stats.keys(batch.user_id, day, "failed") == set()


async def test_a_give_up_alone_fails_the_recipient_and_counts_it(stores: Stores) -> None:
    batch = await _stored(stores, "a@example.org")
    log_id = batch.recipients[0].log_id
    await stores.recipients.give_up(
        batch.batch_id, batch.user_id, 0, [log_id], reason="all failed", when=_at(batch, 9)
    )
    row = await stores.recipients.one(batch.batch_id, 0, log_id)
    assert row is not None
    assert (visible(row).state, visible(row).reason) == ("failed", "all failed")
    day = batch_day(batch.batch_id)
    assert await stores.stats.keys(batch.user_id, day, "failed") == {str(log_id)}


async def test_at_the_same_moment_the_higher_rank_decides(stores: Stores) -> None:
    batch = await _stored(stores, "a@example.org")
    log_id = batch.recipients[0].log_id
    common = {
        "provider": "sg",
        "message_id": None,
        "when": _at(batch, 3),
        "reason": "mailbox full",
        "evidence": "c.0",
    }
    await stores.recipients.reported(
        batch.batch_id, batch.user_id, 0, log_id, provider_result="bounced", stage_rank=4,
        rank=4, event="bounced", state="failed", **common,
    )  # fmt: skip
    await stores.recipients.reported(
        batch.batch_id, batch.user_id, 0, log_id, provider_result="delivered", stage_rank=3,
        rank=3, event="delivered", state="success", **common,
    )  # fmt: skip
    row = await stores.recipients.one(batch.batch_id, 0, log_id)
    assert row is not None
    assert (row["event"], visible(row).state, row["reason_detail"]) == (
        "bounced",
        "failed",
        "mailbox full",
    )
    assert dict(row["providers"]) == {"sg": "bounced"}
    day = batch_day(batch.batch_id)
    assert await stores.stats.keys(batch.user_id, day, "success") == set()
    assert await stores.stats.keys(batch.user_id, day, "failed") == {str(log_id)}


async def test_supersede_marks_the_attempt_and_keeps_the_recipient_queued(stores: Stores) -> None:
    batch = await _stored(stores, "a@example.org")
    log_id = batch.recipients[0].log_id
    await stores.recipients.supersede(
        batch.batch_id, 0, log_id, tag="c.0", provider="sg", result="dropped", when=_at(batch, 4)
    )
    row = await stores.recipients.one(batch.batch_id, 0, log_id)
    assert row is not None
    assert set(row["superseded"]) == {"c.0"}
    assert dict(row["providers"]) == {"sg": "dropped"}
    assert visible(row).state == "queued"


async def test_an_attempt_is_created_once(stores: Stores) -> None:
    batch_id, owner = uuid.uuid1(), uuid.uuid4()
    first = await stores.attempts.create(
        batch_id, "c0", 0, chunk=0, provider="sg", state="claimed", owner=owner
    )
    second = await stores.attempts.create(
        batch_id, "c0", 0, chunk=0, provider="mg", state="claimed", owner=uuid.uuid4()
    )
    assert (first, second) == (True, False)
    (attempt,) = await stores.attempts.line(batch_id, "c0")
    assert (attempt.provider, attempt.state, attempt.owner, attempt.checks) == (
        "sg",
        "claimed",
        owner,
        0,
    )
    assert attempt.created_at.tzinfo is not None


async def test_a_transition_applies_only_when_its_condition_holds(stores: Stores) -> None:
    batch_id, owner = uuid.uuid1(), uuid.uuid4()
    await stores.attempts.create(
        batch_id, "c0", 0, chunk=0, provider="sg", state="claimed", owner=owner
    )
    now = datetime.now(UTC)
    wrong = await stores.attempts.transition(
        batch_id, "c0", 0, expect={"state": "claimed", "owner": uuid.uuid4()},
        values={"state": "calling"},
    )  # fmt: skip
    right = await stores.attempts.transition(
        batch_id, "c0", 0, expect={"state": "claimed", "owner": owner},
        values={"state": "calling", "calling_at": now, "checks": 2},
    )  # fmt: skip
    missing = await stores.attempts.transition(
        batch_id, "c0", 1, expect={"state": "claimed"}, values={"state": "calling"}
    )
    assert (wrong, right, missing) == (False, True, False)
    (attempt,) = await stores.attempts.line(batch_id, "c0", serial=True)
    assert (attempt.state, attempt.checks) == ("calling", 2)
    assert attempt.calling_at is not None
    assert abs((attempt.calling_at - now).total_seconds()) < 0.002


async def test_a_new_attempt_has_had_no_checks(stores: Stores) -> None:
    batch_id = uuid.uuid1()
    await stores.attempts.create(batch_id, "c0", 0, chunk=0, provider="sg", state="claimed")
    assert await stores.attempts.transition(
        batch_id, "c0", 0, expect={"checks": 0}, values={"checks": 1}
    )
    (attempt,) = await stores.attempts.line(batch_id, "c0")
    assert attempt.checks == 1


async def test_lines_are_read_in_attempt_order_and_grouped(stores: Stores) -> None:
    batch_id = uuid.uuid1()
    for line, n, provider in (("c0", 1, "mg"), ("c0", 0, "sg"), ("c1", 0, "sg")):
        await stores.attempts.create(
            batch_id, line, n, chunk=int(line[1:]), provider=provider, state="planned"
        )
    assert [a.attempt for a in await stores.attempts.line(batch_id, "c0")] == [0, 1]
    lines = await stores.attempts.lines(batch_id)
    assert {k: [a.provider for a in v] for k, v in lines.items()} == {
        "c0": ["sg", "mg"],
        "c1": ["sg"],
    }
    assert await stores.attempts.line(uuid.uuid1(), "c0") == []


async def test_suppressions_are_found_case_insensitively(stores: Stores) -> None:
    user = uuid.uuid4()
    await stores.suppressions.add(user, "Ann@Example.org", reason="bounce", source="sg")
    found = await stores.suppressions.suppressed(user, ["ANN@example.org", "bob@example.org"])
    assert found == {"ann@example.org": "bounce"}
    assert await stores.suppressions.suppressed(uuid.uuid4(), ["ann@example.org"]) == {}


async def test_a_replayed_event_is_one_timeline_entry(stores: Stores) -> None:
    batch = _batch("a@example.org")
    ev = _event(batch)
    await stores.timeline.record(batch.batch_id, batch.recipients[0].log_id, ev, counted=True)
    await stores.timeline.record(batch.batch_id, batch.recipients[0].log_id, ev, counted=False)
    assert await stores.events(batch.batch_id, batch.recipients[0].log_id) == [(ev.event_id, False)]


async def test_the_same_event_at_another_time_is_another_timeline_entry(stores: Stores) -> None:
    """An event without its own timestamp takes the time it was received: a provider's
    retry of it is then a second entry."""
    batch = _batch("a@example.org")
    log_id = batch.recipients[0].log_id
    first = _event(batch)
    again = replace(first, occurred_at=first.occurred_at + timedelta(seconds=30))
    await stores.timeline.record(batch.batch_id, log_id, first, counted=True)
    await stores.timeline.record(batch.batch_id, log_id, again, counted=False)
    assert await stores.events(batch.batch_id, log_id) == [
        (first.event_id, True),
        (first.event_id, False),
    ]


async def test_an_orphan_event_is_kept(stores: Stores) -> None:
    ev = _event(_batch("a@example.org"), provider="mg", event_id=uuid.uuid4().hex)
    await stores.timeline.orphan(ev)
    day = ev.occurred_at.date()
    assert await stores.orphaned("mg", day, ev.event_id)
    assert not await stores.orphaned("mg", day, uuid.uuid4().hex)


async def test_a_webhook_token_goes_with_one_body(stores: Stores) -> None:
    token = uuid.uuid4().hex
    assert await stores.tokens.accept_once(token, b"body-1")
    assert await stores.tokens.accept_once(token, b"body-1")  # a replay
    assert not await stores.tokens.accept_once(token, b"body-2")  # a forgery


async def test_of_two_writes_at_the_same_moment_the_larger_value_wins(stores: Stores) -> None:
    """Cassandra breaks a write-timestamp tie by the larger serialized value (whatever the
    order the writes arrived in); stamps are whole seconds, so ties happen."""
    batch = await _stored(stores, "a@example.org")
    log_id = batch.recipients[0].log_id
    for result in ("failed: X's", "failed: A"):
        await stores.recipients.call_failed(
            batch.batch_id, 0, [log_id], provider="sg", result=result, when=_at(batch, 1)
        )
    for seconds in (2.3, 2.0):  # the same second, so the same stamp; last_update differs
        await stores.recipients.accepted(
            batch.batch_id, 0, [log_id], provider="mg", tag="c.1", when=_at(batch, seconds),
            message_id=None,
        )  # fmt: skip
    row = await stores.recipients.one(batch.batch_id, 0, log_id)
    assert row is not None
    assert dict(row["providers"])["sg"] == "failed: X's"
    assert row["last_update"].replace(tzinfo=None) == _at(batch, 2.3).replace(
        tzinfo=None, microsecond=_at(batch, 2.3).microsecond // 1000 * 1000
    )
