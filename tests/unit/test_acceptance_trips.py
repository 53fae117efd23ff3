"""The Cassandra round trips of accepting a batch, counted on the twins' op log
(``FakeCassandra.calls``), and what the one write of a small batch holds: its content, header,
outbox row, listing and ``queued`` count land together or not at all (issue 34)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from shared.core.errors import DependencyUnavailable
from shared.delivery.batchstore import INLINE_BYTES, month_of
from shared.delivery.outbox import SHARDS, Outbox
from shared.delivery.stats import batch_day
from tests.unit.sending_desk import TIMEOUT, Desk, body_of, new_desk

#: Round trips of other owners, each measured on its own: the quota's leases
#: (``test_quota_leases``) and the suppression lookup, which the API's per-process cache
#: takes off the request path (``test_suppression_cache``).
ELSEWHERE = ("quota.", "suppressions.")
HUNDRED = [f"r{i}@example.com" for i in range(100)]


@pytest.fixture
async def desk() -> AsyncIterator[Desk]:
    made = await new_desk(lease=30.0)
    made.quota.daily_limit = 1_000_000
    yield made
    await made.sending.background.drain()


async def _trips_per_batch(desk: Desk, key: str | None, batches: int = 10) -> dict[str, float]:
    """Round trips per accepted 100-recipient batch, the writes it left for later included."""
    await desk.accept(body_of(*HUNDRED, subject="warm-up"), None if key is None else "warm")
    await desk.sending.background.drain()
    desk.db.calls.clear()
    for n in range(batches):
        key_n = None if key is None else f"{key}-{n}"
        await desk.accept(body_of(*HUNDRED, subject=f"batch {n}"), key_n)
        await desk.sending.background.drain()  # alone: its outbox mark written by itself
    mine = Counter(op for op in desk.db.calls if not op.startswith(ELSEWHERE))
    return {op: count / batches for op, count in sorted(mine.items())}


async def test_a_keyless_batch_costs_its_write_its_commit_and_its_outbox_mark(
    desk: Desk,
) -> None:
    """A keyless 100-recipient batch makes three round trips: one logged batch (content,
    header, outbox row, listing, queued count), the commit, the outbox mark (7.16 -> 4.16 in
    all on this log with the quota lease and the uncached suppression read; 6 -> 3 of its
    own, where the twin counted the index write as two)."""
    trips = await _trips_per_batch(desk, None)

    assert trips == {"batches.commit": 1.0, "batches.write": 1.0, "outbox.done": 1.0}
    assert len(desk.published()) == 11


async def test_a_keyed_batch_costs_its_write_and_its_outbox_mark(desk: Desk) -> None:
    """A 100-recipient batch sent with an Idempotency-Key makes two round trips: its one
    logged batch and the outbox mark (6.16 -> 3.16 in all on this log)."""
    trips = await _trips_per_batch(desk, "key")

    assert trips == {"batches.write": 1.0, "outbox.done": 1.0}


async def test_batches_accepted_together_share_their_outbox_marks(desk: Desk) -> None:
    """Sixteen batches accepted at once (as sixteen clients send them) have their outbox rows
    marked published in one write per outbox partition, not one each."""
    desk.acceptance.marks.window = 0.5  # however slow the machine, all sixteen in one window

    answers = await asyncio.gather(
        *(desk.accept(body_of(*HUNDRED, subject=f"client {n}"), f"c{n}") for n in range(16))
    )
    await desk.sending.background.drain()

    partitions = {Outbox.bucket(uuid.UUID(a["batch_id"])) for a in answers}
    assert desk.db.calls.count("outbox.done") == len(partitions) <= 2 * SHARDS
    assert desk.outbox.pending() == set()


async def test_a_lost_mark_leaves_its_row_to_the_relay(desk: Desk) -> None:
    """A write of gathered marks that fails leaves the 202 as it was and the row unmarked;
    the relay publishes the batch again (a duplicate the splitter absorbs) and marks it."""
    desk.db.fail("outbox.done", TIMEOUT)
    answer = await desk.accept(body_of(*HUNDRED), "lost-mark")
    await desk.sending.background.drain()
    first = desk.published()

    await desk.relay(after=600)

    assert (first, desk.published()) == ([answer["batch_id"]], [answer["batch_id"]])
    assert desk.outbox.pending() == set()


async def test_a_large_batchs_content_goes_ahead_of_its_header(desk: Desk) -> None:
    """Content past INLINE_BYTES is written on its partition first (kept out of the logged
    batch Cassandra holds to its batch size threshold), then the header's logged batch."""
    big = [f"someone.with.a.long.address.{i}@example.com" for i in range(1000)]
    assert sum(map(len, big)) > INLINE_BYTES

    await desk.accept(body_of(*big), "big")

    assert desk.db.calls.count("batches.content") >= 1
    assert desk.db.calls.index("batches.content") < desk.db.calls.index("batches.write")


@pytest.mark.parametrize("applied", [False, True])
async def test_a_small_batch_is_listed_counted_and_relayed_with_its_header_or_not_at_all(
    desk: Desk, applied: bool
) -> None:
    """A keyed store that times out leaves the batch whole (header, recipients, listing,
    queued count, outbox row) if it landed, and nothing of it if it did not."""
    desk.db.fail("batches.write", TIMEOUT, applied=applied)

    with pytest.raises(DependencyUnavailable):
        await desk.accept(body_of(*HUNDRED), "timed-out")

    found = {
        "header": any(h.get("created_at") is not None for h in desk.db.headers.values()),
        "recipients": any(desk.db.batches.values()),
        "listed": any(desk.db.by_user.values()),
        "counted": any(p.rows for p in desk.db.stat_rows.values()),
        "relayed": bool(desk.outbox.pending()),
    }
    assert set(found.values()) == {applied}


async def test_a_keyless_batch_cancelled_after_its_write_landed_counts_nothing(
    desk: Desk,
) -> None:
    """A keyless write whose answer was lost lands listed and counted while pending; the
    request cancels it and settles it: listed as cancelled, its queued count gone."""
    desk.db.fail("batches.write", TIMEOUT, applied=True)

    with pytest.raises(DependencyUnavailable):
        await desk.accept(body_of(*HUNDRED), None)

    (batch_id,) = desk.db.headers
    assert await desk.status(str(batch_id)) == "cancelled"
    assert batch_id in desk.db.by_user[(desk.user, month_of(batch_id))]
    assert await desk.batches.stats.day(desk.user, batch_day(batch_id)) == {}
    await desk.relay(after=600)
    assert desk.published() == []


async def test_the_days_activity_is_written_once_per_process_with_a_batch(desk: Desk) -> None:
    """The user's day is recorded in the first batch's write and remembered: the next
    batch's write carries no activity rows, and the day is listed for the stats."""
    first = await desk.accept(body_of(*HUNDRED), "first")
    day = batch_day(uuid.UUID(first["batch_id"]))

    assert day in await desk.batches.stats.user_days(desk.user)
    assert (
        await desk.batches.stats.activity_statements(desk.user, uuid.UUID(first["batch_id"])) == []
    )
