"""Clients of the simulated API, and what each was told.

A keyed client sends an ``Idempotency-Key`` and retries with it, as the README asks: after a
broken connection or a 5xx, and after a ``409 idempotency_in_progress`` once its
``Retry-After`` has passed, until it has an answer. A keyless client retries only after a 503
(which promises that nothing was sent) and gives up after a broken connection (it cannot
know). Every body names its request (``metadata.sim_request``) and, for keyless clients, each
try (``metadata.sim_try``), so the providers' ledger can tell whose mail each acceptance was.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from simulation.front import Reply
from simulation.world import World

#: How often a client tries before it gives up.
TRIES = 40
#: Seconds a client waits before trying again after a broken connection or a 5xx.
BACKOFF = (1.0, 5.0, 30.0, 120.0)


@dataclass
class Request:
    """One request a client wants accepted, and everything it heard."""

    name: str
    user_id: uuid.UUID
    body: dict[str, Any]
    key: str | None
    replies: list[Reply] = field(default_factory=list)
    told_503: list[str] = field(default_factory=list)
    """The tries (``sim_try``) a keyless client was told 503 for: none of them may be sent."""
    backoff: tuple[float, ...] = BACKOFF
    """Seconds the client waits before each retry after a broken connection or a 5xx."""
    cancelled: Reply | None = None
    """What the client heard when it cancelled its (scheduled) batch, if it did."""

    @property
    def batch_ids(self) -> set[str]:
        return {r.body["batch_id"] for r in self.replies if r.status == 202 and r.body}

    @property
    def accepted(self) -> bool:
        return any(r.status == 202 for r in self.replies)

    @property
    def final(self) -> Reply | None:
        return self.replies[-1] if self.replies else None


async def send(world: World, request: Request) -> Request:
    """Send ``request`` as its client would, until it has an answer or gives up."""
    for attempt in range(TRIES):
        body = dict(request.body)
        metadata = {**body.get("metadata", {}), "sim_request": request.name}
        if request.key is None:
            metadata["sim_try"] = f"{request.name}.{attempt}"
        body["metadata"] = metadata
        reply = await world.request(request.user_id, body, request.key)
        request.replies.append(reply)
        if reply.status in (202, 400, 401, 403, 404, 413, 422, 429) or (
            reply.status == 409 and reply.code != "idempotency_in_progress"
        ):
            return request
        if request.key is None:
            if reply.status != 503:
                return request  # a broken connection: a keyless client cannot know
            request.told_503.append(metadata["sim_try"])
        wait = reply.retry_after or request.backoff[min(attempt, len(request.backoff) - 1)]
        await asyncio.sleep(wait)
    return request
