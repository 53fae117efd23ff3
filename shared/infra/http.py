"""HTTP plumbing shared by our Starlette services: the JSON error envelope
``{"error": {"code", "message", "fields"?, "batch_id"?, "limit"?}}`` and request bodies read
under a size cap that is enforced while they stream in (413 before buffering, not after),
into memory or, for large uploads, into a temporary file. A body read into memory first
takes its size from the process's body budget (:class:`BodyBudget`,
:mod:`shared.infra.byte_budget`) and holds it until its answer is sent."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, BinaryIO

import orjson
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from shared.core.digits import natural
from shared.core.errors import DependencyUnavailable
from shared.infra.byte_budget import BudgetExhausted, ByteBudget, Lease
from shared.infra.gil import CpuLane

#: Seconds a request body may take to arrive, whatever its size (408 after).
BODY_TIMEOUT = 30.0
#: Bytes of an upload held in memory before they are written to its temporary file.
SPOOL_FLUSH = 1024 * 1024
#: Bytes of JSON above which it is parsed in a worker thread (about 1 ms a 500 KB: a 10 MB
#: body would hold the event loop for tens of milliseconds).
LARGE_JSON = 512 * 1024
#: Where :class:`BodyBudget` puts a request's :class:`~shared.infra.byte_budget.Lease` in its scope.
LEASE = "safedelivr.body_lease"
#: Bodies up to this many bytes take nothing from the body budget (they never wait).
SMALL_BODY = 64 * 1024

log = logging.getLogger(__name__)


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class Answer(Response):
    """A JSON answer rendered from its pydantic model by the model's own serializer: the
    fields that were set (one left out of the constructor is left out of the wire, as a dict
    key would be), under their aliases (``from``)."""

    media_type = "application/json"

    def __init__(
        self,
        content: BaseModel,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(content, status_code, headers)

    def render(self, content: Any) -> bytes:
        return wire(content)


def wire(model: BaseModel) -> bytes:
    """The model as :class:`Answer` sends it (also what is stored to be replayed)."""
    return model.__pydantic_serializer__.to_json(model, by_alias=True, exclude_unset=True)


class ApiError(Exception):
    """Raised by handlers; rendered as the error envelope with ``status``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        fields: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        batch_id: str | None = None,
        limit: tuple[str, int | None] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields
        self.headers = headers
        self.batch_id = batch_id
        """The batch the error is about, for the client to look up (an unknown outcome)."""
        self.limit = limit
        """The limit a refusal is about: its name and value (``{"name", "value"}``; the value
        is ``None`` where it is a server setting rather than one number, as a template's
        memory and time)."""


def error_response(error: ApiError) -> JSON:
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.fields:
        body["fields"] = error.fields
    if error.batch_id:
        body["batch_id"] = error.batch_id
    if error.limit:
        body["limit"] = {"name": error.limit[0], "value": error.limit[1]}
    return JSON({"error": body}, status_code=error.status, headers=error.headers)


async def read_capped(request: Request, limit: int, *, timeout: float = BODY_TIMEOUT) -> bytes:
    """The raw body, or 413 as soon as it (or its declared length) passes ``limit``; 408 when
    it has not all arrived within ``timeout`` seconds (a client trickling a body a byte at a
    time would otherwise hold a request slot for as long as it likes)."""
    declared = _refuse_declared(request, limit)
    lease: Lease | None = request.scope.get(LEASE)
    if lease is not None and declared is not None:
        await _cover(lease, declared)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                if lease is not None:
                    await _cover(lease, size)  # a body longer than it said, or unsaid
                chunks.append(chunk)
    except TimeoutError:
        raise _late(timeout) from None
    return b"".join(chunks)


async def _cover(lease: Lease, size: int) -> None:
    try:
        await lease.cover(size)
    except BudgetExhausted as exc:
        raise ApiError(
            503,
            "overloaded",
            "too many large request bodies in progress; retry shortly",
            headers={"Retry-After": "2"},
            limit=("body_budget_bytes", exc.total),
        ) from None


async def spool_capped(request: Request, limit: int, *, timeout: float = BODY_TIMEOUT) -> BinaryIO:
    """The raw body in a temporary file (gone once closed: the caller closes it), rewound,
    under :func:`read_capped`'s limit and time limit. It is written as it arrives, at most
    :data:`SPOOL_FLUSH` bytes at a time, in a worker thread: an upload of any size holds
    about that much memory, and is never joined into one ``bytes``."""
    _refuse_declared(request, limit)
    spool = await asyncio.to_thread(tempfile.TemporaryFile)
    try:
        pending: list[bytes] = []
        held = size = 0
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                pending.append(chunk)
                held += len(chunk)
                if held >= SPOOL_FLUSH:
                    await asyncio.to_thread(_written, spool, pending)
                    pending, held = [], 0
        await asyncio.to_thread(_rewound, spool, pending)
    except TimeoutError:
        spool.close()
        raise _late(timeout) from None
    except BaseException:
        spool.close()
        raise
    return spool


def _written(spool: BinaryIO, chunks: list[bytes]) -> None:
    """Write ``chunks`` and empty the list in the worker thread, before the loop hears the
    write is done: the executor's work item keeps its arguments alive until its thread next
    runs, which a loaded machine may delay past one or two more flushes."""
    spool.writelines(chunks)
    chunks.clear()


def _rewound(spool: BinaryIO, rest: list[bytes]) -> None:
    _written(spool, rest)
    spool.flush()
    spool.seek(0)


def _refuse_declared(request: Request, limit: int) -> int | None:
    """The declared length, or 413 when it passes ``limit``."""
    declared = request.headers.get("content-length")
    size_declared = natural(declared, max_digits=40)  # any length: a huge one is a 413
    if size_declared is not None and size_declared > limit:
        raise _too_large(limit)
    return size_declared


def _late(timeout: float) -> ApiError:
    return ApiError(408, "body_timeout", f"the request body did not arrive within {timeout:g} s")


async def read_json(
    request: Request, limit: int, *, timeout: float = BODY_TIMEOUT, optional: bool = False
) -> tuple[bytes, Any]:
    """The raw body and its JSON (415 for another media type, 400 when it does not parse).
    ``optional``: a blank body is ``None``, whatever its content type. A large body is
    parsed on the app's CPU lane (``app.state.cpu``, :class:`shared.infra.gil.CpuLane`)."""
    if not optional:
        _json_type(request)
    raw = await read_capped(request, limit, timeout=timeout)
    if optional:
        if not raw.strip():
            return raw, None
        _json_type(request)
    try:
        if len(raw) > LARGE_JSON:
            cpu: CpuLane = request.app.state.cpu
            return raw, await cpu.run(orjson.loads, raw)
        return raw, orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from exc


def _json_type(request: Request) -> None:
    ctype = request.headers.get("content-type", "")
    if ctype and "json" not in ctype.split(";")[0]:
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "body_too_large", f"the request body exceeds {limit} bytes")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)  # noqa: S101 - registered for ApiError only
    return error_response(exc)


async def _unavailable(request: Request, exc: Exception) -> Response:
    log.warning("%s %s: %s", request.method, request.url.path, exc)
    return error_response(
        ApiError(
            503,
            "unavailable",
            "a dependency is unavailable; retry shortly",
            headers={"Retry-After": "5"},
        )
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)  # noqa: S101 - registered for HTTPException only
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    # Starlette's own headers (a 405's Allow, which RFC 9110 requires) go out with it.
    headers = dict(exc.headers) if exc.headers else None
    return error_response(ApiError(exc.status_code, code, str(exc.detail), headers=headers))


async def _crash(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(ApiError(500, "internal_error", "internal error; it has been logged"))


def error_handlers() -> dict[
    type[Exception] | int, Callable[[Request, Exception], Awaitable[Response]]
]:
    """Map our errors to the envelope: ApiError as is, outages to 503, anything else to 500."""
    return {
        ApiError: _api_error,
        DependencyUnavailable: _unavailable,
        HTTPException: _http_error,
        Exception: _crash,
    }


class AdmissionLimit:
    """ASGI middleware: at most ``limit`` HTTP requests in progress; beyond that answer 503
    with ``Retry-After`` at once, so overload sheds load instead of queueing without bound
    (latency and memory grew to seconds and hundreds of MB without it under `make bench`)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.active = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            busy = ApiError(
                503,
                "overloaded",
                "too many requests in progress; retry shortly",
                headers={"Retry-After": "1"},
            )
            await error_response(busy)(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


class BodyBudget:
    """ASGI middleware: each HTTP request gets a :class:`~shared.infra.byte_budget.Lease` on the
    process's body budget (``scope[LEASE]``), which :func:`read_capped` grows to the size of
    the body it reads (a body over :data:`SMALL_BODY` waits up to ``wait`` seconds for room,
    then is answered 503 with ``Retry-After``, unread) and which is given back when the
    request ends, however it ends (answered, failed, or its client gone): the bytes of the
    bodies a process holds, and of what it makes of them until it answers, stay bounded."""

    def __init__(self, app: Any, budget: ByteBudget, *, wait: float) -> None:
        self.app = app
        self.budget = budget
        self.wait = wait

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lease = Lease(self.budget, self.wait, small=SMALL_BODY)
        try:
            scope[LEASE] = lease
            await self.app(scope, receive, send)
        finally:
            lease.release()


class StrictTransportSecurity:
    """ASGI middleware: every HTTP answer carries ``Strict-Transport-Security`` (HSTS), so a
    browser that once reached us over HTTPS never sends a session cookie over plain HTTP.
    Installed only when the public URL is https (browsers ignore it over HTTP anyway)."""

    def __init__(self, app: Any, max_age: int = 31_536_000) -> None:
        self.app = app
        self.value = f"max-age={max_age}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_hsts(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    h
                    for h in message.get("headers", [])
                    if h[0].lower() != b"strict-transport-security"
                ]
                headers.append((b"strict-transport-security", self.value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_hsts)
