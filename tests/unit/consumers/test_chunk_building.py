"""Building the chunk a provider is sent (``services.consumers.calls``): a large one is built
off the event loop, a small one on it (a thread costs more than it saves there)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from services.consumers.calls import (
    BUILD_US,
    LANE_TRIP_US,
    LANE_WORTH,
    WEIGH_US,
    count_items,
    heavy,
    lane_bound,
    worth_the_lane,
)
from shared.core.models import BatchJob, Recipient
from shared.delivery.recipients import log_id_for
from shared.infra.topology import batch_key
from tests.fakes.world import World, new_batch
from tests.unit.loop_turns import turns_during

ON_LOOP_TURNS = 18


def test_a_chunk_is_heavy_by_its_recipients_and_their_substitutions() -> None:
    """Each recipient counts, and each of its substitutions counts as one more."""
    assert not heavy([{"substitutions": {}}] * 200)
    assert heavy([{"substitutions": None}] * 201)
    assert heavy([{"substitutions": {f"k{i}": "v" for i in range(200)}}])
    assert not heavy([{"substitutions": {"k": "v"}}] * 100)


def test_weighing_a_chunk_is_heavy_only_past_its_own_larger_bound() -> None:
    """A chunk too heavy to build on the loop may still be weighed there: weighing costs
    less than a trip to the CPU lane up to 2,000 items."""
    typical = [{"substitutions": {"a": "1", "b": "2"}}] * 100  # make bench's chunk
    assert heavy(typical)
    assert not heavy(typical, WEIGH_US)
    assert not heavy([{"substitutions": None}] * 2000, WEIGH_US)
    assert heavy([{"substitutions": None}] * 2001, WEIGH_US)


def test_the_lane_bounds_are_the_ones_chosen_before_the_cost_model() -> None:
    """Building goes off the loop above 200 items and weighing above 2,000, as before the two
    bounds became one cost model."""
    assert (lane_bound(BUILD_US), lane_bound(WEIGH_US)) == (200, 2000)


def test_work_goes_to_the_lane_once_it_costs_more_than_its_worth_in_trips() -> None:
    """Work of N items at c µs each goes to the lane exactly when N x c exceeds
    LANE_WORTH trips of LANE_TRIP_US: not at the bound, at one item past it."""
    budget = LANE_WORTH * LANE_TRIP_US
    for per_item in (BUILD_US, WEIGH_US, 2.8, 0.45, budget):
        bound = lane_bound(per_item)
        assert bound * per_item == pytest.approx(budget, rel=0.01)
        assert not worth_the_lane(bound, per_item)
        assert worth_the_lane(bound + 1, per_item)
    assert not worth_the_lane(0, BUILD_US)


def test_a_cheaper_operation_stays_on_the_loop_for_more_items() -> None:
    """The same count of items can be worth the lane for building and not for weighing."""
    assert worth_the_lane(1000, BUILD_US)
    assert not worth_the_lane(1000, WEIGH_US)


def test_counting_items_may_stop_past_a_bound() -> None:
    """A chunk's items are its recipients plus their substitutions; a count told where to
    stop may stop as soon as it is past it."""
    rows: list[dict[str, Any]] = [
        {"substitutions": {"a": "1", "b": "2"}},
        {"substitutions": None},
        {},
    ]
    assert count_items(rows) == 5
    assert count_items(rows, most=2) == 3  # past 2 after the first recipient
    assert count_items(rows, most=5) == 5


@pytest.mark.offloop
async def test_a_large_chunk_is_built_off_the_event_loop() -> None:
    """The event loop goes on with other work while 1,000 recipients with 100 substitutions
    each are made into the chunk sent, and the chunk holds them all."""
    w = World()
    emails = [f"r{i}@example.org" for i in range(1000)]
    batch = new_batch(*emails, chunk_size=1000)
    people = [
        Recipient(
            log_id=log_id_for(batch.batch_id, e),
            email=e,
            name=None,
            substitutions={f"-k{j}-": "v" * 20 for j in range(100)},
        )
        for e in emails
    ]
    batch = dataclasses.replace(batch, recipients=people)
    await w.batches.write(batch)
    await w.batches.index(batch)
    await w.broker.publish(batch_key(batch.batch_id), BatchJob(batch_id=batch.batch_id).encode())

    _, turns = await turns_during(w.settle())

    (sent,) = w.providers["sg"].sent
    assert [r.email for r in sent.recipients] == emails
    assert sent.recipients[999].substitutions == people[999].substitutions
    # Built on the loop, the chunk left only the turns of settle's own awaits (18); in a
    # thread it leaves many more (about 2,000 on an idle machine, 37 on a loaded one).
    assert turns > ON_LOOP_TURNS
