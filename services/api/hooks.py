"""``/v1/webhooks``: users' outbound webhook endpoints: create (the secret is shown once),
list, read, change, delete, rotate the secret, read the delivery log, replay a message.

:class:`Webhooks` holds the use cases (the dashboard shares them); the handlers parse, call
and answer. A URL is checked when it is set: https (http only where the operator allows it),
no credentials, and a host that resolves to public addresses only (or to the operator's
allowed networks); the worker checks again at every delivery.

Replays: ``POST /v1/webhooks/{id}/deliveries/{msg_id}/replay`` queues the message once more
behind what the endpoint already waits for, under its own webhook-id, and is delivered like
any event (retried, at least once). Exactly one delivery per replay:

* the same request repeated with the same ``Idempotency-Key`` (for a day) is the same replay:
  it answers the first one's ``replay_id`` and never queues again;
* while a replay of a message waits or is being delivered, any other replay request of it
  joins that one (``queued: false`` and its ``replay_id``): a burst of clicks delivers it once;
* a replay requested after the previous one was delivered is delivered again.

The waiting mark lapses after a day, the length of the retries, so a request that failed
half-way never blocks later replays.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from services.api import schema
from services.api.auth import require_key
from services.api.operations import WEBHOOK_ID, Param, operation
from services.api.queries import page_limit
from services.api.schema import WebhookIn, WebhookPatch, checked
from shared.infra.broker import Broker
from shared.infra.config import HooksSettings
from shared.infra.http import Answer, ApiError, read_json
from shared.outbound import ssrf
from shared.outbound.hook_delivery import Resolve, resolve, vet
from shared.outbound.hook_queue import Deliveries, Delivery, HookQueue
from shared.outbound.hook_store import Endpoint, Endpoints, HookStore
from shared.outbound.user_hooks import EventsError, parse_events, shown_events, wake

SMALL_BODY = 8 * 1024
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")


def _when(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def view(e: Endpoint, *, with_secret: bool = False) -> dict[str, Any]:
    now = datetime.now(UTC)
    previous = e.previous_until if e.previous_until and e.previous_until > now else None
    return {
        "id": str(e.endpoint_id),
        "url": e.url,
        "events": shown_events(e.events),
        "enabled": e.enabled,
        "created_at": e.created_at.isoformat(),
        "secret": e.secret if with_secret else None,
        "secret_hint": e.secret[:10] + "…",
        "previous_secret_expires_at": _when(previous),
        "disabled_at": _when(e.disabled_at),
        "disabled_reason": e.disabled_reason,
        "failing_since": _when(e.health.failing_since),
        "failures": e.health.failures,
    }


def delivery_view(d: Delivery) -> dict[str, Any]:
    return {
        "msg_id": d.msg_id,
        "type": d.type,
        "attempt": d.attempt,
        "status": d.status,
        "error": d.error,
        "duration_ms": d.duration_ms,
        "at": d.at.isoformat(),
    }


def _invalid(field: str, why: str) -> ApiError:
    return ApiError(422, "invalid_fields", f"the {field} is not valid", fields={field: why})


@dataclass(frozen=True, slots=True)
class Webhooks:
    """The use cases behind ``/v1/webhooks``: raw values in, endpoints out, or ApiError."""

    store: Endpoints
    queue: Deliveries
    broker: Broker
    settings: HooksSettings
    resolver: Resolve = resolve

    @classmethod
    def of(cls, request: Request) -> Webhooks:
        res = request.app.state.resources
        return cls(
            HookStore(res.db), HookQueue(res.db), res.broker, request.app.state.settings.hooks
        )

    async def checked_url(self, url: str) -> str:
        """``url`` if it may be an endpoint; 422 naming why not."""
        try:
            target = ssrf.parse_target(url, allow_http=self.settings.allow_http)
            await vet(target, self.settings.networks, self.resolver)
        except ssrf.TargetError as exc:
            raise _invalid("url", str(exc)) from None
        return url

    @staticmethod
    def checked_events(events: list[str] | None) -> frozenset[str]:
        try:
            return parse_events(events)
        except EventsError as exc:
            raise _invalid("events", str(exc)) from None

    async def create(self, user_id: uuid.UUID, wanted: WebhookIn) -> Endpoint:
        events = self.checked_events(wanted.events)
        url = await self.checked_url(wanted.url)
        if len(await self.store.endpoints(user_id)) >= self.settings.max_endpoints:
            raise ApiError(
                409,
                "too_many_webhooks",
                f"at most {self.settings.max_endpoints} webhook endpoints per user",
            )
        now = datetime.now(UTC)
        created = await self.store.create(user_id, url, events, now)
        await self.queue.start(created.endpoint_id, now)
        return created

    async def owned(self, user_id: uuid.UUID, raw_id: str) -> Endpoint:
        try:
            endpoint_id = uuid.UUID(raw_id)
        except ValueError:
            raise ApiError(404, "not_found", "no such webhook endpoint") from None
        found = await self.store.endpoint(user_id, endpoint_id)
        if found is None:
            raise ApiError(404, "not_found", "no such webhook endpoint")
        return found

    async def change(self, user_id: uuid.UUID, raw_id: str, patch: WebhookPatch) -> Endpoint:
        endpoint = await self.owned(user_id, raw_id)
        events = self.checked_events(patch.events) if patch.events is not None else None
        url = await self.checked_url(patch.url) if patch.url is not None else None
        changed = await self.store.update(endpoint, url=url, events=events, enabled=patch.enabled)
        if changed.enabled and not endpoint.enabled:
            await self.queue.reset(endpoint.endpoint_id)
            await wake(self.broker, user_id, endpoint.endpoint_id)  # what waited goes now
        return changed

    async def rotate(self, user_id: uuid.UUID, raw_id: str) -> Endpoint:
        """A new signing secret; the previous one signs too for a day."""
        return await self.store.rotate(await self.owned(user_id, raw_id), datetime.now(UTC))

    async def remove(self, user_id: uuid.UUID, raw_id: str) -> None:
        await self.store.delete(await self.owned(user_id, raw_id))

    async def replay(
        self, user_id: uuid.UUID, raw_id: str, msg_id: str, key: str | None = None
    ) -> dict[str, Any]:
        endpoint = await self.owned(user_id, raw_id)
        if not endpoint.enabled:
            raise ApiError(
                409, "webhook_disabled", "the endpoint is disabled: enable it, then replay"
            )
        message = await self.queue.message(endpoint.endpoint_id, msg_id)
        if message is None:
            raise ApiError(404, "not_found", "no such message for this endpoint (kept 30 days)")
        wanted = uuid.uuid1()
        if key is not None:
            earlier = await self.queue.replay_request(endpoint.endpoint_id, msg_id, key, wanted)
            if earlier is not None:
                return {"msg_id": msg_id, "replay_id": str(earlier[0]), "queued": earlier[1]}
        replay_id = await self.queue.claim_replay(endpoint.endpoint_id, msg_id, wanted)
        queued = replay_id == wanted
        if queued:
            await self.queue.enqueue([message])
            await wake(self.broker, user_id, endpoint.endpoint_id)
        if key is not None:
            await self.queue.replay_answered(endpoint.endpoint_id, msg_id, key, replay_id, queued)
        return {"msg_id": msg_id, "replay_id": str(replay_id), "queued": queued}


@operation(
    "list_webhooks",
    "Your webhook endpoints (secrets shown as a hint), disabled ones with the reason",
    schema.WebhookList,
)
async def list_webhooks(request: Request) -> Response:
    key = await require_key(request, "read")
    found = await Webhooks.of(request).store.endpoints(key.user_id)
    return Answer(schema.WebhookList.model_validate({"data": [view(e) for e in found]}))


@operation(
    "create_webhook",
    "Add a webhook endpoint; its signing secret is in this answer only",
    schema.WebhookView,
    status=201,
    body=schema.WebhookIn,
    errors=(400, 409, 413, 415, 422),
    description="Events are signed per Standard Webhooks (`webhook-id`, "
    "`webhook-timestamp`, `webhook-signature`) and delivered in order per endpoint, "
    "retried for about a day. The URL must be https and resolve to public addresses "
    "(422 naming why not; for a host name, the one reason `the host does not resolve, or "
    "resolves to an address that is not publicly routable`, never what it resolved "
    "to); an unknown event type is a 422 naming it; 409 over the cap of endpoints per "
    "user.",
)
async def create_webhook(request: Request) -> Response:
    key = await require_key(request, "keys")
    _, body = await read_json(request, SMALL_BODY)
    created = await Webhooks.of(request).create(key.user_id, checked(WebhookIn, body))
    return Answer(
        schema.WebhookView.model_validate(view(created, with_secret=True)), status_code=201
    )


@operation(
    "get_webhook",
    "One webhook endpoint",
    schema.WebhookView,
    params=(WEBHOOK_ID,),
    errors=(404,),
)
async def get_webhook(request: Request) -> Response:
    key = await require_key(request, "read")
    found = await Webhooks.of(request).owned(key.user_id, request.path_params["endpoint_id"])
    return Answer(schema.WebhookView.model_validate(view(found)))


@operation(
    "update_webhook",
    "Change an endpoint's URL or events, or disable or enable it",
    schema.WebhookView,
    body=schema.WebhookPatch,
    params=(WEBHOOK_ID,),
    errors=(400, 404, 413, 415, 422),
    description="Enabling a disabled endpoint clears its failures and sends what waits.",
)
async def patch_webhook(request: Request) -> Response:
    key = await require_key(request, "keys")
    _, body = await read_json(request, SMALL_BODY)
    patch = checked(WebhookPatch, body)
    hooks = Webhooks.of(request)
    changed = await hooks.change(key.user_id, request.path_params["endpoint_id"], patch)
    return Answer(schema.WebhookView.model_validate(view(changed)))


@operation(
    "delete_webhook",
    "Remove a webhook endpoint",
    None,
    status=204,
    params=(WEBHOOK_ID,),
    errors=(404,),
)
async def delete_webhook(request: Request) -> Response:
    key = await require_key(request, "keys")
    await Webhooks.of(request).remove(key.user_id, request.path_params["endpoint_id"])
    return Response(status_code=204)


@operation(
    "rotate_webhook_secret",
    "A new signing secret (in this answer only); the previous one signs too for 24 h",
    schema.WebhookView,
    params=(WEBHOOK_ID,),
    errors=(404,),
)
async def rotate_webhook(request: Request) -> Response:
    key = await require_key(request, "keys")
    rotated = await Webhooks.of(request).rotate(key.user_id, request.path_params["endpoint_id"])
    return Answer(schema.WebhookView.model_validate(view(rotated, with_secret=True)))


@operation(
    "list_webhook_deliveries",
    "The endpoint's delivery log, newest first (30 days)",
    schema.WebhookDeliveries,
    params=(WEBHOOK_ID, Param("limit", "query", "1-500, default 50.", "integer")),
    errors=(404, 422),
)
async def list_deliveries(request: Request) -> Response:
    key = await require_key(request, "read")
    limit = page_limit(request, default=50, maximum=500)
    hooks = Webhooks.of(request)
    found = await hooks.owned(key.user_id, request.path_params["endpoint_id"])
    log = await hooks.queue.deliveries(found.endpoint_id, datetime.now(UTC).date(), limit=limit)
    # Up to 500 entries: built trusted (validated under tests).
    data = [schema.trusted(schema.WebhookDelivery, delivery_view(d)) for d in log]
    return Answer(schema.WebhookDeliveries(data=data))


@operation(
    "replay_webhook_delivery",
    "Deliver a message once more, under the same webhook-id",
    schema.WebhookReplay,
    status=202,
    params=(
        WEBHOOK_ID,
        Param("msg_id", "path", "The message's webhook-id, from the log.", required=True),
        Param(
            "Idempotency-Key",
            "header",
            "1-255 visible ASCII characters: the same request repeated within a day is "
            "the same replay (its first answer, never a second delivery).",
        ),
    ),
    errors=(400, 404, 409),
    description="Exactly one delivery per replay: while a replay of the message waits, "
    "other requests join it (`queued: false`, its `replay_id`), so a burst of requests "
    "delivers it once; a replay asked for after the previous was delivered is delivered "
    "again. 409 while the endpoint is disabled.",
)
async def replay_delivery(request: Request) -> Response:
    key = await require_key(request, "keys")
    idem = request.headers.get("idempotency-key")
    if idem is not None and not _IDEMPOTENCY_KEY.fullmatch(idem):
        raise ApiError(400, "bad_idempotency_key", "Idempotency-Key must be 1-255 visible ASCII")
    answer = await Webhooks.of(request).replay(
        key.user_id, request.path_params["endpoint_id"], request.path_params["msg_id"], idem
    )
    return Answer(schema.WebhookReplay.model_validate(answer), status_code=202)
