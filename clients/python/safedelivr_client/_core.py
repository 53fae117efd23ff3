"""What the sync and async clients share: the answer types, the error, request building and
the retry rule (pure; no I/O here)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import httpx

#: The operations of ``/v1/openapi.json`` and the client method for each.
OPERATIONS: Mapping[str, str] = {
    "create_batch": "send",
    "list_batches": "batches",
    "get_batch": "batch",
    "list_batch_logs": "logs",
    "cancel_batch": "cancel",
    "list_suppressions": "suppressions",
    "create_suppression": "suppress",
    "delete_suppression": "unsuppress",
    "get_stats": "stats",
    "get_preferences": "preferences",
    "update_preferences": "set_preferences",
    "list_keys": "keys",
    "current_key": "current_key",
    "create_key": "create_key",
    "revoke_key": "revoke_key",
    "list_domains": "domains",
    "add_domain": "add_domain",
    "get_domain": "domain",
    "verify_domain": "verify_domain",
    "delete_domain": "remove_domain",
    "list_domain_claims": "domain_claims",
    "create_campaign": "create_campaign",
    "list_campaigns": "campaigns",
    "get_campaign": "campaign",
    "schedule_campaign": "schedule_campaign",
    "pause_campaign": "pause_campaign",
    "resume_campaign": "resume_campaign",
    "cancel_campaign": "cancel_campaign",
    "delete_campaign": "remove_campaign",
    "list_webhooks": "webhooks",
    "create_webhook": "add_webhook",
    "get_webhook": "webhook",
    "update_webhook": "change_webhook",
    "delete_webhook": "remove_webhook",
    "rotate_webhook_secret": "rotate_webhook_secret",
    "list_webhook_deliveries": "webhook_deliveries",
    "replay_webhook_delivery": "replay_webhook_delivery",
    "create_list": "create_list",
    "list_lists": "lists",
    "get_list": "get_list",
    "delete_list": "remove_list",
    "list_list_contacts": "list_contacts",
    "delete_list_contact": "remove_list_contact",
    "import_list_contacts": "import_contacts",
    "get_list_import": "list_import",
    "list_templates": "templates",
    "create_template": "create_template",
    "get_template": "template",
    "delete_template": "remove_template",
    "add_template_version": "add_template_version",
    "delete_template_version": "remove_template_version",
    "publish_template": "publish_template",
    "preview_template": "preview_template",
    "list_providers": "providers",
    "get_settings": "settings",
    "patch_settings": "change_settings",
    "list_dead_letters": "dead_letters",
    "replay_dead_letter": "replay_dead_letter",
    "delete_dead_letter": "delete_dead_letter",
}

#: Statuses the API documents as "retry after Retry-After".
RETRIED = frozenset({429, 503})

Address = str | Mapping[str, str]
Recipient = str | Mapping[str, Any]


class Page(TypedDict):
    data: list[Any]
    next_cursor: str | None


def key_request(name: str, scopes: Sequence[str] | None, expires_at: str | None) -> Request:
    """``POST /v1/keys``: never repeated on a lost answer (a second key would be made)."""
    body: dict[str, Any] = {"name": name}
    if scopes is not None:
        body["scopes"] = list(scopes)
    if expires_at is not None:
        body["expires_at"] = expires_at
    return Request("POST", "/v1/keys", json=body, safe_to_repeat=False)


def import_request(list_id: str, csv: bytes | str) -> Request:
    """``POST /v1/lists/{id}/imports`` with a CSV file (``str`` is sent as UTF-8): never
    repeated on a lost answer (the import may have begun)."""
    data = csv.encode() if isinstance(csv, str) else bytes(csv)
    path = f"/v1/lists/{quoted(list_id)}/imports"
    headers = {"Content-Type": "text/csv"}
    return Request("POST", path, content=data, headers=headers, safe_to_repeat=False)


class ApiError(Exception):
    """An error answer of the API: ``{"error": {"code", "message", "fields"?, "limit"?}}``
    (``limit``: the cap a 409 ``too_many_…`` or 413 ``too_many_contacts`` is about, as
    ``(name, value)``)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        fields: Mapping[str, str] | None = None,
        retry_after: float | None = None,
        limit: tuple[str, int] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.fields = dict(fields or {})
        self.retry_after = retry_after
        self.limit = limit

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        limit = None
        try:
            error = response.json()["error"]
            code, message, fields = error["code"], error["message"], error.get("fields")
            if isinstance(error.get("limit"), dict):
                limit = (str(error["limit"]["name"]), int(error["limit"]["value"]))
        except (ValueError, KeyError, TypeError):
            code, message, fields = "http_error", response.text[:200], None
        return cls(response.status_code, code, message, fields, retry_after(response), limit)


@dataclass(frozen=True)
class Request:
    """One API call, ready for either transport."""

    method: str
    path: str
    params: Mapping[str, str] | None = None
    json: Any = None
    headers: Mapping[str, str] | None = None
    safe_to_repeat: bool = True
    """Whether a connection failure may be retried (reads, and sends with their key)."""
    content: bytes | None = None
    """A raw body (a CSV file), sent instead of ``json``."""


def retry_after(response: httpx.Response) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds form), if any."""
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def wait_before_retry(
    request: Request,
    attempt: int,
    response: httpx.Response | None,
    *,
    max_retries: int,
    max_wait: float,
) -> float | None:
    """Seconds to wait before retry number ``attempt`` (1-based), or None not to retry.

    Retried: an answer the API says to retry after (``429``, ``503``; its ``Retry-After``,
    else a short backoff), and no answer at all (a connection failure). A request that is
    not safe to repeat is retried only after a ``429``, which did nothing."""
    if attempt > max_retries:
        return None
    status = None if response is None else response.status_code
    if status is not None and status not in RETRIED:
        return None
    if not request.safe_to_repeat and status != 429:
        return None
    told = retry_after(response) if response is not None else None
    backoff = min(max_wait, 0.5 * 2 ** (attempt - 1))
    return min(max_wait, told) if told is not None else backoff


def send_request(
    sender: Address,
    to: str | Sequence[Recipient],
    subject: str | None,
    *,
    html: str | None,
    text: str | None,
    idempotency_key: str | None,
    more: Mapping[str, Any],
) -> Request:
    body: dict[str, Any] = {"from": sender, "to": to if isinstance(to, str) else list(to)}
    if subject is not None:  # None: the batch names a template_id (in ``more``)
        body["subject"] = subject
    if html is not None:
        body["html"] = html
    if text is not None:
        body["text"] = text
    body.update(more)
    key = idempotency_key or uuid.uuid4().hex
    return Request("POST", "/v1/batches", json=body, headers={"Idempotency-Key": key})


#: Campaign steps the API answers alike when repeated (a second pause finds it paused); a
#: repeated schedule or resume is a 409, so a lost answer to one is not retried.
REPEATABLE_STEPS = frozenset({"pause", "cancel"})


def campaign_step(campaign_id: str, step: str, send_at: str | None = None) -> Request:
    """``POST /v1/campaigns/{id}/{step}`` (schedule, pause, resume, cancel)."""
    body = {"send_at": send_at} if send_at is not None else None
    path = f"/v1/campaigns/{quoted(campaign_id)}/{step}"
    return Request("POST", path, json=body, safe_to_repeat=step in REPEATABLE_STEPS)


def campaign_request(body: Mapping[str, Any]) -> Request:
    """``POST /v1/campaigns``: never repeated on a lost answer (it would make a second
    draft)."""
    return Request("POST", "/v1/campaigns", json=dict(body), safe_to_repeat=False)


def version_body(
    subject: str, html: str | None, text: str | None, sample: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A template version's fields, as ``POST /v1/templates`` and ``.../versions`` take."""
    body: dict[str, Any] = {"subject": subject}
    if html is not None:
        body["html"] = html
    if text is not None:
        body["text"] = text
    if sample is not None:
        body["sample"] = dict(sample)
    return body


def publish_request(template_id: str, version: int, canary_percent: float | None) -> Request:
    body: dict[str, Any] = {"version": version}
    if canary_percent is not None:
        body["canary_percent"] = canary_percent
    return Request("POST", f"/v1/templates/{quoted(template_id)}/publish", json=body)


def preview_request(
    template_id: str, data: Mapping[str, Any] | None, version: int | None
) -> Request:
    body: dict[str, Any] = {}
    if data is not None:
        body["data"] = dict(data)
    if version is not None:
        body["version"] = version
    return Request("POST", f"/v1/templates/{quoted(template_id)}/preview", json=body)


def page_params(limit: int | None, cursor: str | None, **more: str | None) -> dict[str, str]:
    params = {k: v for k, v in more.items() if v is not None}
    if limit is not None:
        params["limit"] = str(limit)
    if cursor is not None:
        params["cursor"] = cursor
    return params


def quoted(segment: str) -> str:
    """A path segment (an address, a key id) made safe for the URL.

    Raises:
        ValueError: for an empty segment, ``.`` or ``..``: URL normalisation would drop them
            and send the request to another endpoint (``batch(".")`` to the batch list).
    """
    from urllib.parse import quote

    if segment in ("", ".", ".."):
        raise ValueError(f"{segment!r} is not an id")
    return quote(segment, safe="@")
