"""Test doubles for provider adapters: chunk builders and a scripted local HTTP server.

The server is real HTTP on 127.0.0.1 (aiohttp, random port) so adapters are exercised through
their actual client libraries; it records each request and answers from a script.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiohttp import web

from shared.core.models import Address, Chunk, Message, Recipient
from shared.delivery.recipients import log_id_for

BATCH_ID = uuid.UUID("6f1c2a40-0000-1000-8000-000000000001")  # a time UUID, as ours are


def recipient(
    email: str, name: str | None = None, substitutions: dict[str, str] | None = None
) -> Recipient:
    """A recipient with the log id the batch gives its address (stable across calls)."""
    return Recipient(
        log_id=log_id_for(BATCH_ID, email),
        email=email,
        name=name,
        substitutions=substitutions or {},
    )


def message(**fields: object) -> Message:
    """A minimal valid message; keyword arguments override its fields."""
    data: dict[str, object] = {
        "sender": Address(email="news@example.com", name="Example News"),
        "subject": "Hello",
        "html": "<p>Hi</p>",
    }
    data.update(fields)
    return Message.model_validate(data)


def chunk(
    recipients: Iterable[Recipient] = (),
    /,
    *,
    index: int = 0,
    **fields: object,
) -> Chunk:
    """A chunk of ``message(**fields)``; one default recipient when none are given."""
    people = tuple(recipients) or (recipient("ann@example.org", "Ann"),)
    return Chunk(batch_id=BATCH_ID, index=index, message=message(**fields), recipients=people)


@dataclass(frozen=True)
class Reply:
    """One scripted response; ``delay`` seconds pass before it is sent."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass(frozen=True)
class Received:
    """One request as the server saw it, with when handling started and ended."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    started: float
    finished: float


class FakeProviderServer:
    """Answers every request with the next scripted Reply (or ``default``) and records it."""

    def __init__(self, default: Reply) -> None:
        self.default = default
        self.received: list[Received] = []
        self._script: deque[Reply] = deque()
        self._runner: web.AppRunner | None = None
        self.url = ""

    def script(self, *replies: Reply) -> None:
        self._script.extend(replies)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # A short shutdown timeout: a handler still sleeping for a "slow" test is cut off.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        body = await request.read()
        reply = self._script.popleft() if self._script else self.default
        if reply.delay:
            await asyncio.sleep(reply.delay)
        self.received.append(
            Received(
                method=request.method,
                path=request.path,
                headers={k.lower(): v for k, v in request.headers.items()},
                body=body,
                started=started,
                finished=time.monotonic(),
            )
        )
        return web.Response(status=reply.status, body=reply.body, headers=reply.headers)
