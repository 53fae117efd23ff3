"""``GET|PATCH /v1/settings`` (operator keys only): the live settings in force, and changes to
them, audited and announced to every process (``shared.ops.livesettings``)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from services.api import schema
from services.api.auth import require_key
from services.api.operations import operation
from shared.infra.config import Settings
from shared.infra.http import Answer, ApiError, read_json
from shared.infra.resources import Resources
from shared.ops.alerts import vet_sink
from shared.ops.livesettings import (
    SettingsError,
    SettingsStore,
    announce,
    flatten_patch,
    resolve,
    view,
)
from shared.outbound.ssrf import TargetError

SMALL_BODY = 8 * 1024
#: The live setting naming where alerts are posted.
ALERT_SINK = "alerts.webhook_url"


def settings_store(request: Request) -> SettingsStore:
    settings: Settings = request.app.state.settings
    resources: Resources = request.app.state.resources
    return SettingsStore(resources.db, settings.amqp.exchange)


async def _shown(request: Request, store: SettingsStore) -> dict[str, Any]:
    settings: Settings = request.app.state.settings
    live = resolve(await store.stored(), settings.providers)
    return {**view(live), "changes": [c.view() for c in await store.audit(20)]}


@operation(
    "get_settings",
    "The live settings in force, and the latest changes (operator keys)",
    schema.SettingsView,
)
async def get_settings(request: Request) -> Response:
    await require_key(request, "operator")
    return Answer(
        schema.SettingsView.model_validate(await _shown(request, settings_store(request)))
    )


@operation(
    "patch_settings",
    "Change live settings: chain order, pausing a provider, attempts (operator keys)",
    schema.SettingsView,
    body=schema.SettingsPatch,
    errors=(400, 413, 415, 422),
    description="Stored, audited (who, when, old -> new) and announced: every running "
    'process applies the change within a second. `{"providers": {"chain": '
    '["mailgun", "sendgrid"]}}` reorders the chain; `{"providers": '
    '{"sendgrid": {"paused": true}}}` sends everything through the others (with '
    'every provider paused, work waits in the queues); `{"providers": '
    '{"max_attempts": 4}}` bounds attempts per chunk.',
)
async def patch_settings(request: Request) -> Response:
    """Store the changes, then announce them: every process applies them within a second
    (each also reloads every 30 s, should an announcement be lost)."""
    key = await require_key(request, "operator")
    _, body = await read_json(request, SMALL_BODY)
    try:
        changes = flatten_patch(body)
    except SettingsError as exc:
        raise ApiError(
            422, "invalid_fields", "the settings are not valid", fields=exc.fields
        ) from None
    announced = await change_settings(request, changes, by=f"key:{key.key_id}")
    return Answer(
        schema.SettingsView.model_validate(
            {**await _shown(request, settings_store(request)), "announced": announced}
        )
    )


async def change_settings(request: Request, changes: dict[str, str], *, by: str) -> bool:
    """Store and announce ``changes`` (the API's and the dashboard's use case); False when
    the announcement could not be sent (every process still applies them within 30 s).
    An alert sink our servers may not post to is a 422 (``shared.ops.alerts.vet_sink``)."""
    resources: Resources = request.app.state.resources
    sink = changes.get(ALERT_SINK)
    if sink:
        guard = request.app.state.settings.alerts
        try:
            await vet_sink(sink, allow_http=guard.allow_http, allowed=guard.networks)
        except TargetError as exc:
            raise ApiError(
                422,
                "invalid_fields",
                f"{ALERT_SINK} is refused: {exc}",
                fields={ALERT_SINK: str(exc)},
            ) from None
    return await announce(resources.broker, await settings_store(request).change(changes, by=by))
