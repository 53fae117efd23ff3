"""How dashboard pages fail: HTML error pages (never JSON or a stack trace), login redirects and
security headers, from real handlers wrapped by ``services.api.dashboard.pages.page``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from services.api.dashboard.pages import page
from services.api.sessions import LoginRequired
from shared.core.errors import DependencyUnavailable
from shared.infra.http import ApiError


@page
async def cassandra_down(request: Request) -> Response:
    raise DependencyUnavailable("cassandra", "no host available: 127.0.0.1:9042 SECRET-DETAIL")


@page
async def crashes(request: Request) -> Response:
    raise RuntimeError("boom SECRET-DETAIL")


@page
async def missing(request: Request) -> Response:
    raise ApiError(404, "not_found", "There is no such batch in your account.")


@page
async def private(request: Request) -> Response:
    raise LoginRequired("/keys?x=1")


@page
async def fine(request: Request) -> Response:
    return PlainTextResponse("ok")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = Starlette(
        routes=[
            Route("/down", cassandra_down),
            Route("/crash", crashes),
            Route("/missing", missing),
            Route("/private", private),
            Route("/fine", fine),
        ]
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as c:
        yield c


async def test_dependency_down_is_a_503_page_with_retry_after(client: httpx.AsyncClient) -> None:
    """A Cassandra outage renders the 503 page and asks the browser to retry later."""
    resp = await client.get("/down")
    assert (resp.status_code, resp.headers["retry-after"]) == (503, "5")
    assert resp.headers["content-type"].startswith("text/html")
    assert "Temporarily unavailable" in resp.text


async def test_error_pages_do_not_leak_internal_details(client: httpx.AsyncClient) -> None:
    """Neither the 503 nor the 500 page shows the exception's text or a traceback."""
    bodies = [(await client.get("/down")).text, (await client.get("/crash")).text]
    assert not any("SECRET-DETAIL" in b or "Traceback" in b for b in bodies)


async def test_unexpected_error_is_a_500_page(client: httpx.AsyncClient) -> None:
    """An unhandled exception becomes the HTML 500 page."""
    resp = await client.get("/crash")
    assert resp.status_code == 500
    assert "Something went wrong" in resp.text


async def test_api_error_keeps_its_status_and_message(client: httpx.AsyncClient) -> None:
    """An ApiError 404 is an HTML page with its message."""
    resp = await client.get("/missing")
    assert resp.status_code == 404
    assert "There is no such batch in your account." in resp.text


async def test_login_required_redirects_to_the_login_page(client: httpx.AsyncClient) -> None:
    """A page that needs a user sends the browser to /login with where it was going."""
    resp = await client.get("/private", follow_redirects=False)
    assert (resp.status_code, resp.headers["location"]) == (302, "/login?next=%2Fkeys%3Fx%3D1")


async def test_pages_carry_security_headers(client: httpx.AsyncClient) -> None:
    """Every page forbids framing, inline script and caching."""
    headers = (await client.get("/fine")).headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert (headers["x-frame-options"], headers["cache-control"]) == ("DENY", "no-store")


async def test_error_pages_carry_security_headers_too(client: httpx.AsyncClient) -> None:
    """The 503 page is as locked down as any other page."""
    assert (await client.get("/down")).headers["x-frame-options"] == "DENY"
