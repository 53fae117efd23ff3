"""The API application: factory, lifespan (connections, outbox relay), routes, error handlers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.api import batches
from services.api.responses import ApiError, error_response
from shared.attempts import AttemptStore
from shared.background import Background
from shared.batchstore import BatchStore
from shared.config import Settings
from shared.errors import DependencyUnavailable
from shared.health import health_routes
from shared.idempotency import IdempotencyStore
from shared.metrics import ApiMetrics, new_registry
from shared.outbox import relay_forever
from shared.resources import open_resources, readiness_checks

log = logging.getLogger(__name__)


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
    return error_response(ApiError(exc.status_code, code, str(exc.detail)))


async def _crash(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(ApiError(500, "internal_error", "internal error; it has been logged"))


def create_app(settings: Settings) -> Starlette:
    registry = new_registry()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_resources(settings, name="safedelivr-api") as res:
            state = app.state
            state.resources = res
            state.batches = BatchStore(res.db)
            state.attempts = AttemptStore(res.db)
            state.idempotency = IdempotencyStore(res.db)
            state.background = Background()
            relay = asyncio.create_task(
                relay_forever(
                    state.batches,
                    res.broker,
                    interval=settings.api.outbox_relay_interval,
                    grace=settings.api.outbox_grace,
                )
            )
            try:
                yield
            finally:
                relay.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await relay
                await state.background.drain()

    routes = [
        Route("/v1/batches", batches.submit, methods=["POST"]),
        Route("/v1/batches", batches.list_batches, methods=["GET"]),
        Route("/v1/batches/{batch_id}", batches.get_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/logs", batches.batch_logs, methods=["GET"]),
        *health_routes(
            "api", registry, lambda request: readiness_checks(request.app.state.resources)
        ),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ApiError: _api_error,
            DependencyUnavailable: _unavailable,
            HTTPException: _http_error,
            Exception: _crash,
        },
    )
    app.state.settings = settings
    app.state.metrics = ApiMetrics.create(registry)
    return app
