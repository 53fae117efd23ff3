"""Running the simulated deployment until nothing is left to do, and its periodic work.

Production runs its periodic work in loops (the outbox relay, the scheduler, the campaign
runner, the canary judge, the hooks process's sweep): here each pass runs as its loop would
run it, in its process, when it is due and has something to look at, so a quiet world waits
at no cost however long its windows are. The world is quiet when no message is ready,
unacked or delayed, no request is in flight, no provider holds a webhook to post, no process
is restarting and no periodic work has anything to do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from services.api.campaign_runner import PASS_EVERY as RUNNER_EVERY
from services.consumers.canary_judge import JUDGE_EVERY
from services.consumers.scheduler import PASS_EVERY as SCHEDULER_EVERY
from services.hooks.worker import Worker
from shared.core.errors import DependencyUnavailable
from shared.delivery.batchstore import shown_status
from shared.outbound.user_hooks import wake
from simulation.processes import Incarnation

if TYPE_CHECKING:
    from simulation.world import World

log = logging.getLogger(__name__)


def busy(world: World) -> bool:
    """Whether anything is left to do, now or later."""
    return bool(
        world.broker.busy()
        or world.requests_in_flight
        or any(p.pending_posts for p in world.providers.values())
        or any(p.restarting for p in world.processes.values())
        or periodic(world)
    )


def periodic(world: World) -> list[tuple[str, str, float]]:
    """The periodic work that has something to look at: (process, what, every)."""
    work: list[tuple[str, str, float]] = []
    if world.outbox.pending():
        work.append(("api", "relay", world.settings.api.outbox_relay_interval))
    if any(world.campaign_tables.runs.values()):
        work.append(("api", "campaigns", RUNNER_EVERY))
    if schedule_open(world):
        for name in ("consumers-a", "consumers-b"):
            work.append((name, "scheduler", SCHEDULER_EVERY))
    if hooks_waiting(world):
        work.append(("hooks", "sweep", world.settings.hooks.sweep_interval))
    if any(world.canary_tables.rollouts.values()):
        for name in ("consumers-a", "consumers-b"):
            work.append((name, "judge", JUDGE_EVERY))
    return work


def schedule_open(world: World) -> bool:
    """Whether the scheduler has anything left to do: a batch in a minute past its
    cursor that is not yet started, or started and not yet split (a pass that died after
    starting it publishes it again). A quiet scheduler passing every second over minutes
    it already handed on changes nothing, so the world does not run those passes."""
    namespace = world.settings.amqp.exchange
    cursor = world.schedule_tables.cursors.get(namespace)
    for (ns, minute), rows in world.schedule_tables.rows.items():
        if ns != namespace or (cursor is not None and minute <= cursor):
            continue
        for batch_id in rows:
            header = world.db.headers.get(batch_id)
            status = shown_status(
                header.get("status") if header else None,
                header.get("dispatched") if header else None,
            )
            if status in ("scheduled", "pending", "accepted"):
                return True
    return False


def passes(world: World) -> None:
    """Start the periodic work that is due and has something to look at."""
    now = asyncio.get_running_loop().time()
    for name, what, every in periodic(world):
        process = world.processes[name]
        if now < world.due_at.get((name, what), 0.0) or not process.current.alive:
            continue
        work = pass_of(world, process.current, what)
        if work is not None:
            world.due_at[(name, what)] = now + every
            process.spawn(_quietly(work))


def hooks_waiting(world: World) -> bool:
    """Whether an event waits in a user's endpoint queue (not yet delivered)."""
    now = world.db.now()
    return any(
        (row.read(now) or {}).get("done") is False
        for rows in world.hook_queue.queue.values()
        for row in rows.values()
    )


def pass_of(world: World, inc: Incarnation, what: str) -> Callable[[], Awaitable[Any]] | None:
    """The pass ``what`` of the incarnation's service (None: it has not started)."""
    if what == "sweep":
        worker = world.hook_workers.get(inc)
        return None if worker is None else lambda: sweep(worker)
    if what in ("relay", "campaigns"):
        api = world.api.get(inc)
        if api is None:
            return None
        return api.relay.once if what == "relay" else api.runner.pass_once
    consumer = world.consumers.get(inc)
    if consumer is None:
        return None
    return consumer.scheduler.pass_once if what == "scheduler" else consumer.judge.pass_once


async def quiesce(world: World, horizon: float = 10 * 24 * 3600.0) -> bool:
    """Run until nothing is left to do; False if something is still going at ``horizon``
    seconds after the start."""
    loop = asyncio.get_running_loop()
    while True:
        passes(world)
        if not busy(world):
            await asyncio.sleep(0)
            if not busy(world):
                return True
        if loop.time() >= horizon:
            return False
        await asyncio.sleep(tick(world))


def tick(world: World) -> float:
    """How long the world can wait before it must look again."""
    if world.requests_in_flight or world.broker.unacked or world.broker.leftovers():
        return 0.5
    now = asyncio.get_running_loop().time()
    due = [d for d in (world.broker.next_due(),) if d is not None]
    wait = min(due) - now if due else 60.0
    for name, what, _ in periodic(world):
        wait = min(wait, max(0.0, world.due_at.get((name, what), 0.0) - now))
    return max(0.05, min(wait, 600.0))


async def _quietly(work: Callable[[], Awaitable[Any]]) -> None:
    """A periodic pass, as its loop runs it: a dependency down ends the pass, not the loop."""
    try:
        await work()
    except DependencyUnavailable as exc:
        log.debug("periodic work: %s", exc)


async def sweep(worker: Worker) -> None:
    """One pass of the hooks process's sweep (``services.hooks.main.sweep``)."""
    async for user_id, endpoint_id in worker.store.every_endpoint():
        if await worker.has_work(endpoint_id):
            await wake(worker.broker, user_id, endpoint_id)
