"""``/v1/preferences``: each user's defaults for tracking and unsubscribe, and their cooldown."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from services.api import schema
from services.api.auth import require_key
from services.api.operations import operation
from services.api.schema import PreferencesIn, checked
from shared.accounts.preferences import PreferenceRows, patched
from shared.infra.http import Answer, read_json

#: Small JSON bodies only.
SMALL_BODY = 16 * 1024


@operation(
    "get_preferences",
    "Your sending preferences",
    schema.PreferencesView,
    description="What your batches get when a request does not say: open and click "
    "tracking and the one-click unsubscribe header (all off until you turn them on), and "
    "your cooldown: the least time between two mails to one address (0: none). A "
    "recipient inside the cooldown is not sent to; the 202 lists it in `skipped` with the "
    "reason `cooldown`.",
)
async def get_preferences(request: Request) -> Response:
    key = await require_key(request, "read")
    store: PreferenceRows = request.app.state.preferences
    return Answer(
        schema.PreferencesView.model_validate((await store.get(key.user_id, fresh=True)).view())
    )


@operation(
    "update_preferences",
    "Change your sending preferences",
    schema.PreferencesView,
    body=schema.PreferencesIn,
    errors=(400, 413, 415, 422),
    description="Fields left out stay as they are. A change applies to batches accepted "
    "from a few seconds later.",
)
async def patch_preferences(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, SMALL_BODY)
    wanted = checked(PreferencesIn, body).model_dump(exclude_none=True)
    store: PreferenceRows = request.app.state.preferences
    prefs = patched(await store.get(key.user_id, fresh=True), wanted)
    await store.put(key.user_id, prefs)
    return Answer(schema.PreferencesView.model_validate(prefs.view()))
