"""Admission control: overload is shed with 503, not queued without bound."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from shared.infra.http import AdmissionLimit


async def test_requests_over_the_limit_get_503_with_retry_after() -> None:
    """With one slot taken, the next request is refused at once with the JSON envelope."""
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(request: Request) -> PlainTextResponse:
        started.set()
        await release.wait()
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", slow)], middleware=[Middleware(AdmissionLimit, limit=1)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        first = asyncio.create_task(c.get("/"))
        await asyncio.wait_for(started.wait(), 5)  # the first request holds the slot
        second = await asyncio.wait_for(c.get("/"), 5)  # refused at once, never queued
        release.set()
        assert (await first).status_code == 200

    assert second.status_code == 503
    assert second.headers["retry-after"] == "1"
    assert second.json()["error"]["code"] == "overloaded"
