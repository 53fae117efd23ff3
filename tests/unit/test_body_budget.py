"""The body budget of an HTTP process: a large body waits for room and is refused with 503
and Retry-After when none comes, a small one is served meanwhile, and what a request took is
given back however it ends."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import Message

from shared.infra.byte_budget import ByteBudget
from shared.infra.http import SMALL_BODY, BodyBudget, error_handlers, read_capped

BUDGET = 1024 * 1024
LARGE = b"x" * (BUDGET // 2 + 1)
SMALL = b"x" * 100


def _app(budget: ByteBudget, held: asyncio.Event, release: asyncio.Event) -> Starlette:
    async def echo(request: Request) -> PlainTextResponse:
        body = await read_capped(request, 10 * BUDGET)
        if request.query_params.get("hold"):
            held.set()
            await release.wait()
        if request.query_params.get("fail"):
            raise RuntimeError("the handler failed")
        return PlainTextResponse(str(len(body)))

    return Starlette(
        routes=[Route("/", echo, methods=["POST"])],
        middleware=[Middleware(BodyBudget, budget=budget, wait=0.05)],
        exception_handlers=error_handlers(),
    )


def _client(app: Starlette) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t")


async def test_a_large_body_over_budget_gets_503_while_a_small_one_is_served() -> None:
    """With a large body held until its answer, another large one is refused with
    Retry-After and the limit named, and a small one is answered."""
    budget, held, release = ByteBudget(BUDGET), asyncio.Event(), asyncio.Event()
    async with _client(_app(budget, held, release)) as client:
        first = asyncio.create_task(client.post("/?hold=1", content=LARGE))
        await asyncio.wait_for(held.wait(), 5)
        refused = await client.post("/", content=LARGE)
        small = await client.post("/", content=SMALL)
        release.set()
        assert (await first).status_code == 200

    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "2"
    assert refused.json()["error"]["limit"] == {"name": "body_budget_bytes", "value": BUDGET}
    assert small.status_code == 200
    assert budget.free == BUDGET


async def test_a_body_that_waits_is_served_once_room_is_given_back() -> None:
    """A large body waiting for room is read and answered when the one before it ends."""
    budget, held, release = ByteBudget(BUDGET), asyncio.Event(), asyncio.Event()
    app = _app(budget, held, release)
    app.user_middleware[0].kwargs["wait"] = 5.0
    app.middleware_stack = None
    async with _client(app) as client:
        first = asyncio.create_task(client.post("/?hold=1", content=LARGE))
        await asyncio.wait_for(held.wait(), 5)
        second = asyncio.create_task(client.post("/", content=LARGE))
        await asyncio.sleep(0.01)
        assert not second.done()
        release.set()
        assert (await first).status_code == 200
        assert (await second).status_code == 200


async def test_the_budget_is_given_back_after_errors_refusals_and_bodies_without_length() -> None:
    """A handler that fails, a body refused for size and a chunked body each give back
    everything they took."""
    budget, held, release = ByteBudget(BUDGET), asyncio.Event(), asyncio.Event()

    async def chunks() -> Any:
        for _ in range(4):
            yield LARGE[: BUDGET // 4]

    async with _client(_app(budget, held, release)) as client:
        failed = await client.post("/?fail=1", content=LARGE)
        too_large = await client.post("/", content=b"x" * (10 * BUDGET + 1))
        chunked = await client.post("/", content=chunks())

    assert failed.status_code == 500
    assert too_large.status_code == 413
    assert chunked.status_code == 200
    assert budget.free == BUDGET


async def test_the_budget_is_given_back_when_the_client_goes_away_mid_body() -> None:
    """A client that disconnects part-way through its body leaves nothing taken."""
    budget, held, release = ByteBudget(BUDGET), asyncio.Event(), asyncio.Event()
    app = _app(budget, held, release)
    messages: list[Message] = [
        {"type": "http.request", "body": LARGE, "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-length", str(2 * len(LARGE)).encode())],
        "server": ("t", 80),
        "client": ("c", 1),
    }
    # How the app reports a gone client is not the point: what it holds afterwards is.
    with contextlib.suppress(Exception):
        await app(scope, receive, send)

    assert budget.free == BUDGET


async def test_small_bodies_take_nothing() -> None:
    """Bodies up to SMALL_BODY never wait, even with the budget all taken."""
    budget, held, release = ByteBudget(BUDGET), asyncio.Event(), asyncio.Event()
    await budget.take(BUDGET, wait=0)
    async with _client(_app(budget, held, release)) as client:
        answer = await client.post("/", content=b"x" * SMALL_BODY)

    assert answer.status_code == 200
