"""``Client`` (sync) and ``AsyncClient``: the same methods over ``httpx``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, cast

import httpx

from ._core import (
    Address,
    ApiError,
    Page,
    Recipient,
    Request,
    campaign_request,
    campaign_step,
    import_request,
    key_request,
    page_params,
    preview_request,
    publish_request,
    quoted,
    send_request,
    version_body,
    wait_before_retry,
)
from ._types import Accepted, BatchItem, KeyCreated, KeyView, LogEntry, StatsDay

_USER_AGENT = "safedelivr-client/0.1"


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}", "User-Agent": _USER_AGENT}


def _result(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise ApiError.from_response(response)
    return None if response.status_code == 204 else response.json()


class Client:
    """The Safedelivr API, synchronously. Use as a context manager (or call ``close``)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_wait: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, transport=transport
        )
        self.max_retries = max_retries
        self.max_wait = max_wait

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, request: Request) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(
                    request.method,
                    request.path,
                    params=request.params,
                    json=request.json,
                    content=request.content,
                    headers=request.headers,
                )
            except httpx.TransportError:
                wait = wait_before_retry(
                    request, attempt, None, max_retries=self.max_retries, max_wait=self.max_wait
                )
                if wait is None:
                    raise
            else:
                wait = wait_before_retry(
                    request, attempt, response, max_retries=self.max_retries, max_wait=self.max_wait
                )
                if wait is None:
                    return _result(response)
            time.sleep(wait)

    # -- batches

    def send(
        self,
        sender: Address,
        to: str | Sequence[Recipient],
        subject: str | None = None,
        *,
        html: str | None = None,
        text: str | None = None,
        idempotency_key: str | None = None,
        **more: Any,
    ) -> Accepted:
        """Submit a batch (``POST /v1/batches``). ``more`` takes the other fields: ``cc``,
        ``bcc``, ``reply_to``, ``headers``, ``bulk``, ``priority``, ``categories``, ``metadata``,
        ``tracking``, ``unsubscribe``, ``list`` (pass it as ``**{"list": name}``), ``send_at``,
        ``attachments`` (``AttachmentIn`` dicts: ``filename``, ``content_type``, base64
        ``content``), and ``template_id``, ``version``, ``data`` for a template batch (no
        subject then)."""
        request = send_request(
            sender,
            to,
            subject,
            html=html,
            text=text,
            idempotency_key=idempotency_key,
            more=more,
        )
        return cast(Accepted, self._call(request))

    def batches(self, *, limit: int | None = None, cursor: str | None = None) -> Page:
        return cast(Page, self._call(Request("GET", "/v1/batches", page_params(limit, cursor))))

    def iter_batches(self) -> Iterator[BatchItem]:
        cursor: str | None = None
        while True:
            page = self.batches(cursor=cursor)
            yield from page["data"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def batch(self, batch_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._call(Request("GET", f"/v1/batches/{quoted(batch_id)}")))

    def cancel(self, batch_id: str) -> dict[str, Any]:
        """Cancel a scheduled batch before its ``send_at`` (409 once it started)."""
        request = Request("POST", f"/v1/batches/{quoted(batch_id)}/cancel")
        return cast(dict[str, Any], self._call(request))

    def logs(
        self,
        batch_id: str,
        *,
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page:
        params = page_params(limit, cursor, state=state)
        return cast(
            Page, self._call(Request("GET", f"/v1/batches/{quoted(batch_id)}/logs", params))
        )

    def iter_logs(self, batch_id: str, *, state: str | None = None) -> Iterator[LogEntry]:
        cursor: str | None = None
        while True:
            page = self.logs(batch_id, state=state, cursor=cursor)
            yield from page["data"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    # -- stats, suppressions, keys

    def stats(self, *, start: str | None = None, end: str | None = None) -> list[StatsDay]:
        params = page_params(None, None, **{"from": start, "to": end})
        return cast(list[StatsDay], self._call(Request("GET", "/v1/stats", params))["data"])

    def suppressions(
        self, *, limit: int | None = None, cursor: str | None = None, list: str | None = None
    ) -> Page:
        """Your suppressions, or with ``list`` that list's own (one-click unsubscribes)."""
        params = page_params(limit, cursor, list=list)
        return cast(Page, self._call(Request("GET", "/v1/suppressions", params)))

    def suppress(self, email: str, reason: str = "manual") -> dict[str, str]:
        body = {"email": email, "reason": reason}
        return cast(dict[str, str], self._call(Request("POST", "/v1/suppressions", json=body)))

    def unsuppress(self, email: str, *, list: str | None = None) -> None:
        params = page_params(None, None, list=list)
        self._call(Request("DELETE", f"/v1/suppressions/{quoted(email)}", params))

    def preferences(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._call(Request("GET", "/v1/preferences")))

    def set_preferences(self, **changes: Any) -> dict[str, Any]:
        """``tracking={"opens": ..., "clicks": ...}``, ``unsubscribe=...``,
        ``cooldown={"seconds": ..., "per_category": ...}``; others stay as they are."""
        request = Request("PATCH", "/v1/preferences", json=changes)
        return cast(dict[str, Any], self._call(request))

    def keys(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self._call(Request("GET", "/v1/keys"))["data"])

    def domains(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self._call(Request("GET", "/v1/domains"))["data"])

    def add_domain(self, domain: str) -> dict[str, Any]:
        """Add a sending domain: publish the ``record`` it answers, then verify it."""
        body = {"domain": domain}
        return cast(dict[str, Any], self._call(Request("POST", "/v1/domains", json=body)))

    def domain(self, domain: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._call(Request("GET", f"/v1/domains/{quoted(domain)}")))

    def verify_domain(self, domain: str) -> dict[str, Any]:
        request = Request("POST", f"/v1/domains/{quoted(domain)}/verify")
        return cast(dict[str, Any], self._call(request))

    def remove_domain(self, domain: str) -> None:
        self._call(Request("DELETE", f"/v1/domains/{quoted(domain)}"))

    def domain_claims(self, domain: str) -> list[dict[str, Any]]:
        """Every account's claim on ``domain``, its parents and subdomains (an operator key)."""
        request = Request("GET", f"/v1/domain-claims/{quoted(domain)}")
        return cast(list[dict[str, Any]], self._call(request)["data"])

    def create_campaign(
        self,
        name: str,
        template_id: str,
        list_id: str,
        sender: Address,
        **more: Any,
    ) -> dict[str, Any]:
        """A draft campaign; ``more``: ``data``, ``rate``, ``send_at``. Not repeated after a
        lost answer (it could make a second draft): list the campaigns to find out."""
        body = {"name": name, "template_id": template_id, "list_id": list_id, "from": sender}
        return cast(dict[str, Any], self._call(campaign_request({**body, **more})))

    def campaigns(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._call(Request("GET", "/v1/campaigns")))

    def campaign(self, campaign_id: str) -> dict[str, Any]:
        request = Request("GET", f"/v1/campaigns/{quoted(campaign_id)}")
        return cast(dict[str, Any], self._call(request))

    def schedule_campaign(self, campaign_id: str, send_at: str | None = None) -> dict[str, Any]:
        return self._campaign_step(campaign_id, "schedule", send_at)

    def pause_campaign(self, campaign_id: str) -> dict[str, Any]:
        return self._campaign_step(campaign_id, "pause")

    def resume_campaign(self, campaign_id: str) -> dict[str, Any]:
        return self._campaign_step(campaign_id, "resume")

    def cancel_campaign(self, campaign_id: str) -> dict[str, Any]:
        return self._campaign_step(campaign_id, "cancel")

    def remove_campaign(self, campaign_id: str) -> None:
        """Delete a draft, or a campaign that was sent or cancelled (frees its place)."""
        self._call(Request("DELETE", f"/v1/campaigns/{quoted(campaign_id)}"))

    def _campaign_step(
        self, campaign_id: str, step: str, send_at: str | None = None
    ) -> dict[str, Any]:
        return cast(dict[str, Any], self._call(campaign_step(campaign_id, step, send_at)))

    def webhooks(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self._call(Request("GET", "/v1/webhooks"))["data"])

    def add_webhook(self, url: str, events: Sequence[str] | None = None) -> dict[str, Any]:
        """Add an endpoint; keep the ``secret`` it answers (shown only now) to verify
        deliveries. ``events`` omitted: every event type."""
        body: dict[str, Any] = {"url": url, "events": list(events or ())}
        request = Request("POST", "/v1/webhooks", json=body, safe_to_repeat=False)
        return cast(dict[str, Any], self._call(request))

    def webhook(self, endpoint_id: str) -> dict[str, Any]:
        return cast(
            dict[str, Any], self._call(Request("GET", f"/v1/webhooks/{quoted(endpoint_id)}"))
        )

    def change_webhook(self, endpoint_id: str, **changes: Any) -> dict[str, Any]:
        """Change ``url``, ``events`` or ``enabled`` (enabling sends what waited)."""
        request = Request("PATCH", f"/v1/webhooks/{quoted(endpoint_id)}", json=changes)
        return cast(dict[str, Any], self._call(request))

    def remove_webhook(self, endpoint_id: str) -> None:
        self._call(Request("DELETE", f"/v1/webhooks/{quoted(endpoint_id)}"))

    def rotate_webhook_secret(self, endpoint_id: str) -> dict[str, Any]:
        """A new ``secret`` (shown only now); the previous one signs too for 24 h."""
        request = Request(
            "POST", f"/v1/webhooks/{quoted(endpoint_id)}/rotate", safe_to_repeat=False
        )
        return cast(dict[str, Any], self._call(request))

    def webhook_deliveries(self, endpoint_id: str, limit: int = 50) -> list[dict[str, Any]]:
        request = Request(
            "GET", f"/v1/webhooks/{quoted(endpoint_id)}/deliveries", {"limit": str(limit)}
        )
        return cast(list[dict[str, Any]], self._call(request)["data"])

    def replay_webhook_delivery(
        self, endpoint_id: str, msg_id: str, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Deliver a message once more (requests while one waits join it; the same
        ``idempotency_key`` within a day is the same replay)."""
        path = f"/v1/webhooks/{quoted(endpoint_id)}/deliveries/{quoted(msg_id)}/replay"
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return cast(dict[str, Any], self._call(Request("POST", path, headers=headers)))

    # -- contact lists

    def create_list(self, name: str) -> dict[str, Any]:
        request = Request("POST", "/v1/lists", json={"name": name}, safe_to_repeat=False)
        return cast(dict[str, Any], self._call(request))

    def lists(self) -> list[dict[str, Any]]:
        """Your lists, newest first, with counts and each one's latest import."""
        return cast(list[dict[str, Any]], self._call(Request("GET", "/v1/lists"))["data"])

    def get_list(self, list_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._call(Request("GET", f"/v1/lists/{quoted(list_id)}")))

    def remove_list(self, list_id: str) -> None:
        """Delete a list with its contacts and imports (frees its place)."""
        self._call(Request("DELETE", f"/v1/lists/{quoted(list_id)}"))

    def list_contacts(
        self, list_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page:
        request = Request(
            "GET", f"/v1/lists/{quoted(list_id)}/contacts", page_params(limit, cursor)
        )
        return cast(Page, self._call(request))

    def remove_list_contact(self, list_id: str, email: str) -> None:
        self._call(Request("DELETE", f"/v1/lists/{quoted(list_id)}/contacts/{quoted(email)}"))

    def import_contacts(self, list_id: str, csv: bytes | str) -> dict[str, Any]:
        """Start importing a CSV file into a list (202); follow it with :meth:`list_import`."""
        return cast(dict[str, Any], self._call(import_request(list_id, csv)))

    def list_import(self, list_id: str, import_id: str) -> dict[str, Any]:
        """An import's state, progress and problems (with their rows)."""
        path = f"/v1/lists/{quoted(list_id)}/imports/{quoted(import_id)}"
        return cast(dict[str, Any], self._call(Request("GET", path)))

    def templates(self) -> list[dict[str, Any]]:
        """Your templates, with the live version and any canary."""
        return cast(list[dict[str, Any]], self._call(Request("GET", "/v1/templates"))["data"])

    def create_template(
        self,
        name: str,
        subject: str,
        *,
        html: str | None = None,
        text: str | None = None,
        sample: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A template with its version 1 (Jinja2 sources; ``sample`` must render before a
        version may be published)."""
        body = {"name": name, **version_body(subject, html, text, sample)}
        request = Request("POST", "/v1/templates", json=body, safe_to_repeat=False)
        return cast(dict[str, Any], self._call(request))

    def template(self, template_id: str) -> dict[str, Any]:
        """A template and its versions, newest first."""
        request = Request("GET", f"/v1/templates/{quoted(template_id)}")
        return cast(dict[str, Any], self._call(request))

    def remove_template(self, template_id: str) -> None:
        """Delete a template with its versions (frees its place)."""
        self._call(Request("DELETE", f"/v1/templates/{quoted(template_id)}"))

    def remove_template_version(self, template_id: str, version: int) -> None:
        """Delete a version that is neither live nor in canary (frees its place)."""
        self._call(Request("DELETE", f"/v1/templates/{quoted(template_id)}/versions/{version}"))

    def add_template_version(
        self,
        template_id: str,
        subject: str,
        *,
        html: str | None = None,
        text: str | None = None,
        sample: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A new immutable version; its ``version`` number is in the answer."""
        body = version_body(subject, html, text, sample)
        path = f"/v1/templates/{quoted(template_id)}/versions"
        return cast(
            dict[str, Any], self._call(Request("POST", path, json=body, safe_to_repeat=False))
        )

    def publish_template(
        self, template_id: str, version: int, *, canary_percent: float | None = None
    ) -> dict[str, Any]:
        """Make ``version`` live (an older one: a rollback), or with ``canary_percent`` its
        canary beside the live version."""
        return cast(
            dict[str, Any], self._call(publish_request(template_id, version, canary_percent))
        )

    def preview_template(
        self,
        template_id: str,
        data: Mapping[str, Any] | None = None,
        *,
        version: int | None = None,
    ) -> dict[str, Any]:
        """``subject``, ``html`` and ``text`` of a version (default: the live one) rendered
        with ``data`` (default: its sample)."""
        return cast(dict[str, Any], self._call(preview_request(template_id, data, version)))

    def providers(self) -> list[dict[str, Any]]:
        """Each provider's health, circuit, pause and current rate."""
        return cast(list[dict[str, Any]], self._call(Request("GET", "/v1/providers"))["data"])

    def settings(self) -> dict[str, Any]:
        """The live settings in force and the latest changes (an operator key)."""
        return cast(dict[str, Any], self._call(Request("GET", "/v1/settings")))

    def change_settings(self, providers: Mapping[str, Any]) -> dict[str, Any]:
        """Change live settings, e.g. ``{"sendgrid": {"paused": True}}`` (an operator key)."""
        request = Request("PATCH", "/v1/settings", json={"providers": dict(providers)})
        return cast(dict[str, Any], self._call(request))

    def dead_letters(self, *, limit: int | None = None, cursor: str | None = None) -> Page:
        """Dead letters, newest first (an operator key)."""
        request = Request("GET", "/v1/dead-letters", page_params(limit, cursor))
        return cast(Page, self._call(request))

    def replay_dead_letter(self, letter_id: str) -> dict[str, Any]:
        """Publish a dead letter again, once (a second replay raises ApiError 409)."""
        request = Request("POST", f"/v1/dead-letters/{quoted(letter_id)}/replay")
        return cast(dict[str, Any], self._call(request))

    def delete_dead_letter(self, letter_id: str) -> None:
        self._call(Request("DELETE", f"/v1/dead-letters/{quoted(letter_id)}"))

    def create_key(
        self,
        name: str,
        *,
        scopes: Sequence[str] | None = None,
        expires_at: str | None = None,
    ) -> KeyCreated:
        """A new key (shown once): ``scopes`` among send, read, keys (never more than this
        client's key holds), ``expires_at`` an RFC 3339 time."""
        return cast(KeyCreated, self._call(key_request(name, scopes, expires_at)))

    def revoke_key(self, key_id: str) -> None:
        self._call(Request("DELETE", f"/v1/keys/{quoted(key_id)}"))

    def current_key(self) -> KeyView:
        """The key this client uses: its id and scopes (any key may ask)."""
        return cast(KeyView, self._call(Request("GET", "/v1/keys/current")))


class AsyncClient:
    """The Safedelivr API for asyncio: the methods of :class:`Client`, awaited."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_wait: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, transport=transport
        )
        self.max_retries = max_retries
        self.max_wait = max_wait

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, request: Request) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(
                    request.method,
                    request.path,
                    params=request.params,
                    json=request.json,
                    content=request.content,
                    headers=request.headers,
                )
            except httpx.TransportError:
                wait = wait_before_retry(
                    request, attempt, None, max_retries=self.max_retries, max_wait=self.max_wait
                )
                if wait is None:
                    raise
            else:
                wait = wait_before_retry(
                    request, attempt, response, max_retries=self.max_retries, max_wait=self.max_wait
                )
                if wait is None:
                    return _result(response)
            await asyncio.sleep(wait)

    async def send(
        self,
        sender: Address,
        to: str | Sequence[Recipient],
        subject: str | None = None,
        *,
        html: str | None = None,
        text: str | None = None,
        idempotency_key: str | None = None,
        **more: Any,
    ) -> Accepted:
        request = send_request(
            sender,
            to,
            subject,
            html=html,
            text=text,
            idempotency_key=idempotency_key,
            more=more,
        )
        return cast(Accepted, await self._call(request))

    async def batches(self, *, limit: int | None = None, cursor: str | None = None) -> Page:
        request = Request("GET", "/v1/batches", page_params(limit, cursor))
        return cast(Page, await self._call(request))

    async def iter_batches(self) -> AsyncIterator[BatchItem]:
        cursor: str | None = None
        while True:
            page = await self.batches(cursor=cursor)
            for item in page["data"]:
                yield item
            cursor = page["next_cursor"]
            if cursor is None:
                return

    async def batch(self, batch_id: str) -> dict[str, Any]:
        request = Request("GET", f"/v1/batches/{quoted(batch_id)}")
        return cast(dict[str, Any], await self._call(request))

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        """Cancel a scheduled batch before its ``send_at`` (409 once it started)."""
        request = Request("POST", f"/v1/batches/{quoted(batch_id)}/cancel")
        return cast(dict[str, Any], await self._call(request))

    async def logs(
        self,
        batch_id: str,
        *,
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page:
        params = page_params(limit, cursor, state=state)
        request = Request("GET", f"/v1/batches/{quoted(batch_id)}/logs", params)
        return cast(Page, await self._call(request))

    async def iter_logs(
        self, batch_id: str, *, state: str | None = None
    ) -> AsyncIterator[LogEntry]:
        cursor: str | None = None
        while True:
            page = await self.logs(batch_id, state=state, cursor=cursor)
            for entry in page["data"]:
                yield entry
            cursor = page["next_cursor"]
            if cursor is None:
                return

    async def stats(self, *, start: str | None = None, end: str | None = None) -> list[StatsDay]:
        params = page_params(None, None, **{"from": start, "to": end})
        return cast(list[StatsDay], (await self._call(Request("GET", "/v1/stats", params)))["data"])

    async def suppressions(
        self, *, limit: int | None = None, cursor: str | None = None, list: str | None = None
    ) -> Page:
        request = Request("GET", "/v1/suppressions", page_params(limit, cursor, list=list))
        return cast(Page, await self._call(request))

    async def suppress(self, email: str, reason: str = "manual") -> dict[str, str]:
        request = Request("POST", "/v1/suppressions", json={"email": email, "reason": reason})
        return cast(dict[str, str], await self._call(request))

    async def unsuppress(self, email: str, *, list: str | None = None) -> None:
        params = page_params(None, None, list=list)
        await self._call(Request("DELETE", f"/v1/suppressions/{quoted(email)}", params))

    async def preferences(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._call(Request("GET", "/v1/preferences")))

    async def set_preferences(self, **changes: Any) -> dict[str, Any]:
        request = Request("PATCH", "/v1/preferences", json=changes)
        return cast(dict[str, Any], await self._call(request))

    async def keys(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], (await self._call(Request("GET", "/v1/keys")))["data"])

    async def domains(self) -> list[dict[str, Any]]:
        found = await self._call(Request("GET", "/v1/domains"))
        return cast(list[dict[str, Any]], found["data"])

    async def add_domain(self, domain: str) -> dict[str, Any]:
        """See :meth:`Client.add_domain`."""
        request = Request("POST", "/v1/domains", json={"domain": domain})
        return cast(dict[str, Any], await self._call(request))

    async def domain(self, domain: str) -> dict[str, Any]:
        request = Request("GET", f"/v1/domains/{quoted(domain)}")
        return cast(dict[str, Any], await self._call(request))

    async def verify_domain(self, domain: str) -> dict[str, Any]:
        request = Request("POST", f"/v1/domains/{quoted(domain)}/verify")
        return cast(dict[str, Any], await self._call(request))

    async def remove_domain(self, domain: str) -> None:
        await self._call(Request("DELETE", f"/v1/domains/{quoted(domain)}"))

    async def domain_claims(self, domain: str) -> list[dict[str, Any]]:
        """See :meth:`Client.domain_claims`."""
        request = Request("GET", f"/v1/domain-claims/{quoted(domain)}")
        return cast(list[dict[str, Any]], (await self._call(request))["data"])

    async def create_campaign(
        self,
        name: str,
        template_id: str,
        list_id: str,
        sender: Address,
        **more: Any,
    ) -> dict[str, Any]:
        """A draft campaign; ``more``: ``data``, ``rate``, ``send_at``. Not repeated after a
        lost answer (it could make a second draft): list the campaigns to find out."""
        body = {"name": name, "template_id": template_id, "list_id": list_id, "from": sender}
        return cast(dict[str, Any], await self._call(campaign_request({**body, **more})))

    async def campaigns(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._call(Request("GET", "/v1/campaigns")))

    async def campaign(self, campaign_id: str) -> dict[str, Any]:
        request = Request("GET", f"/v1/campaigns/{quoted(campaign_id)}")
        return cast(dict[str, Any], await self._call(request))

    async def schedule_campaign(
        self, campaign_id: str, send_at: str | None = None
    ) -> dict[str, Any]:
        return await self._campaign_step(campaign_id, "schedule", send_at)

    async def pause_campaign(self, campaign_id: str) -> dict[str, Any]:
        return await self._campaign_step(campaign_id, "pause")

    async def resume_campaign(self, campaign_id: str) -> dict[str, Any]:
        return await self._campaign_step(campaign_id, "resume")

    async def cancel_campaign(self, campaign_id: str) -> dict[str, Any]:
        return await self._campaign_step(campaign_id, "cancel")

    async def remove_campaign(self, campaign_id: str) -> None:
        await self._call(Request("DELETE", f"/v1/campaigns/{quoted(campaign_id)}"))

    async def _campaign_step(
        self, campaign_id: str, step: str, send_at: str | None = None
    ) -> dict[str, Any]:
        return cast(dict[str, Any], await self._call(campaign_step(campaign_id, step, send_at)))

    async def webhooks(self) -> list[dict[str, Any]]:
        found = await self._call(Request("GET", "/v1/webhooks"))
        return cast(list[dict[str, Any]], found["data"])

    async def add_webhook(self, url: str, events: Sequence[str] | None = None) -> dict[str, Any]:
        """See :meth:`Client.add_webhook`."""
        body: dict[str, Any] = {"url": url, "events": list(events or ())}
        request = Request("POST", "/v1/webhooks", json=body, safe_to_repeat=False)
        return cast(dict[str, Any], await self._call(request))

    async def webhook(self, endpoint_id: str) -> dict[str, Any]:
        request = Request("GET", f"/v1/webhooks/{quoted(endpoint_id)}")
        return cast(dict[str, Any], await self._call(request))

    async def change_webhook(self, endpoint_id: str, **changes: Any) -> dict[str, Any]:
        """See :meth:`Client.change_webhook`."""
        request = Request("PATCH", f"/v1/webhooks/{quoted(endpoint_id)}", json=changes)
        return cast(dict[str, Any], await self._call(request))

    async def remove_webhook(self, endpoint_id: str) -> None:
        await self._call(Request("DELETE", f"/v1/webhooks/{quoted(endpoint_id)}"))

    async def rotate_webhook_secret(self, endpoint_id: str) -> dict[str, Any]:
        """See :meth:`Client.rotate_webhook_secret`."""
        request = Request(
            "POST", f"/v1/webhooks/{quoted(endpoint_id)}/rotate", safe_to_repeat=False
        )
        return cast(dict[str, Any], await self._call(request))

    async def webhook_deliveries(self, endpoint_id: str, limit: int = 50) -> list[dict[str, Any]]:
        request = Request(
            "GET", f"/v1/webhooks/{quoted(endpoint_id)}/deliveries", {"limit": str(limit)}
        )
        return cast(list[dict[str, Any]], (await self._call(request))["data"])

    async def replay_webhook_delivery(
        self, endpoint_id: str, msg_id: str, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """See :meth:`Client.replay_webhook_delivery`."""
        path = f"/v1/webhooks/{quoted(endpoint_id)}/deliveries/{quoted(msg_id)}/replay"
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return cast(dict[str, Any], await self._call(Request("POST", path, headers=headers)))

    # -- contact lists

    async def create_list(self, name: str) -> dict[str, Any]:
        request = Request("POST", "/v1/lists", json={"name": name}, safe_to_repeat=False)
        return cast(dict[str, Any], await self._call(request))

    async def lists(self) -> list[dict[str, Any]]:
        """See :meth:`Client.lists`."""
        found = await self._call(Request("GET", "/v1/lists"))
        return cast(list[dict[str, Any]], found["data"])

    async def get_list(self, list_id: str) -> dict[str, Any]:
        request = Request("GET", f"/v1/lists/{quoted(list_id)}")
        return cast(dict[str, Any], await self._call(request))

    async def list_contacts(
        self, list_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page:
        request = Request(
            "GET", f"/v1/lists/{quoted(list_id)}/contacts", page_params(limit, cursor)
        )
        return cast(Page, await self._call(request))

    async def remove_list(self, list_id: str) -> None:
        await self._call(Request("DELETE", f"/v1/lists/{quoted(list_id)}"))

    async def remove_list_contact(self, list_id: str, email: str) -> None:
        path = f"/v1/lists/{quoted(list_id)}/contacts/{quoted(email)}"
        await self._call(Request("DELETE", path))

    async def import_contacts(self, list_id: str, csv: bytes | str) -> dict[str, Any]:
        """See :meth:`Client.import_contacts`."""
        return cast(dict[str, Any], await self._call(import_request(list_id, csv)))

    async def list_import(self, list_id: str, import_id: str) -> dict[str, Any]:
        """See :meth:`Client.list_import`."""
        path = f"/v1/lists/{quoted(list_id)}/imports/{quoted(import_id)}"
        return cast(dict[str, Any], await self._call(Request("GET", path)))

    async def templates(self) -> list[dict[str, Any]]:
        """See :meth:`Client.templates`."""
        found = await self._call(Request("GET", "/v1/templates"))
        return cast(list[dict[str, Any]], found["data"])

    async def create_template(
        self,
        name: str,
        subject: str,
        *,
        html: str | None = None,
        text: str | None = None,
        sample: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """See :meth:`Client.create_template`."""
        body = {"name": name, **version_body(subject, html, text, sample)}
        request = Request("POST", "/v1/templates", json=body, safe_to_repeat=False)
        return cast(dict[str, Any], await self._call(request))

    async def template(self, template_id: str) -> dict[str, Any]:
        request = Request("GET", f"/v1/templates/{quoted(template_id)}")
        return cast(dict[str, Any], await self._call(request))

    async def remove_template(self, template_id: str) -> None:
        await self._call(Request("DELETE", f"/v1/templates/{quoted(template_id)}"))

    async def remove_template_version(self, template_id: str, version: int) -> None:
        path = f"/v1/templates/{quoted(template_id)}/versions/{version}"
        await self._call(Request("DELETE", path))

    async def add_template_version(
        self,
        template_id: str,
        subject: str,
        *,
        html: str | None = None,
        text: str | None = None,
        sample: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """See :meth:`Client.add_template_version`."""
        body = version_body(subject, html, text, sample)
        path = f"/v1/templates/{quoted(template_id)}/versions"
        request = Request("POST", path, json=body, safe_to_repeat=False)
        return cast(dict[str, Any], await self._call(request))

    async def publish_template(
        self, template_id: str, version: int, *, canary_percent: float | None = None
    ) -> dict[str, Any]:
        """See :meth:`Client.publish_template`."""
        request = publish_request(template_id, version, canary_percent)
        return cast(dict[str, Any], await self._call(request))

    async def preview_template(
        self,
        template_id: str,
        data: Mapping[str, Any] | None = None,
        *,
        version: int | None = None,
    ) -> dict[str, Any]:
        """See :meth:`Client.preview_template`."""
        request = preview_request(template_id, data, version)
        return cast(dict[str, Any], await self._call(request))

    async def providers(self) -> list[dict[str, Any]]:
        """See :meth:`Client.providers`."""
        found = await self._call(Request("GET", "/v1/providers"))
        return cast(list[dict[str, Any]], found["data"])

    async def settings(self) -> dict[str, Any]:
        """See :meth:`Client.settings`."""
        return cast(dict[str, Any], await self._call(Request("GET", "/v1/settings")))

    async def change_settings(self, providers: Mapping[str, Any]) -> dict[str, Any]:
        """See :meth:`Client.change_settings`."""
        request = Request("PATCH", "/v1/settings", json={"providers": dict(providers)})
        return cast(dict[str, Any], await self._call(request))

    async def dead_letters(self, *, limit: int | None = None, cursor: str | None = None) -> Page:
        """See :meth:`Client.dead_letters`."""
        request = Request("GET", "/v1/dead-letters", page_params(limit, cursor))
        return cast(Page, await self._call(request))

    async def replay_dead_letter(self, letter_id: str) -> dict[str, Any]:
        """See :meth:`Client.replay_dead_letter`."""
        request = Request("POST", f"/v1/dead-letters/{quoted(letter_id)}/replay")
        return cast(dict[str, Any], await self._call(request))

    async def delete_dead_letter(self, letter_id: str) -> None:
        await self._call(Request("DELETE", f"/v1/dead-letters/{quoted(letter_id)}"))

    async def create_key(
        self,
        name: str,
        *,
        scopes: Sequence[str] | None = None,
        expires_at: str | None = None,
    ) -> KeyCreated:
        """See :meth:`Client.create_key`."""
        return cast(KeyCreated, await self._call(key_request(name, scopes, expires_at)))

    async def revoke_key(self, key_id: str) -> None:
        await self._call(Request("DELETE", f"/v1/keys/{quoted(key_id)}"))

    async def current_key(self) -> KeyView:
        """See :meth:`Client.current_key`."""
        return cast(KeyView, await self._call(Request("GET", "/v1/keys/current")))
