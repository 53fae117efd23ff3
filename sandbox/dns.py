"""The DNS stand-in: TXT records published through ``/_control/dns`` and answered in the
JSON format of DNS-over-HTTPS resolvers (``GET /dns-query?name=...&type=TXT`` with
``Accept: application/dns-json``, as Cloudflare's and Google's public resolvers answer), so
domain verification runs the same client against the sandbox and a real resolver.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sandbox.state import state_of
from sandbox.wire import json_response
from sandbox.zone import canonical

#: RCODEs of the answer: 0 NOERROR, 3 NXDOMAIN.
NOERROR, NXDOMAIN = 0, 3
TXT = 16


def doh_answer(name: str, values: list[str]) -> dict[str, object]:
    """A DNS JSON API answer for a TXT question (each string quoted, as resolvers send it)."""
    return {
        "Status": NOERROR if values else NXDOMAIN,
        "TC": False,
        "RD": True,
        "RA": True,
        "AD": False,
        "CD": False,
        "Question": [{"name": f"{canonical(name)}.", "type": TXT}],
        "Answer": [
            {"name": f"{canonical(name)}.", "type": TXT, "TTL": 60, "data": f'"{value}"'}
            for value in values
        ],
    }


def routes() -> list[BaseRoute]:
    """``/dns-query``, mounted at the sandbox's root."""
    return [Route("/dns-query", query, methods=["GET"])]


def control_routes() -> list[BaseRoute]:
    """Mounted under ``/_control``."""
    return [
        Route("/dns", publish, methods=["POST"]),
        Route("/dns", remove, methods=["DELETE"]),
    ]


async def query(request: Request) -> Response:
    name = request.query_params.get("name", "")
    kind = request.query_params.get("type", "A").upper()
    if not name or len(name) > 253:
        return json_response({"error": "name is required (at most 253 characters)"}, 400)
    if kind not in ("TXT", str(TXT)):
        return json_response({"error": "this stand-in answers TXT questions only"}, 400)
    answer = doh_answer(name, state_of(request).dns.lookup(name))
    return Response(orjson.dumps(answer), media_type="application/dns-json")


async def publish(request: Request) -> Response:
    """``{"name": "_safedelivr.example.com", "value": "..."}``: publish one TXT string."""
    try:
        payload = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return json_response({"error": "the body must be JSON"}, 400)
    name, value = (payload.get(k) if isinstance(payload, dict) else None for k in ("name", "value"))
    if not isinstance(name, str) or not isinstance(value, str) or not name or len(value) > 255:
        return json_response({"error": "name and value (at most 255 characters) are needed"}, 400)
    if not state_of(request).dns.publish(name, value):
        return json_response({"error": "too many names published"}, 507)
    return json_response({"name": canonical(name), "values": state_of(request).dns.lookup(name)})


async def remove(request: Request) -> Response:
    name = request.query_params.get("name", "")
    state_of(request).dns.remove(name)
    return json_response({"removed": canonical(name)})
