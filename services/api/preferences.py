"""``/v1/preferences``: each user's defaults for tracking and unsubscribe, and their cooldown."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from services.api.auth import require_key
from services.api.schema import PreferencesIn, checked
from shared.accounts.preferences import PreferenceRows, patched
from shared.infra.http import JSON, read_json

#: Small JSON bodies only.
SMALL_BODY = 16 * 1024


async def get_preferences(request: Request) -> Response:
    key = await require_key(request, "read")
    store: PreferenceRows = request.app.state.preferences
    return JSON((await store.get(key.user_id, fresh=True)).view())


async def patch_preferences(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, SMALL_BODY)
    wanted = checked(PreferencesIn, body).model_dump(exclude_none=True)
    store: PreferenceRows = request.app.state.preferences
    prefs = patched(await store.get(key.user_id, fresh=True), wanted)
    await store.put(key.user_id, prefs)
    return JSON(prefs.view())
