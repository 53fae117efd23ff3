"""The dashboard's Preferences page: what the user's batches get when a request does not say
(open and click tracking, the one-click unsubscribe header) and their cooldown, read and
changed as ``/v1/preferences`` does (the same store, the same ``PreferencesIn`` checks and
:func:`shared.accounts.preferences.patched`): a change applies to the next batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.api.dashboard.pages import checked_form, page, page_user, render, see_other
from services.api.dashboard.views import form_errors
from services.api.schema import PreferencesIn, checked
from services.api.sessions import SessionUser
from shared.accounts.preferences import MAX_COOLDOWN, PreferenceRows, Preferences, patched
from shared.infra.http import ApiError

#: The form's fields; an error about any other part of the body is told above the form.
FIELDS: Final = frozenset({"tracking", "unsubscribe", "cooldown"})
_ON: Final = frozenset({"on", "true", "1"})


def form_values(p: Preferences) -> dict[str, Any]:
    """The form as the stored preferences fill it."""
    return {
        "opens": p.track_opens,
        "clicks": p.track_clicks,
        "unsubscribe": p.unsubscribe,
        "cooldown": str(p.cooldown_seconds),
        "per_category": p.cooldown_per_category,
    }


def submitted(form: Mapping[str, str]) -> dict[str, Any]:
    """The form's values as it was sent (an unticked box is not sent: off)."""
    return {
        "opens": form.get("opens") in _ON,
        "clicks": form.get("clicks") in _ON,
        "unsubscribe": form.get("unsubscribe") in _ON,
        "cooldown": form.get("cooldown", "").strip(),
        "per_category": form.get("per_category") in _ON,
    }


def patch_body(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``PATCH /v1/preferences`` body the form stands for (every field: the form shows
    them all). Raises ApiError 422 for a cooldown that is not a whole number of seconds."""
    raw = str(values["cooldown"]) or "0"
    if not (raw.isascii() and raw.isdecimal()) or len(raw) > 9:
        raise ApiError(
            422,
            "invalid_fields",
            "the cooldown is not valid",
            fields={"cooldown": f"a whole number of seconds, 0 to {MAX_COOLDOWN:,}"},
        )
    return {
        "tracking": {"opens": values["opens"], "clicks": values["clicks"]},
        "unsubscribe": values["unsubscribe"],
        "cooldown": {"seconds": int(raw), "per_category": values["per_category"]},
    }


async def _page(
    request: Request,
    user: SessionUser,
    values: Mapping[str, Any],
    *,
    status: int = 200,
    errors: Mapping[str, list[str]] | None = None,
) -> Response:
    context: dict[str, Any] = {
        "title": "Preferences",
        "active": "preferences",
        "values": values,
        "errors": dict(errors or {}),
        "max_cooldown": MAX_COOLDOWN,
        "notice": "Preferences saved: they apply to your next batch."
        if request.query_params.get("saved") == "1" and not errors
        else None,
    }
    return render(request, "preferences.html", context, status=status)


@page
async def preferences_page(request: Request) -> Response:
    """The form; POST saves it (as ``PATCH /v1/preferences`` does)."""
    user = await page_user(request)
    store: PreferenceRows = request.app.state.preferences
    if request.method != "POST":
        return await _page(request, user, form_values(await store.get(user.user_id, fresh=True)))
    form = await checked_form(request, user)
    values = submitted(form)
    try:
        wanted = checked(PreferencesIn, patch_body(values)).model_dump(exclude_none=True)
    except ApiError as exc:
        errors = form_errors(exc.fields or {}, form_fields=FIELDS) or {"form": [exc.message]}
        return await _page(request, user, values, status=422, errors=errors)
    await store.put(user.user_id, patched(await store.get(user.user_id, fresh=True), wanted))
    return see_other("/preferences", saved=1)


def preference_routes() -> list[BaseRoute]:
    return [
        Route(
            "/preferences",
            preferences_page,
            methods=["GET", "POST"],
            name="dashboard_preferences",
        )
    ]
