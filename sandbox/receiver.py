"""A catch-all receiver for what Safedelivr sends out (alerts, users' webhooks): any request
to ``/_receiver/<anything>`` is answered 200 and recorded with its raw headers and body;
``GET /_control/received[?path=]`` lists them, oldest first; ``DELETE`` forgets them.
At most :data:`KEPT` requests are kept.

For users' webhooks: ``POST /_control/receiver/secrets {"path", "secret"}`` registers a
Standard Webhooks secret for a path, and each request to it is then recorded with
``"verified": true|false`` (``shared.outbound.outbound_signing.verify``; several secrets may be
registered for one path, as during a rotation). ``POST /_control/receiver/fail {"path",
"status", "count"}`` answers ``status`` to the next ``count`` requests to the path (they are
recorded too, with the status), or until ``DELETE /_control/receiver/fail?path=``; a path
that is down, for a while."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sandbox.wire import json_response
from shared.outbound import outbound_signing

KEPT = 10_000
#: Largest body recorded (the rest is cut; the request is still answered 200).
MAX_BODY = 256 * 1024


@dataclass(slots=True)
class Received:
    """What the receiver was sent."""

    requests: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=KEPT))
    secrets: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    """Signing secrets by path."""
    failing: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    """Paths that fail: (status, requests left, None for until cleared)."""

    def answer(self, path: str) -> int:
        """The status for the next request to ``path`` (using up a failure)."""
        status, left = self.failing.get(path, (200, 0))
        if status == 200:
            return 200
        if left is not None:
            if left <= 1:
                del self.failing[path]
            else:
                self.failing[path] = (status, left - 1)
        return status

    def verified(self, path: str, headers: dict[str, str], body: bytes) -> bool | None:
        """Whether a request verifies with a secret of its path (None: none registered)."""
        secrets = self.secrets.get(path)
        if not secrets:
            return None
        return any(
            outbound_signing.verify(headers, body, s, now=time.time()) is None for s in secrets
        )


def routes() -> list[BaseRoute]:
    """Routes mounted at ``/_receiver``."""
    return [Route("/{path:path}", receive, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])]


def control_routes() -> list[BaseRoute]:
    """Routes mounted at ``/_control``."""
    return [
        Route("/received", received, methods=["GET"]),
        Route("/received", forget, methods=["DELETE"]),
        Route("/receiver/secrets", add_secret, methods=["POST"]),
        Route("/receiver/fail", fail, methods=["POST"]),
        Route("/receiver/fail", recover, methods=["DELETE"]),
    ]


def _store(request: Request) -> Received:
    found: Received = request.app.state.received
    return found


async def receive(request: Request) -> Response:
    body = b""
    async for chunk in request.stream():
        if len(body) < MAX_BODY:
            body += chunk[: MAX_BODY - len(body)]
    store, path, headers = _store(request), "/" + request.path_params["path"], dict(request.headers)
    status = store.answer(path)
    store.requests.append(
        {
            "path": path,
            "method": request.method,
            "headers": headers,
            "body": body.decode("utf-8", "replace"),
            "received_at": time.time(),
            "status": status,
            "verified": store.verified(path, headers, body),
        }
    )
    return json_response({"received": status == 200}, status=status)


async def received(request: Request) -> Response:
    path = request.query_params.get("path")
    found = [r for r in _store(request).requests if path is None or r["path"] == path]
    return json_response(found)


async def forget(request: Request) -> Response:
    _store(request).requests.clear()
    return Response(status_code=204)


async def add_secret(request: Request) -> Response:
    body = await request.json()
    path, secret = body.get("path"), body.get("secret")
    if not isinstance(path, str) or not path.startswith("/") or not isinstance(secret, str):
        return json_response({"error": "give a path (starting with /) and a secret"}, status=422)
    try:
        outbound_signing.key_of(secret)
    except outbound_signing.SecretError as exc:
        return json_response({"error": str(exc)}, status=422)
    _store(request).secrets[path].append(secret)
    return json_response({"path": path, "secrets": len(_store(request).secrets[path])})


async def fail(request: Request) -> Response:
    body = await request.json()
    path, status, count = body.get("path"), body.get("status", 503), body.get("count")
    if (
        not isinstance(path, str)
        or not isinstance(status, int)
        or not 100 <= status <= 599
        or (count is not None and (not isinstance(count, int) or count < 1))
    ):
        return json_response(
            {"error": "give a path, a status (100-599) and a count (omit it: until cleared)"},
            status=422,
        )
    _store(request).failing[path] = (status, count)
    return json_response({"path": path, "status": status, "count": count})


async def recover(request: Request) -> Response:
    _store(request).failing.pop(request.query_params.get("path", ""), None)
    return Response(status_code=204)
