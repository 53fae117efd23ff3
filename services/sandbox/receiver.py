"""A catch-all receiver for what Safedelivr sends out (alerts, and later users' webhooks):
any request to ``/_receiver/<anything>`` is answered 200 and recorded with its raw headers and
body; ``GET /_control/received[?path=]`` lists them, oldest first; ``DELETE`` forgets them.
At most :data:`KEPT` requests are kept."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.sandbox.wire import json_response

KEPT = 10_000
#: Largest body recorded (the rest is cut; the request is still answered 200).
MAX_BODY = 256 * 1024


@dataclass(slots=True)
class Received:
    """What the receiver was sent."""

    requests: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=KEPT))


def routes() -> list[BaseRoute]:
    """Routes mounted at ``/_receiver``."""
    return [Route("/{path:path}", receive, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])]


def control_routes() -> list[BaseRoute]:
    """Routes mounted at ``/_control``."""
    return [
        Route("/received", received, methods=["GET"]),
        Route("/received", forget, methods=["DELETE"]),
    ]


def _store(request: Request) -> Received:
    found: Received = request.app.state.received
    return found


async def receive(request: Request) -> Response:
    body = b""
    async for chunk in request.stream():
        if len(body) < MAX_BODY:
            body += chunk[: MAX_BODY - len(body)]
    _store(request).requests.append(
        {
            "path": "/" + request.path_params["path"],
            "method": request.method,
            "headers": dict(request.headers),
            "body": body.decode("utf-8", "replace"),
            "received_at": time.time(),
        }
    )
    return json_response({"received": True})


async def received(request: Request) -> Response:
    path = request.query_params.get("path")
    found = [r for r in _store(request).requests if path is None or r["path"] == path]
    return json_response(found)


async def forget(request: Request) -> Response:
    _store(request).requests.clear()
    return Response(status_code=204)
