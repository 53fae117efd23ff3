"""The dashboard's Webhooks pages: the user's outbound webhook endpoints, each with its
delivery log, through the same use cases as ``/v1/webhooks``
(:class:`services.api.hooks.Webhooks`): create one (URL and event types; its signing secret
shown once), change its URL or events, disable or enable it, rotate its secret (the new one
shown once, the previous one signing for a day more), delete it, and replay a message from
its log. Another user's endpoint is a 404, as in the API."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.api.dashboard.pages import (
    checked_form,
    page,
    page_user,
    render,
    see_other,
)
from services.api.dashboard.views import fmt_time, form_errors, iso
from services.api.hooks import Webhooks
from services.api.schema import WebhookIn, WebhookPatch, checked
from services.api.sessions import SessionUser
from shared.infra.http import ApiError
from shared.outbound.hook_queue import Delivery
from shared.outbound.hook_store import Endpoint
from shared.outbound.user_hooks import EVENT_TYPES

#: Lines of the delivery log a page shows (newest first; the API's default).
LOG_SHOWN: Final = 50
#: A checkbox per event type is named this prefix and the type.
EVENT_FIELD: Final = "event:"
_FIELDS: Final = frozenset({"url", "events"})
_NOTICES: Final = {
    "saved": "The endpoint was changed.",
    "disabled": "The endpoint is disabled: events wait for it (a day at most) until it is "
    "enabled again.",
    "enabled": "The endpoint is enabled: its failures are cleared and what waited is sent now.",
    "deleted": "The endpoint was deleted.",
    "replayed": "The message is queued to be delivered once more.",
    "joined": "That message was already waiting to be delivered again: this replay is that one.",
}


@dataclass(frozen=True, slots=True)
class EndpointRow:
    endpoint_id: str
    url: str
    events: str
    """``every event``, or the types it receives, comma-separated."""
    chosen: frozenset[str]
    """The types ticked on its form (none: every type)."""
    enabled: bool
    state: str
    tone: str
    reason: str | None
    disabled: str
    disabled_iso: str
    failing: str
    failing_iso: str
    failures: int
    secret_hint: str
    created: str
    created_iso: str


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    msg_id: str
    type: str
    attempt: int
    status: str
    tone: str
    error: str | None
    duration: str
    at: str
    at_iso: str
    replay: bool
    """Whether this line carries the message's replay button (its newest line only)."""


def endpoint_row(e: Endpoint) -> EndpointRow:
    if not e.enabled:
        state, tone = "Disabled", "bad"
    elif e.health.failing_since is not None:
        state, tone = "Failing", "warn"
    else:
        state, tone = "Enabled", "ok"
    return EndpointRow(
        endpoint_id=str(e.endpoint_id),
        url=e.url,
        events=", ".join(sorted(e.events)) if e.events else "every event",
        chosen=e.events,
        enabled=e.enabled,
        state=state,
        tone=tone,
        reason=e.disabled_reason if not e.enabled else None,
        disabled=fmt_time(e.disabled_at),
        disabled_iso=iso(e.disabled_at),
        failing=fmt_time(e.health.failing_since),
        failing_iso=iso(e.health.failing_since),
        failures=e.health.failures,
        secret_hint=e.secret[:10] + "…",
        created=fmt_time(e.created_at),
        created_iso=iso(e.created_at),
    )


def delivery_rows(log: Iterable[Delivery]) -> list[DeliveryRow]:
    """The log's lines as the page shows them; a message's newest line carries its replay."""
    seen: set[str] = set()
    rows = []
    for d in log:
        ok = d.status is not None and 200 <= d.status < 300
        rows.append(
            DeliveryRow(
                msg_id=d.msg_id,
                type=d.type,
                attempt=d.attempt,
                status=str(d.status) if d.status is not None else "no answer",
                tone="ok" if ok else "bad",
                error=d.error,
                duration=f"{d.duration_ms:,} ms",
                at=fmt_time(d.at),
                at_iso=iso(d.at),
                replay=d.msg_id not in seen,
            )
        )
        seen.add(d.msg_id)
    return rows


def chosen_events(form: Mapping[str, str]) -> list[str]:
    """The ticked event types, in the catalogue's order (none ticked: every type)."""
    return [t for t in EVENT_TYPES if form.get(EVENT_FIELD + t)]


def done_notice(params: Mapping[str, str]) -> str | None:
    return _NOTICES.get(params.get("done", ""))


# --------------------------------------------------------------------------- handlers


def _errors(exc: ApiError) -> dict[str, list[str]]:
    errors = form_errors(exc.fields or {}, form_fields=_FIELDS)
    return errors or {"form": [exc.message]}


async def _list_page(
    request: Request, user: SessionUser, *, status: int = 200, **extra: Any
) -> Response:
    found = await Webhooks.of(request).store.endpoints(user.user_id)
    context: dict[str, Any] = {
        "title": "Webhooks",
        "active": "webhooks",
        "rows": [endpoint_row(e) for e in found],
        "event_types": EVENT_TYPES,
        "errors": {},
        "values": {"url": "", "events": frozenset[str]()},
        "notice": done_notice(request.query_params),
    }
    context.update(extra)
    return render(request, "webhooks.html", context, status=status)


@page
async def webhooks_page(request: Request) -> Response:
    """The user's endpoints; POST creates one and shows its secret once."""
    user = await page_user(request)
    if request.method != "POST":
        return await _list_page(request, user)
    form = await checked_form(request, user)
    events = chosen_events(form)
    url = form.get("url", "").strip()
    hooks = Webhooks.of(request)
    try:
        created = await hooks.create(
            user.user_id, checked(WebhookIn, {"url": url, "events": events})
        )
    except ApiError as exc:
        if exc.status not in (409, 422):
            raise
        values = {"url": url, "events": frozenset(events)}
        return await _list_page(
            request, user, status=exc.status, errors=_errors(exc), values=values
        )
    return _secret_page(request, created, rotated=False)


def _secret_page(request: Request, endpoint: Endpoint, *, rotated: bool) -> Response:
    now = datetime.now(UTC)
    previous = endpoint.previous_until if rotated and endpoint.previous_until else None
    return render(
        request,
        "webhook_secret.html",
        {
            "title": "Webhook signing secret",
            "active": "webhooks",
            "e": endpoint_row(endpoint),
            "secret": endpoint.secret,
            "rotated": rotated,
            "previous_until": fmt_time(previous) if previous and previous > now else None,
        },
        status=200 if rotated else 201,
    )


async def _detail_page(
    request: Request,
    user: SessionUser,
    endpoint: Endpoint,
    *,
    status: int = 200,
    **extra: Any,
) -> Response:
    hooks = Webhooks.of(request)
    log = await hooks.queue.deliveries(
        endpoint.endpoint_id, datetime.now(UTC).date(), limit=LOG_SHOWN
    )
    row = endpoint_row(endpoint)
    context: dict[str, Any] = {
        "title": f"Webhook {endpoint.url}",
        "active": "webhooks",
        "e": row,
        "log": delivery_rows(log),
        "shown": LOG_SHOWN,
        "event_types": EVENT_TYPES,
        "errors": {},
        "values": {"url": endpoint.url, "events": endpoint.events},
        "problem": None,
        "replay_key": uuid.uuid4().hex,
        "notice": done_notice(request.query_params),
    }
    context.update(extra)
    return render(request, "webhook.html", context, status=status)


def _endpoint_id(request: Request) -> str:
    raw: str = request.path_params["endpoint_id"]
    return raw


@page
async def webhook_page(request: Request) -> Response:
    """One endpoint and its delivery log; POST changes it (``action``: save, disable,
    enable)."""
    user = await page_user(request)
    hooks = Webhooks.of(request)
    endpoint = await hooks.owned(user.user_id, _endpoint_id(request))
    if request.method != "POST":
        return await _detail_page(request, user, endpoint)
    form = await checked_form(request, user)
    action = form.get("action", "")
    if action in ("disable", "enable"):
        await hooks.change(
            user.user_id,
            _endpoint_id(request),
            WebhookPatch.model_validate({"enabled": action == "enable"}),
        )
        return see_other(f"/webhooks/{endpoint.endpoint_id}", done=action + "d")
    if action != "save":
        raise ApiError(400, "bad_form", "save, disable or enable?")
    url, events = form.get("url", "").strip(), chosen_events(form)
    try:
        patch = checked(WebhookPatch, {"url": url, "events": events})
        await hooks.change(user.user_id, _endpoint_id(request), patch)
    except ApiError as exc:
        if exc.status != 422:
            raise
        values = {"url": url, "events": frozenset(events)}
        return await _detail_page(
            request, user, endpoint, status=422, errors=_errors(exc), values=values
        )
    return see_other(f"/webhooks/{endpoint.endpoint_id}", done="saved")


@page
async def rotate_secret(request: Request) -> Response:
    """A new signing secret, shown once; the previous one signs too for a day."""
    user = await page_user(request)
    await checked_form(request, user)
    rotated = await Webhooks.of(request).rotate(user.user_id, _endpoint_id(request))
    return _secret_page(request, rotated, rotated=True)


@page
async def delete_webhook(request: Request) -> Response:
    user = await page_user(request)
    await checked_form(request, user)
    await Webhooks.of(request).remove(user.user_id, _endpoint_id(request))
    return see_other("/webhooks", done="deleted")


@page
async def replay(request: Request) -> Response:
    """Deliver one message of the log once more (the form's key makes a double submit the
    same replay, as ``Idempotency-Key`` does in the API)."""
    user = await page_user(request)
    form = await checked_form(request, user)
    hooks = Webhooks.of(request)
    raw_id = _endpoint_id(request)
    key = form.get("replay_key", "")
    try:
        answer = await hooks.replay(
            user.user_id,
            raw_id,
            form.get("msg_id", ""),
            f"dashboard-{key}" if key.isalnum() and len(key) <= 64 else None,
        )
    except ApiError as exc:
        if exc.status != 409:
            raise
        endpoint = await hooks.owned(user.user_id, raw_id)
        return await _detail_page(request, user, endpoint, status=409, problem=exc.message)
    return see_other(f"/webhooks/{raw_id}", done="replayed" if answer["queued"] else "joined")


def webhook_routes() -> list[BaseRoute]:
    return [
        Route("/webhooks", webhooks_page, methods=["GET", "POST"], name="dashboard_webhooks"),
        Route(
            "/webhooks/{endpoint_id}",
            webhook_page,
            methods=["GET", "POST"],
            name="dashboard_webhook",
        ),
        Route("/webhooks/{endpoint_id}/rotate", rotate_secret, methods=["POST"]),
        Route("/webhooks/{endpoint_id}/delete", delete_webhook, methods=["POST"]),
        Route("/webhooks/{endpoint_id}/replay", replay, methods=["POST"]),
    ]
