"""``GET /v1/providers``: each provider of the chain with its health, circuit and pause as
every process sees them (``shared.providers.provider_health``, ``shared.ops.livesettings``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from services.api import schema
from services.api.auth import require_key
from services.api.operations import operation
from shared.core.catalog import CATALOG
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.infra.http import Answer
from shared.infra.resources import Resources
from shared.ops.livesettings import SettingsStore, resolve
from shared.providers.provider_health import CircuitState, HealthStore, order, score


@operation(
    "list_providers",
    "Each provider's health, circuit, pause and current rate, as every process sees them",
    schema.ProviderList,
)
async def list_providers(request: Request) -> Response:
    await require_key(request, "read")
    resources: Resources = request.app.state.resources
    return Answer(
        schema.ProviderList.model_validate(
            {"data": await provider_rows(request.app.state.settings, resources.db)}
        )
    )


async def provider_rows(settings: Settings, db: Database) -> list[dict[str, Any]]:
    """Each configured provider as ``GET /v1/providers`` and the operations page show it."""
    scope = settings.amqp.exchange
    live = resolve(await SettingsStore(db, scope).stored(), settings.providers)
    health = HealthStore(db, scope)
    circuits = await health.circuits()
    now = datetime.now(UTC)
    configured = settings.providers.chain_codes
    scores = {code: score(await health.windows(code, now), now) for code in configured}
    states = {code: circuits.get(code, CircuitState()).state for code in configured}
    # The order new work takes (no probe drawn): health within the operator's order.
    running = order(
        live.running_chain(configured),
        {c: s.health for c, s in scores.items()},
        states,
        1.0,
        live.health,
    )
    data: list[dict[str, Any]] = []
    for code in configured:
        scored = scores[code]
        data.append(
            {
                "name": CATALOG[code].name.lower(),
                "code": code,
                "health": scored.health,
                "circuit": states[code],
                "paused": code in live.paused,
                "position": running.index(code) + 1
                if code in running and code not in live.paused
                else None,
                "rate_limit_per_s": live.limits().get(code),
                "current_rate_per_s": scored.rate,
                "latency_seconds": None if scored.latency is None else round(scored.latency, 3),
                "calls_2min": scored.calls,
                "reported_failures": scored.reported_failures,
                "max_recipients": CATALOG[code].max_recipients,
                "max_message_bytes": CATALOG[code].max_message_bytes,
                "capabilities": list(CATALOG[code].capabilities),
            }
        )
    return data
