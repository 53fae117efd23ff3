"""Waiting on an event for at most some seconds (``shared.infra.waits.set_within``): what it
answers, and that a cancellation ends it whenever the event is set, which ``asyncio.wait_for``
on Python 3.11 did not."""

from __future__ import annotations

import asyncio

from shared.infra.settle import InFlight
from shared.infra.waits import set_within
from shared.providers.transport import Calls


async def test_a_wait_cancelled_as_its_event_is_set_ends_cancelled() -> None:
    """Cancelled in the turn its event is set, the waiting task ends cancelled instead of
    answering that the event was set."""
    event = asyncio.Event()
    waiting = asyncio.create_task(set_within(event, 60))
    await asyncio.sleep(0)

    event.set()
    waiting.cancel()
    done, _ = await asyncio.wait({waiting}, timeout=1.0)

    assert (bool(done), waiting.cancelled()) == (True, True)


async def test_it_answers_whether_the_event_was_set_in_time() -> None:
    """True at once for a set event, True when set while waiting, False after the time."""
    event = asyncio.Event()
    timed_out = await set_within(event, 0.01)
    later = asyncio.create_task(set_within(event, 60))
    await asyncio.sleep(0)
    event.set()

    assert (timed_out, await later, await set_within(event, 0)) == (False, True, True)


async def test_draining_deliveries_and_provider_calls_ends_when_cancelled_as_they_end() -> None:
    """A shutdown's drain (``InFlight.wait_idle``, ``Calls.drained``) cancelled as the last
    delivery or call ends is cancelled, not finished."""
    inflight, calls = InFlight(), Calls()
    inflight.enter()
    calls.__enter__()
    draining = [
        asyncio.create_task(inflight.wait_idle(60)),
        asyncio.create_task(calls.drained(60)),
    ]
    await asyncio.sleep(0)

    inflight.leave()
    calls.__exit__(None, None, None)
    for task in draining:
        task.cancel()
    await asyncio.wait(draining, timeout=1.0)

    assert [task.cancelled() for task in draining] == [True, True]
