"""Health, readiness and Prometheus metrics endpoints that every service process exposes.

``/healthz`` and ``/readyz`` are open (load balancers and orchestrators probe them without
credentials; ``/readyz`` names a dependency that is down, never why). ``/metrics`` counts what
users do (batches, recipients, errors per provider), so with a token configured it answers
only ``Authorization: Bearer <token>``, compared in constant time.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import SecretStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from shared.infra.http import ApiError, error_response

Check = Callable[[], Awaitable[None]]

log = logging.getLogger(__name__)

#: Seconds one readiness check may take before it counts as failed.
CHECK_TIMEOUT = 3.0


async def run_checks(checks: Mapping[str, Check]) -> dict[str, str]:
    """Run every check concurrently; map each name to ``ok`` or the reason it failed."""

    async def one(check: Check) -> str:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                await check()
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready", reported
            return f"{type(exc).__name__}: {exc}"[:300]
        return "ok"

    results = await asyncio.gather(*(one(c) for c in checks.values()))
    return dict(zip(checks, results, strict=True))


def health_routes(
    service: str,
    registry: CollectorRegistry,
    checks: Callable[[Request], Mapping[str, Check]],
    metrics_token: SecretStr | None = None,
) -> list[Route]:
    """``/healthz`` (the process is alive), ``/readyz`` (its dependencies answer), ``/metrics``
    (behind ``metrics_token`` when there is one)."""

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
        if metrics_token is not None and not bearer_matches(
            request.headers.get("authorization"), metrics_token.get_secret_value()
        ):
            return error_response(
                ApiError(
                    401,
                    "unauthorized",
                    "/metrics needs Authorization: Bearer <SAFEDELIVR_METRICS_TOKEN>",
                    headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
                )
            )
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header is ``Bearer <token>`` (constant-time compare)."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())
