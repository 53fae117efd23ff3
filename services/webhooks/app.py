"""The webhook service application: factory, lifespan and route table."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette

from shared.config import Settings
from shared.health import health_routes
from shared.metrics import new_registry
from shared.resources import open_resources, readiness_checks


def create_app(settings: Settings) -> Starlette:
    registry = new_registry()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_resources(settings, name="safedelivr-webhooks") as res:
            app.state.resources = res
            yield

    routes = health_routes(
        "webhooks", registry, lambda request: readiness_checks(request.app.state.resources)
    )
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.settings = settings
    return app
