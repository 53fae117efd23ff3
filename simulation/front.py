"""Where the simulated deployment meets the world outside it: clients' requests to the API
and the tracking endpoint, providers' webhook posts, and a user's webhook endpoint.

Each request is handled in its service's process; what its sender hears is decided by the
steps on the way: the API's answer is a step that can be lost (the client sees a broken
connection), a webhook post is a step of the webhook process that can be lost on the way,
delivered twice or late, and a delivery to a user's endpoint is a step of the hooks process
that the endpoint can refuse, or take and lose the answer of. A process killed while it
handles a request answers nothing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from shared.core.errors import DependencyUnavailable
from shared.infra.http import ApiError
from shared.outbound.hook_delivery import Outcome
from simulation.processes import Gate, Killed

if TYPE_CHECKING:
    from simulation.world import ApiState, WebhookState, World


@dataclass
class Reply:
    """What a client heard: a status (0: the connection broke) and the body or error code."""

    status: int
    body: dict[str, Any] | None = None
    code: str | None = None
    retry_after: float | None = None
    asked_at: float = 0.0
    """When (seconds into the run, by the true clock) the client sent the request."""


@dataclass
class UserEndpoint:
    """A user's webhook endpoint, as the hooks worker's deliveries reach it (a ``hook`` step:
    it may answer 503 having taken nothing, or take the event and lose its answer)."""

    gate: Gate
    received: dict[str, list[str]] = field(default_factory=dict)
    """url -> webhook-ids in the order they first arrived (each once)."""
    first_at: dict[str, datetime] = field(default_factory=dict)
    """webhook-id -> when it first arrived."""

    async def send(
        self, url: str, msg_id: str, body: bytes, secrets: Sequence[str], now: float
    ) -> Outcome:
        fault = self.gate.enter(f"hook:{url.rsplit('/', 1)[-1]}", "hook")
        await self.gate.pause()
        if fault == "fail":
            return Outcome(503, None, 5)
        got = self.received.setdefault(url, [])
        if msg_id not in got:
            got.append(msg_id)
            self.first_at[msg_id] = datetime.now(UTC)
        if fault == "accept_fail":
            return Outcome(None, "read timeout (the endpoint took it)", 10_000)
        self.gate.die_if(fault)
        return Outcome(200, None, 5)


async def receive_webhook(world: World, code: str, raw: bytes) -> tuple[int, str | None]:
    """A provider posts ``raw`` to our webhook service: the status it heard back (0: no
    answer), and the fault its post met on the way (lost, duplicated, late)."""
    process = world.processes["webhooks"]

    async def handle() -> tuple[int, str | None]:
        fault = world.gate.enter(f"webhook:{code}", "webhook")
        await world.gate.pause()
        if fault in ("fail", "late"):
            return 0, fault
        world.gate.die_if(fault)
        state = world.webhooks.get(process.current)
        if state is None:
            return 503, fault
        try:
            await state.intake.receive(code, raw)
        except ApiError as exc:
            return exc.status, fault
        except DependencyUnavailable:
            return 503, fault
        return 200, fault

    task = process.spawn(handle())
    try:
        answered: tuple[int, str | None] = await task
    except (Killed, asyncio.CancelledError):
        return 0, None
    return answered


async def request(world: World, user_id: uuid.UUID, body: dict[str, Any], key: str | None) -> Reply:
    """``POST /v1/batches`` as a client sees it."""

    async def accept(state: ApiState) -> dict[str, Any]:
        return await state.sending.accept(user_id, body, key)

    return await call(world, "POST /v1/batches", accept)


async def call(world: World, what: str, handler: Callable[[ApiState], Awaitable[Any]]) -> Reply:
    """One API request, handled in the ``api`` process, as its client sees it: the answer
    (a 2xx with the handler's result) is a step that can be lost."""
    api = world.processes["api"]

    async def answer() -> Reply:
        state = world.api.get(api.current)
        if state is None:
            return Reply(0)
        try:
            result = await handler(state)
        except ApiError as exc:
            after = (exc.headers or {}).get("Retry-After")
            return Reply(exc.status, None, exc.code, float(after) if after else None)
        except DependencyUnavailable:
            return Reply(503, None, "unavailable")
        return Reply(202 if what == "POST /v1/batches" else 200, _body(result))

    lose_first = what == "POST /v1/batches"
    return await _handled(world, "api", what, answer, lose_first=lose_first)


async def tracked(world: World, handler: Callable[[WebhookState], Awaitable[Any]]) -> Reply:
    """A request to the tracking endpoint (the webhooks service), as a reader's mail client
    sees it."""
    webhooks = world.processes["webhooks"]

    async def answer() -> Reply:
        state = world.webhooks.get(webhooks.current)
        if state is None:
            return Reply(0)
        try:
            await handler(state)
        except DependencyUnavailable:
            return Reply(503, None, "unavailable")
        return Reply(200)

    return await _handled(world, "webhooks", "POST /u/<token>", answer, lose_first=False)


async def _handled(
    world: World,
    process_name: str,
    what: str,
    answer: Callable[[], Awaitable[Reply]],
    *,
    lose_first: bool,
) -> Reply:
    """Handle a request in ``process_name`` and send back its answer, a step that can be
    lost (so can the scenario's first answers, with ``lose_first``); a process killed while
    it handles the request answers nothing."""
    process = world.processes[process_name]

    async def handle() -> Reply:
        reply = await answer()
        fault = world.gate.enter(f"answer:{what}", "answer")
        await world.gate.pause()
        if fault is None and lose_first and world.answers_to_lose > 0:
            world.answers_to_lose -= 1
            fault = "lost"
        if fault == "lost":
            return Reply(0)
        world.gate.die_if(fault)
        return reply

    world.requests_in_flight += 1
    asked_at = asyncio.get_running_loop().time()
    try:
        reply: Reply = await process.spawn(handle())
    except (Killed, asyncio.CancelledError):
        reply = Reply(0)
    finally:
        world.requests_in_flight -= 1
    reply.asked_at = asked_at
    return reply


def _body(answer: Any) -> dict[str, Any] | None:
    if isinstance(answer, dict):
        return answer
    return None
