"""The campaign store's contract, asserted identically of the in-memory twin
(``tests/fakes/audience.py``) and of the real store on Cassandra: a campaign moves only
from the state it was read in (a stale move fails and changes nothing), campaigns moved into
an active state are on the runners' list until retired, the cursor advances only from the
slice count it was read with (of two advancers, one wins), a slice is staged once (of two
stagers, both get the first's) and closed without losing its batch, and slices read back in
order."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.audience.campaigns import Campaign, CampaignStore, Slice, Staged
from shared.infra.db import Database
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.audience import FakeCampaigns
from tests.fakes.cassandra import ms


@pytest.fixture(params=IMPLEMENTATIONS)
def store(request: pytest.FixtureRequest) -> Any:
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    if request.param == "fake":
        return FakeCampaigns(namespace)
    db: Database = request.getfixturevalue("db")
    return CampaignStore(db, namespace)


async def made(store: Any, user: uuid.UUID, send_at: datetime | None = None) -> Campaign:
    campaign: Campaign = await store.create(
        user,
        "autumn",
        uuid.uuid1(),
        uuid.uuid1(),
        {"email": "news@example.org", "name": "Névé"},
        {"season": "autumn", "tags": ["a", "é"], "depth": {"x": [1, 2.5]}},
        50,
        send_at,
    )
    return campaign


async def test_a_new_campaign_is_a_draft_read_back_as_made(store: Any) -> None:
    """What ``create`` returned, at Cassandra's precision."""
    send_at = datetime.now(UTC) + timedelta(hours=1)
    campaign = await made(store, uuid.uuid4(), send_at)

    found = await store.get(campaign.user_id, campaign.campaign_id)

    assert found is not None
    assert found.state == await store.state(campaign.user_id, campaign.campaign_id) == "draft"
    assert (found.send_at, found.created_at, found.updated_at) == (
        ms(send_at),
        ms(campaign.created_at),
        ms(campaign.created_at),
    )
    assert found.sender == campaign.sender and found.data == campaign.data
    assert (found.cursor_bucket, found.cursor_after, found.slices) == (0, None, 0)
    assert (found.released, found.skipped, found.reason, found.rate) == (0, 0, None, 50)


async def test_an_unknown_campaign_is_nothing_and_cannot_move(store: Any) -> None:
    ghost = await made(store, uuid.uuid4())
    other_user = uuid.uuid4()

    assert await store.get(other_user, ghost.campaign_id) is None
    assert await store.state(other_user, ghost.campaign_id) is None
    assert not await store.move(replace(ghost, user_id=other_user), "cancelled")
    assert await store.get(other_user, ghost.campaign_id) is None


async def test_a_users_campaigns_are_theirs_only_newest_first(store: Any) -> None:
    ann, bob = uuid.uuid4(), uuid.uuid4()
    first = await made(store, ann)
    second = await made(store, ann)

    listed = await store.campaigns(ann)

    assert [c.campaign_id for c in listed] == [second.campaign_id, first.campaign_id]
    assert await store.campaigns(bob) == []


async def test_a_move_sets_the_state_reason_and_send_at(store: Any) -> None:
    campaign = await made(store, uuid.uuid4())
    send_at = datetime.now(UTC) + timedelta(days=1)

    moved = await store.move(campaign, "scheduled", reason="by hand", send_at=send_at)
    found = await store.get(campaign.user_id, campaign.campaign_id)

    assert moved
    assert found is not None
    assert (found.state, found.reason, found.send_at) == ("scheduled", "by hand", ms(send_at))
    assert found.updated_at is not None and found.updated_at >= found.created_at


async def test_a_stale_move_fails_and_changes_nothing(store: Any) -> None:
    """A pause racing the runner: whoever moves second read a state that is gone."""
    campaign = await made(store, uuid.uuid4())
    assert await store.move(campaign, "scheduled", reason="user")
    scheduled = await store.get(campaign.user_id, campaign.campaign_id)

    stale = await store.move(campaign, "cancelled", reason="too late")  # read as a draft
    after = await store.get(campaign.user_id, campaign.campaign_id)

    assert not stale
    assert after == scheduled


async def test_of_two_movers_from_one_read_one_wins(store: Any) -> None:
    campaign = await made(store, uuid.uuid4())
    assert await store.move(campaign, "scheduled")
    running = await store.get(campaign.user_id, campaign.campaign_id)

    results = await asyncio.gather(
        store.move(running, "paused", reason="pause"), store.move(running, "cancelled")
    )
    after = await store.state(campaign.user_id, campaign.campaign_id)

    assert sorted(results) == [False, True]
    assert after == ("paused" if results[0] else "cancelled")


async def test_campaigns_moved_into_an_active_state_are_run_until_retired(store: Any) -> None:
    user = uuid.uuid4()
    running, drafted, cancelled = [await made(store, user) for _ in range(3)]
    assert await store.move(running, "scheduled")
    assert await store.move(cancelled, "cancelled")

    listed = await store.runs()
    await store.retire(running.campaign_id)

    assert listed == [(user, running.campaign_id)]
    assert drafted.campaign_id not in {c for _, c in listed}
    assert await store.runs() == []


async def test_an_advance_counts_however_far_ahead_the_creators_clock_ran(
    store: Any,
) -> None:
    """The API that created the campaign stamped its writes with a clock a minute ahead of
    Cassandra's (or a few microseconds, within one millisecond): the first advance, stamped
    by Cassandra's own clock, still moves the cursor and counts its slice."""
    if isinstance(store, FakeCampaigns):
        campaign = await made(store, uuid.uuid4())
    else:
        cluster = store.db.cluster
        honest = cluster.timestamp_generator
        cluster.timestamp_generator = lambda: honest() + 60_000_000
        try:
            campaign = await made(store, uuid.uuid4())
        finally:
            cluster.timestamp_generator = honest

    assert await store.advance(campaign, 7, "m@example.org", 100, 3)

    found = await store.get(campaign.user_id, campaign.campaign_id)
    assert found is not None
    assert (found.cursor_bucket, found.slices, found.released, found.skipped) == (7, 1, 100, 3)


async def test_an_advance_moves_the_cursor_and_counts_one_slice_on(store: Any) -> None:
    campaign = await made(store, uuid.uuid4())

    advanced = await store.advance(campaign, 7, "m@example.org", 100, 3)
    read = await store.get(campaign.user_id, campaign.campaign_id)
    assert read is not None
    again = await store.advance(read, 9, None, 50, 1)
    found = await store.get(campaign.user_id, campaign.campaign_id)

    assert advanced and again
    assert found is not None
    assert (found.cursor_bucket, found.cursor_after) == (9, None)
    assert (found.slices, found.released, found.skipped) == (2, 150, 4)


async def test_of_two_advancers_from_one_read_one_wins(store: Any) -> None:
    campaign = await made(store, uuid.uuid4())

    results = await asyncio.gather(
        store.advance(campaign, 1, "a@example.org", 10, 0),
        store.advance(campaign, 2, "b@example.org", 20, 0),
    )
    found = await store.get(campaign.user_id, campaign.campaign_id)

    assert sorted(results) == [False, True]
    assert found is not None
    winner = (1, "a@example.org", 10) if results[0] else (2, "b@example.org", 20)
    assert (found.cursor_bucket, found.cursor_after, found.released) == winner
    assert found.slices == 1


async def test_a_stale_advance_changes_nothing(store: Any) -> None:
    campaign = await made(store, uuid.uuid4())
    assert await store.advance(campaign, 1, "a@example.org", 10, 0)
    current = await store.get(campaign.user_id, campaign.campaign_id)

    stale = await store.advance(campaign, 5, "z@example.org", 99, 9)

    assert not stale
    assert await store.get(campaign.user_id, campaign.campaign_id) == current


async def test_slices_are_recorded_in_order(store: Any) -> None:
    """Read back by number, however they were written; a slice written again is replaced."""
    campaign_id = uuid.uuid1()
    parts = [Slice(n, uuid.uuid1(), 100 + n) for n in (2, 0, 1)]
    for part in parts:
        await store.record(campaign_id, part)
    again = Slice(1, parts[2].batch_id, 5)
    await store.record(campaign_id, again)

    assert await store.slices(campaign_id) == [parts[1], again, parts[0]]
    assert await store.slices(uuid.uuid1()) == []


def _staged(number: int, *, first: str = "Ann") -> Staged:
    body = {
        "from": {"email": "news@example.org", "name": "Névé"},
        "to": [{"email": "a@example.org", "substitutions": {"first_name": first}}],
        "template_id": str(uuid.uuid1()),
        "data": {"depth": {"x": [1, 2.5]}, "flag": True, "none": None},
        "unsubscribe": True,
    }
    return Staged(number, uuid.uuid1(), body, 3, 17, "m@example.org")


async def test_a_staged_slice_reads_back_as_staged(store: Any) -> None:
    """Its batch id, its request as JSON round-trips it, its count and the cursor after it."""
    campaign_id = uuid.uuid1()
    part = _staged(0)

    answered = await store.stage(campaign_id, part)
    last = await store.stage(campaign_id, replace(_staged(1), end_after=None, end_bucket=64))

    assert answered == part
    assert await store.staged(campaign_id, 0) == part
    assert await store.staged(campaign_id, 1) == last
    assert await store.staged(campaign_id, 2) is None
    assert await store.staged(uuid.uuid1(), 0) is None


async def test_a_slice_staged_again_keeps_the_first_and_answers_it(store: Any) -> None:
    """A runner retrying after a lost answer, or one that read the list later: the first."""
    campaign_id = uuid.uuid1()
    first = await store.stage(campaign_id, _staged(4))

    again = await store.stage(campaign_id, _staged(4, first="Changed"))

    assert again == first
    assert await store.staged(campaign_id, 4) == first


async def test_of_two_stagers_of_one_slice_both_get_the_same(store: Any) -> None:
    campaign_id = uuid.uuid1()
    ours, theirs = _staged(0), _staged(0, first="Other")

    results = await asyncio.gather(store.stage(campaign_id, ours), store.stage(campaign_id, theirs))

    assert results[0] == results[1] in (ours, theirs)
    assert await store.staged(campaign_id, 0) == results[0]


async def test_closing_a_slice_drops_its_request_and_keeps_its_batch(store: Any) -> None:
    """Closed for good: staged again (by a runner that read the campaign before) it stays
    closed; closing a slice never staged stages nothing."""
    campaign_id = uuid.uuid1()
    part = await store.stage(campaign_id, _staged(0))

    await store.close(campaign_id, 0)
    await store.close(campaign_id, 1)
    restaged = await store.stage(campaign_id, _staged(0, first="Late"))

    closed = replace(part, body=None)
    assert await store.staged(campaign_id, 0) == closed == restaged
    assert closed.closed and not part.closed
    assert await store.staged(campaign_id, 1) is None


async def test_a_campaign_is_made_with_the_id_it_is_given(store: Any) -> None:
    """The id its place under the cap was claimed for."""
    user, campaign_id = uuid.uuid4(), uuid.uuid1()

    made = await store.create(
        user, "c", uuid.uuid1(), uuid.uuid1(), {"email": "a@example.org"}, {}, 5, None, campaign_id
    )

    assert made.campaign_id == campaign_id
    assert await store.get(user, campaign_id) is not None


@pytest.mark.parametrize("state", ["draft", "sent", "cancelled"])
async def test_a_campaign_that_does_not_run_is_deleted_with_its_slices(
    store: Any, state: str
) -> None:
    """Its staged and recorded slices, and its place on the runners' list, go with it."""
    campaign = await made(store, uuid.uuid4())
    if state != "draft":
        assert await store.move(campaign, "scheduled")
        scheduled = await store.get(campaign.user_id, campaign.campaign_id)
        assert await store.move(scheduled, state)
    await store.stage(campaign.campaign_id, _staged(0))
    await store.record(campaign.campaign_id, Slice(0, uuid.uuid1(), 3))
    found = await store.get(campaign.user_id, campaign.campaign_id)

    deleted = await store.delete(found)

    assert deleted
    assert await store.get(campaign.user_id, campaign.campaign_id) is None
    assert await store.staged(campaign.campaign_id, 0) is None
    assert await store.slices(campaign.campaign_id) == []
    assert campaign.campaign_id not in {c for _, c in await store.runs()}
    assert not await store.delete(found)


@pytest.mark.parametrize("state", ["scheduled", "sending", "paused"])
async def test_a_campaign_that_runs_is_not_deleted(store: Any, state: str) -> None:
    """Whatever state its caller read it in: the condition is the stored state."""
    campaign = await made(store, uuid.uuid4())
    assert await store.move(campaign, "scheduled")
    if state != "scheduled":
        scheduled = await store.get(campaign.user_id, campaign.campaign_id)
        assert await store.move(scheduled, state)

    deleted = await store.delete(campaign)  # read as a draft, before it was scheduled

    assert not deleted
    found = await store.get(campaign.user_id, campaign.campaign_id)
    assert found is not None and found.state == state
