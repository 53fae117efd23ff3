"""Control and inspection endpoints under ``/_control`` (for tests and fault injection).

* ``POST /faults`` ``{"provider", "status", "latency_ms", "count", "body", "retry_after",
  "accept", "reset", "webhooks", "share"}`` (``share``: the fraction of calls it applies to);
  ``GET /faults``; ``DELETE /faults[?provider=]``.
* ``GET /messages?to=ADDRESS`` what the address was sent, newest first, as its mailbox shows it.
* ``GET /sends[?email=&recent=&times=1]`` accepted requests and per-recipient counts (with
  ``times=1``, the arrival time of each recent request); ``DELETE /sends``.
* ``GET /webhooks[?wait=seconds]`` webhook delivery counters (optionally once idle).
* ``GET /sendgrid/public-key`` the key that verifies the SendGrid events.
"""

from __future__ import annotations

import math

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sandbox.faults import PROVIDERS, parse_fault
from sandbox.state import state_of
from sandbox.wire import json_response
from shared.core.digits import natural

#: Longest ``?wait=`` accepted by ``GET /_control/webhooks``.
MAX_WAIT = 60.0


def routes() -> list[BaseRoute]:
    """Routes mounted at ``/_control``."""
    return [
        Route("/faults", add_fault, methods=["POST"]),
        Route("/faults", list_faults, methods=["GET"]),
        Route("/faults", clear_faults, methods=["DELETE"]),
        Route("/sends", sends, methods=["GET"]),
        Route("/sends", reset_sends, methods=["DELETE"]),
        Route("/messages", messages, methods=["GET"]),
        Route("/webhooks", webhooks, methods=["GET"]),
        Route("/sendgrid/public-key", public_key, methods=["GET"]),
    ]


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def add_fault(request: Request) -> Response:
    try:
        payload = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return json_response({"error": "the body must be JSON"}, 400)
    fault = parse_fault(payload)
    if isinstance(fault, str):
        return json_response({"error": fault}, 400)
    state_of(request).faults.set(fault)
    return json_response(fault.as_json(), 201)


async def list_faults(request: Request) -> Response:
    return json_response([f.as_json() for f in state_of(request).faults.active()])


async def clear_faults(request: Request) -> Response:
    provider = request.query_params.get("provider")
    if provider is not None and provider not in PROVIDERS:
        return json_response({"error": f"provider must be one of {list(PROVIDERS)}"}, 400)
    return json_response({"cleared": state_of(request).faults.clear(provider)})


async def sends(request: Request) -> Response:
    recent_raw = request.query_params.get("recent")
    recent = natural(recent_raw)
    if recent_raw is not None and recent is None:
        return json_response({"error": "recent must be a non-negative integer"}, 400)
    snapshot = state_of(request).ledger.snapshot(
        email=request.query_params.get("email"),
        recent=recent,
        times=request.query_params.get("times") == "1",
    )
    return json_response(snapshot)


async def messages(request: Request) -> Response:
    """What ``to`` was sent, newest first, as its mailbox would show it."""
    to = request.query_params.get("to")
    if not to:
        return json_response({"error": "to (an address) is required"}, 400)
    return json_response(state_of(request).inbox.of(to))


async def reset_sends(request: Request) -> Response:
    state_of(request).ledger.reset()
    state_of(request).inbox.clear()
    return Response(status_code=204)


async def webhooks(request: Request) -> Response:
    dispatcher = state_of(request).dispatcher
    wait = request.query_params.get("wait")
    if wait is not None:
        try:
            seconds = float(wait)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds):
            return json_response({"error": "wait must be a number of seconds"}, 400)
        await dispatcher.wait_idle(min(max(seconds, 0.0), MAX_WAIT))
    return json_response(dispatcher.snapshot())


async def public_key(request: Request) -> Response:
    return json_response({"public_key": state_of(request).sendgrid_public_key})
