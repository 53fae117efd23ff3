"""Fuzzing every route of the API with hand-written strategies: the ones its OpenAPI document
does not list (the Go original's ``/api/*``, the dashboard's pages and forms, the GitHub
login) and, again, every ``/v1`` operation it lists, so that each route gets its share of
requests whatever Schemathesis can make of its schema (a route with few parameters yields few
distinct examples there).

Hypothesis draws each request: the route, its path ids and query, form fields (known names
with hostile values, and unknown names), raw bodies under any content type, and who asks (an
API key, a wrong key, a dashboard session with and without its CSRF token and origin, a
forged login cookie, nobody). Every answer is counted by :class:`Tally`; an answer of 500 and
above fails the run, and so does a 4xx that is not in its interface's error form: the
original's ``{"error": "..."}`` on its ``/api/*`` routes (a path or method it never served
gets the app's 404/405 envelope), an HTML page on the dashboard, the app's envelope for the
JSON answers of the login routes and of ``/v1``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import orjson
from hypothesis import given
from hypothesis import strategies as st

from sandbox.app import create_app as create_sandbox
from services.api.app import create_app as create_api
from services.api.loginstate import PendingLogin, encode
from services.api.openapi import OPERATIONS
from services.api.session_store import LOGIN_COOKIE, SESSION_COOKIE, SessionStore, new_token
from shared.accounts import accounts
from shared.infra.config import SandboxSettings, Settings
from shared.infra.db import Database
from tests.fuzz.tally import Tally, new_sender, settings_for
from tests.integration.harness import served

ORIGIN = "http://127.0.0.1:8080"  # the default public URL: our own pages' origin


@dataclass(frozen=True)
class Who:
    """The credentials one fuzzed request carries."""

    key: str
    session: str
    csrf: str
    victim_session: str
    victim_csrf: str


@dataclass
class Call:
    method: str
    path: str
    params: list[tuple[str, str]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, str] = field(default_factory=dict)
    data: list[tuple[str, str]] | None = None
    multipart: bool = False
    content: bytes | None = None


texts = st.text(max_size=60)
hostile = st.sampled_from(
    ["", " ", "²", "0", "-1", "9" * 30, "%00", "\x00", "a\r\nb: c", "..", "/", "<b>x</b>",
     "=?a?q? " * 20, "null", "true", "[]", "{}", "é" * 300, "x" * 5000]
)  # fmt: skip
values = st.one_of(texts, hostile, st.emails(), st.integers().map(str))
ids = st.one_of(
    st.uuids(version=1).map(str),
    st.uuids().map(str),
    st.sampled_from(["", "..", "%2e%2e", "00000000-0000-0000-0000-000000000000", "²"]),
    texts.filter(lambda t: "/" not in t and "?" not in t and "#" not in t),
)
FORM_FIELDS = [
    "to", "from", "subject", "body", "name", "is_bulk", "api_key", "user_id", "html", "text",
    "bulk", "idempotency_key", "lifetime", "scopes", "email", "reason", "domain", "csrf_token",
]  # fmt: skip
form_fields = st.lists(
    st.tuples(st.sampled_from(FORM_FIELDS) | texts, values | st.just("true")), max_size=12
)
queries = st.lists(
    st.tuples(
        st.sampled_from(["page", "cursor", "state", "next", "error", "revoked", "added",
                         "removed", "verified", "absent", "sent", "api_key", "code"]) | texts,
        values,
    ),
    max_size=4,
)  # fmt: skip
#: Forms each route accepts, so that drawn fields also reach the code past validation.
VALID_FORMS: dict[str, list[tuple[str, str]]] = {
    "/api/batch": [("to", "ann@example.org"), ("from", "shop@example.com"),
                   ("subject", "Hi"), ("body", "<p>Hi</p>"), ("name", "Shop")],
    "/send": [("from", "Shop <shop@example.com>"), ("to", "ann@example.org"),
              ("subject", "Hi"), ("text", "Hi")],
    "/keys": [("name", "fuzz"), ("lifetime", "30")],
    "/suppressions": [("email", "gone@example.org"), ("reason", "fuzz")],
    "/suppressions/remove": [("email", "gone@example.org")],
    "/domains": [("domain", "news.example.com")],
    "/domains/verify": [("domain", "example.com")],
    "/domains/remove": [("domain", "news.example.com")],
}  # fmt: skip


def _dumps(value: object) -> bytes:
    """JSON as a client might write it (NaN and infinities included, as Python writes them)."""
    return json.dumps(value).encode()


json_bodies = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=5)
    ),
    max_leaves=15,
).map(_dumps)
AUTHS = ["key", "bad key", "none", "session", "session without csrf", "cross-site session"]

#: Route templates and how to draw a request for each (method, path from ids).
ORIGINAL: list[tuple[str, Callable[[str], str]]] = [
    ("POST", lambda _: "/api/batch"),
    ("GET", lambda _: "/api/batches"),
    ("GET", lambda i: f"/api/batch/{i}"),
    ("GET", lambda i: f"/api/batch/{i}/logs"),
    ("GET", lambda _: "/api/stats"),
    ("GET", lambda _: "/api/user"),
]


def _v1_path(template: str) -> Callable[[str], str]:
    return lambda ident: re.sub(r"\{[^}]+\}", ident, template)


#: Every operation of the OpenAPI document, its path parameters drawn like ids.
V1: list[tuple[str, Callable[[str], str]]] = [
    (op.method.upper(), _v1_path(op.path)) for op in OPERATIONS
]
DASHBOARD: list[tuple[str, Callable[[str], str]]] = [
    ("GET", lambda _: "/"),
    ("GET", lambda _: "/login"),
    ("GET", lambda _: "/batches"),
    ("GET", lambda i: f"/batches/{i}"),
    ("GET", lambda _: "/send"),
    ("POST", lambda _: "/send"),
    ("GET", lambda _: "/keys"),
    ("POST", lambda _: "/keys"),
    ("POST", lambda i: f"/keys/{i}/revoke"),
    ("GET", lambda _: "/suppressions"),
    ("POST", lambda _: "/suppressions"),
    ("POST", lambda _: "/suppressions/remove"),
    ("GET", lambda _: "/domains"),
    ("POST", lambda _: "/domains"),
    ("POST", lambda _: "/domains/verify"),
    ("POST", lambda _: "/domains/remove"),
    ("GET", lambda _: "/v1/docs"),
    ("POST", lambda _: "/sessions/end-all"),
    ("GET", lambda _: "/auth/github/login"),
    ("GET", lambda _: "/auth/github/callback"),
    ("POST", lambda _: "/auth/logout"),
]


def draw_call(
    route: tuple[str, Callable[[str], str]],
    who: Who,
    auth: str,
    ident: str,
    params: list[tuple[str, str]],
    form: list[tuple[str, str]],
    body: str,
    raw: bytes,
    login: PendingLogin | None,
    near_valid: bool,
) -> Call:
    method, path_of = route
    path = path_of(quote(ident, safe=""))
    if near_valid:  # a form that would be accepted, with the drawn fields added or repeated
        form = [*VALID_FORMS.get(path, []), *form]
    call = Call(method, path, params=params)
    # Ending every session would log the fuzzer out: those routes use a session of their own.
    ends_sessions = path in ("/sessions/end-all", "/auth/logout")
    session, csrf = (
        (who.victim_session, who.victim_csrf) if ends_sessions else (who.session, who.csrf)
    )
    if auth == "key":
        call.headers["Authorization"] = f"Bearer {who.key}"
    elif auth == "bad key":
        call.headers["Authorization"] = "Bearer sd_live_aaaaaaaaaaaa_" + "b" * 43
    elif auth.endswith("session") or auth == "session without csrf":
        call.cookies[SESSION_COOKIE] = session
        call.headers["Origin"] = "https://evil.example" if auth.startswith("cross") else ORIGIN
        if auth != "session without csrf":
            call.headers["X-CSRF-Token"] = csrf
            form = [("csrf_token", csrf), *form]
    if path == "/auth/github/callback" and login is not None:
        # A login this browser did start: the random code then reaches (the sandbox's) GitHub.
        call.cookies[LOGIN_COOKIE] = encode([login])
        call.params = [("state", login.state), ("code", ident), *params]
    if method in ("POST", "PATCH", "PUT"):
        if body == "form":
            call.data = form
        elif body == "multipart":
            call.data, call.multipart = form, True
        else:
            call.content = raw
            call.headers["Content-Type"] = body
    return call


def calls(route: tuple[str, Callable[[str], str]], who: Who, now: int) -> st.SearchStrategy[Call]:
    """Requests to ``route``, carrying ``who``'s credentials (or not)."""
    login = st.builds(
        PendingLogin, st.just(new_token()), st.just(new_token()), st.just("/"), st.just(now)
    )
    return st.builds(
        draw_call,
        st.just(route),
        st.just(who),
        st.sampled_from(AUTHS),
        ids,
        queries,
        form_fields,
        st.sampled_from(["form", "multipart", "application/json", "text/plain",
                         "multipart/form-data",
                         "application/x-www-form-urlencoded; charset=utf-16"]),
        st.binary(max_size=512) | st.text(max_size=200).map(str.encode) | json_bodies,
        st.none() | login,
        st.booleans(),
    )  # fmt: skip


def envelope_problem(call: Call, response: httpx.Response) -> str | None:
    """A 4xx must be in its interface's error form; None when it is (or is not a 4xx)."""
    if not 400 <= response.status_code < 500:
        return None
    if response.request.url.path.startswith("/api/"):  # as sent: httpx resolves "/.."
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            return "not JSON"
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            return None
        if response.status_code in (404, 405) and _enveloped(body):
            return None  # no route of the original's: routing answers in the app's envelope
        return "not the original's {'error': ...} form"
    kind = response.headers.get("content-type", "")
    if kind.startswith("text/html"):
        return None
    if kind.startswith("application/json") and _enveloped(orjson.loads(response.content)):
        return None
    return f"a {response.status_code} as {kind or 'nothing'}"


def _enveloped(body: object) -> bool:
    """Whether ``body`` is the app's error envelope ``{"error": {"code", "message"}}``."""
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and {"code", "message"} <= set(error)


def draw_calls(who: Who, examples: int, seed: int) -> list[Call]:
    """``examples`` requests to each route, carrying ``who``'s credentials (or not)."""
    drawn: list[Call] = []
    for route in ORIGINAL + DASHBOARD + V1:

        @settings_for(examples, seed)
        @given(calls(route, who, int(time.time())))
        def collect(call: Call) -> None:
            drawn.append(call)

        collect()
    return drawn


async def fuzz_handmade(settings: Settings, examples: int, seed: int) -> dict[str, Any]:
    """``examples`` requests to each route."""
    who = await credentials(settings)
    drawn = draw_calls(who, examples, seed)
    sandbox = create_sandbox(SandboxSettings(webhook_url="http://127.0.0.1:9", webhook_delay=60))
    problems: list[str] = []
    async with served(sandbox) as sandbox_url:
        api = settings.api.model_copy(update={"dns_url": f"{sandbox_url}/dns-query"})
        github = settings.github.model_copy(
            update={
                "oauth_base_url": f"{sandbox_url}/github",
                "api_base_url": f"{sandbox_url}/github/api",
            }
        )
        app = create_api(settings.model_copy(update={"api": api, "github": github}))
        tally = Tally(app)
        async with served(tally) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
            for call in drawn:
                response = await send(client, call)
                problem = envelope_problem(call, response)
                if problem is not None:
                    problems.append(f"{call.method} {call.path}: {problem}")
    summary = tally.summary()
    return {**summary, "envelope_failures": len(problems), "first_envelope_failures": problems[:20]}


async def send(client: httpx.AsyncClient, call: Call) -> httpx.Response:
    client.cookies.clear()
    headers, content = dict(call.headers), call.content
    if call.data is not None and not call.multipart:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        content = urlencode(call.data).encode()
    request = client.build_request(
        call.method,
        call.path,
        params=urlencode(call.params),
        headers=headers,
        cookies=call.cookies,
        files=[(k, (None, v)) for k, v in call.data] if call.multipart and call.data else None,
        content=content,
    )
    return await client.send(request, follow_redirects=False)


async def credentials(settings: Settings) -> Who:
    db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
    try:
        user, key = await new_sender(db, "fuzz-pages")
        sessions = SessionStore(db)
        session, csrf = await sessions.create(user)
        victim = await accounts.ensure_user(db, f"fuzz-victim-{uuid.uuid4().hex[:8]}")
        victim_session, victim_csrf = await sessions.create(victim)
    finally:
        await db.close()
    return Who(key, session, csrf, victim_session, victim_csrf)
