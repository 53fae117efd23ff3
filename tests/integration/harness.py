"""In-process service harness for integration tests: real apps, real RabbitMQ and Cassandra.

The API and consumer apps run their real lifespans and are called through
``httpx.ASGITransport``; the sandbox is served by uvicorn on a free port because the provider
adapters (including the synchronous SendGrid client) talk to it over real HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from shared.delivery.stats import batch_day


@contextlib.asynccontextmanager
async def running(app: Starlette) -> AsyncIterator[Starlette]:
    """Run an app's lifespan (connections, consumers, background tasks) around the block."""
    async with app.router.lifespan_context(app):
        yield app


@contextlib.asynccontextmanager
async def client_for(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
        yield client


@contextlib.asynccontextmanager
async def served(app: Any, *, lifespan: bool = True) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn on 127.0.0.1 and a free port; yield its base URL.
    ``lifespan=False`` serves an app whose lifespan already runs (:func:`running`)."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        lifespan="on" if lifespan else "off",
        log_level="warning",
        loop="none",
    )
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[attr-defined]
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def batch_stats(
    api: httpx.AsyncClient, batch_id: str, headers: Mapping[str, str] | None = None
) -> dict[str, int]:
    """``/v1/stats`` of the day ``batch_id`` was accepted, where its recipients are counted:
    read after midnight, still that day's and not the new day's."""
    return await day_stats(api, batch_day(uuid.UUID(batch_id)).isoformat(), headers)


async def day_stats(
    api: httpx.AsyncClient, day: str, headers: Mapping[str, str] | None = None
) -> dict[str, int]:
    """``/v1/stats`` of one day (ISO date)."""
    resp = await api.get("/v1/stats", params={"from": day, "to": day}, headers=headers)
    assert resp.status_code == 200, resp.text
    data: dict[str, int] = resp.json()["data"][0]
    return data


async def eventually(check: Any, *, timeout: float = 30.0, interval: float = 0.2) -> Any:
    """Await ``check()`` until it returns something truthy; fail with its last value."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: Any = None
    while asyncio.get_running_loop().time() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s; last value: {last!r}")
