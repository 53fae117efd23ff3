"""The delivery worker against real Cassandra, RabbitMQ and the sandbox receiver: a worker
killed mid-delivery leaves the event to be sent again under the same webhook-id, and the
lease keeps a second worker off an endpoint."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from services.hooks.worker import Worker
from shared.infra.config import HooksSettings, Settings
from shared.infra.db import Database
from shared.outbound.hook_delivery import Deliverer
from shared.outbound.hook_queue import HookQueue, Pending
from shared.outbound.hook_store import HookStore
from tests.integration.harness import eventually
from tests.integration.hookstack import HookStack, event, hook_stack


class Crash(BaseException):
    """The process dies here: nothing after it runs."""


class _Dies(HookQueue):
    """A queue whose worker dies before letting go of its lease (a killed process)."""

    async def release_lease(self, endpoint_id: uuid.UUID, owner: uuid.UUID) -> None:
        return None


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[HookStack]:
    async with hook_stack(settings, db, worker=False) as s:
        yield s


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(follow_redirects=False) as client:
        yield client


def _worker(
    stack: HookStack,
    http: httpx.AsyncClient,
    queue: HookQueue,
    hooks: HooksSettings | None = None,
    lease_seconds: float = 30,
    **kw: object,
) -> Worker:
    hooks = hooks or stack.settings.hooks
    deliverer = Deliverer(http, timeout=3, allow_http=True, allowed=hooks.networks)
    broker = stack.api_app.state.resources.broker
    store = HookStore(stack.db)
    return Worker(store, queue, broker, deliverer, hooks, lease_seconds=lease_seconds, **kw)  # type: ignore[arg-type]


async def _settled(stack: HookStack) -> None:
    """Wait out the order window: every event queued so far may be sent in one pass."""
    await asyncio.sleep(stack.settings.hooks.order_window)


async def test_a_worker_killed_mid_delivery_leaves_the_event_to_be_sent_again(
    stack: HookStack, db: Database, http: httpx.AsyncClient
) -> None:
    """Sent but not marked when the worker died: the next worker sends it again, same id,
    once the dead worker's lease lapsed, and then the rest in order."""
    created = await stack.endpoint("/crash")
    endpoint_id = uuid.UUID(created["id"])
    await stack.emitter.emit(stack.user_id, [event("recipient.sent", "gus@example.com", 0)])
    await stack.emitter.emit(stack.user_id, [event("recipient.delivered", "gus@example.com", 1)])

    async def die(point: str, item: Pending) -> None:
        raise Crash(point)

    dying = _worker(stack, http, _Dies(db), lease_seconds=4, probe=die)
    with pytest.raises(Crash):
        await dying.run(stack.user_id, endpoint_id)
    survivor = _worker(stack, http, HookQueue(db))
    while_held = await survivor.run(stack.user_id, endpoint_id)

    async def lapsed() -> int:  # once the dead worker's lease lapses, the survivor sends
        return await survivor.run(stack.user_id, endpoint_id)

    after = await eventually(lapsed, timeout=30, interval=0.5)
    got = await stack.received("/crash")

    ids = [r["headers"]["webhook-id"] for r in got]
    assert while_held == 0
    assert after == 2
    assert len(ids) == 3 and ids[0] == ids[1] != ids[2]
    assert all(r["verified"] for r in got)


async def test_two_workers_never_send_one_endpoint_at_once(
    stack: HookStack, db: Database, http: httpx.AsyncClient
) -> None:
    """Started together, one takes the lease and sends everything once; the other none."""
    created = await stack.endpoint("/leased")
    endpoint_id = uuid.UUID(created["id"])
    for n in range(6):
        await stack.emitter.emit(stack.user_id, [event("recipient.sent", "hal@example.com", n)])
    await _settled(stack)

    counts = await asyncio.gather(
        _worker(stack, http, HookQueue(db)).run(stack.user_id, endpoint_id),
        _worker(stack, http, HookQueue(db)).run(stack.user_id, endpoint_id),
    )
    got = await stack.received("/leased")

    ids = [r["headers"]["webhook-id"] for r in got]
    assert sorted(counts) == [0, 6]
    assert len(ids) == len(set(ids)) == 6


async def test_a_backlog_longer_than_a_batch_goes_in_order_over_several_passes(
    stack: HookStack, db: Database, http: httpx.AsyncClient
) -> None:
    """Each pass sends one batch and leaves the rest to the next, in order, none twice."""
    created = await stack.endpoint("/backlog")
    endpoint_id = uuid.UUID(created["id"])
    for n in range(7):
        await stack.emitter.emit(stack.user_id, [event("recipient.sent", "ivy@example.com", n)])
    await _settled(stack)
    worker = _worker(stack, http, HookQueue(db), batch=3)

    passes = [await worker.run(stack.user_id, endpoint_id) for _ in range(4)]
    got = await stack.received("/backlog")

    attempts = [orjson.loads(r["body"])["data"]["attempt"] for r in got]
    assert passes == [3, 3, 1, 0]
    assert attempts == list(range(7))


async def test_the_sweep_wakes_only_endpoints_with_work_they_may_do(
    stack: HookStack, db: Database, http: httpx.AsyncClient
) -> None:
    """Nothing waiting, or waiting for a retry: not woken; something waiting: woken."""
    created = await stack.endpoint("/swept")
    endpoint_id = uuid.UUID(created["id"])
    slow = stack.settings.hooks.model_copy(update={"delays": "30"})
    worker = _worker(stack, http, HookQueue(db), slow)

    idle = await worker.has_work(endpoint_id)
    await stack.emitter.emit(stack.user_id, [event("recipient.sent", "jo@example.com")])
    busy = await worker.has_work(endpoint_id)
    await stack.control.post("/_control/receiver/fail", json={"path": "/swept", "status": 500})
    await worker.run(stack.user_id, endpoint_id)
    backing_off = await worker.has_work(endpoint_id)

    assert (idle, busy, backing_off) == (False, True, False)
