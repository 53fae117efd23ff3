"""Health, readiness and Prometheus metrics endpoints that every service process exposes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

Check = Callable[[], Awaitable[None]]

log = logging.getLogger(__name__)

#: Seconds one readiness check may take before it counts as failed.
CHECK_TIMEOUT = 3.0


async def run_checks(checks: Mapping[str, Check]) -> dict[str, str]:
    """Run every check concurrently; map each name to ``ok`` or the reason it failed."""

    async def one(check: Check) -> str:
        try:
            await asyncio.wait_for(check(), CHECK_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready", reported
            return f"{type(exc).__name__}: {exc}"[:300]
        return "ok"

    results = await asyncio.gather(*(one(c) for c in checks.values()))
    return dict(zip(checks, results, strict=True))


def health_routes(
    service: str,
    registry: CollectorRegistry,
    checks: Callable[[Request], Mapping[str, Check]],
) -> list[Route]:
    """``/healthz`` (the process is alive), ``/readyz`` (its dependencies answer), ``/metrics``."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "service": service})

    async def readyz(request: Request) -> Response:
        results = await run_checks(checks(request))
        ready = all(v == "ok" for v in results.values())
        for name, reason in results.items():
            if reason != "ok":
                log.warning("%s is not ready: %s is unavailable: %s", service, name, reason)
        # Which dependency is down, never why: exception text can name hosts and users.
        shown = {name: "ok" if v == "ok" else "unavailable" for name, v in results.items()}
        return JSONResponse(
            {"status": "ready" if ready else "unavailable", "service": service, "checks": shown},
            status_code=200 if ready else 503,
        )

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
