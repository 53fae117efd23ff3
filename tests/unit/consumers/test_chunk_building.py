"""Building the chunk a provider is sent (``services.consumers.calls``): a large one is built
off the event loop, a small one on it (a thread costs more than it saves there)."""

from __future__ import annotations

import dataclasses

import pytest

from services.consumers.calls import HEAVY_CHUNK, HEAVY_WEIGHING, heavy
from shared.models import BatchJob, Recipient
from shared.recipients import log_id_for
from shared.topology import batch_key
from tests.fakes.world import World, new_batch
from tests.unit.loop_turns import turns_during

ON_LOOP_TURNS = 18


def test_a_chunk_is_heavy_by_its_recipients_and_their_substitutions() -> None:
    """Each recipient counts, and each of its substitutions counts as one more."""
    assert not heavy([{"substitutions": {}}] * HEAVY_CHUNK)
    assert heavy([{"substitutions": None}] * (HEAVY_CHUNK + 1))
    assert heavy([{"substitutions": {f"k{i}": "v" for i in range(HEAVY_CHUNK)}}])
    assert not heavy([{"substitutions": {"k": "v"}}] * (HEAVY_CHUNK // 2))


def test_weighing_a_chunk_is_heavy_only_past_its_own_larger_bound() -> None:
    """A chunk too heavy to build on the loop may still be weighed there: weighing costs
    less than a trip to the CPU lane up to :data:`HEAVY_WEIGHING`."""
    typical = [{"substitutions": {"a": "1", "b": "2"}}] * 100  # make bench's chunk
    assert heavy(typical)
    assert not heavy(typical, HEAVY_WEIGHING)
    assert heavy([{"substitutions": None}] * (HEAVY_WEIGHING + 1), HEAVY_WEIGHING)


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
