"""Every ``/v1`` operation answers what ``/v1/openapi.json`` says (real Cassandra and
RabbitMQ): its documented status, and a body its answer model validates."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta

import httpx
from pydantic import BaseModel

from services.api.openapi import OPERATIONS
from services.api.operations import Operation
from services.api.schema import ErrorBody
from shared.accounts import accounts
from shared.accounts.domains import DomainStore
from shared.infra.db import Database
from shared.infra.topology import dispatch_key
from shared.ops.deadletters import DeadLetterStore, letter_of
from shared.outbound.hook_queue import HookQueue, Queued
from shared.templates.templates import TemplateStore
from tests.conftest import unique
from tests.integration.harness import eventually


def _op(operation_id: str) -> Operation:
    return next(op for op in OPERATIONS if op.operation_id == operation_id)


async def _ended(answer: Awaitable[httpx.Response]) -> bool:
    return (await answer).json()["state"] in ("done", "failed")


def _conforms(operation_id: str, resp: httpx.Response) -> None:
    op = _op(operation_id)
    assert resp.status_code == op.status, resp.text
    if op.answer is not None:
        answer = op.answer.model_validate(resp.json())
        assert _undocumented(answer) == [], resp.text


def _undocumented(model: BaseModel, path: str = "") -> list[str]:
    """The keys of an answer its model does not declare (answer models allow extras, for
    clients' sake, so validating alone would not find them)."""
    found = [f"{path}{key}" for key in model.model_extra or {}]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, BaseModel):
                found += _undocumented(item, f"{path}{name}.")
    return found


async def test_every_operation_answers_its_documented_shape(
    api: httpx.AsyncClient, db: Database
) -> None:
    user_id = await accounts.ensure_user(db, unique("doc"))
    auth = {"Authorization": f"Bearer {await accounts.create_key(db, user_id, 'doc')}"}
    seen: set[str] = set()

    async def call(
        operation_id: str,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        **kw: object,
    ) -> httpx.Response:
        resp = await api.request(method, path, headers=auth | (headers or {}), **kw)  # type: ignore[arg-type]
        _conforms(operation_id, resp)
        seen.add(operation_id)
        return resp

    body = {"from": "s@example.com", "to": ["a@example.com"], "subject": "s", "text": "t"}
    batch_id = (await call("create_batch", "POST", "/v1/batches", json=body)).json()["batch_id"]
    await call("list_batches", "GET", "/v1/batches")
    await call("get_batch", "GET", f"/v1/batches/{batch_id}")
    await call("list_batch_logs", "GET", f"/v1/batches/{batch_id}/logs")
    later = {**body, "send_at": (datetime.now(UTC) + timedelta(hours=1)).isoformat()}
    scheduled = (await call("create_batch", "POST", "/v1/batches", json=later)).json()
    await call("cancel_batch", "POST", f"/v1/batches/{scheduled['batch_id']}/cancel")
    await call("create_suppression", "POST", "/v1/suppressions", json={"email": "x@example.com"})
    await call("list_suppressions", "GET", "/v1/suppressions")
    await call("delete_suppression", "DELETE", "/v1/suppressions/x@example.com")
    await call("get_stats", "GET", "/v1/stats")
    await call("get_preferences", "GET", "/v1/preferences")
    prefs = {"tracking": {"clicks": True}, "cooldown": {"seconds": 60}}
    await call("update_preferences", "PATCH", "/v1/preferences", json=prefs)
    await call("create_key", "POST", "/v1/keys", json={"name": "second"})
    keys = (await call("list_keys", "GET", "/v1/keys")).json()["data"]
    await call("current_key", "GET", "/v1/keys/current")
    second = next(k for k in keys if k["name"] == "second")
    await call("revoke_key", "DELETE", f"/v1/keys/{second['key_id']}")
    await call("add_domain", "POST", "/v1/domains", json={"domain": "doc.example.net"})
    await call("list_domains", "GET", "/v1/domains")
    await call("get_domain", "GET", "/v1/domains/doc.example.net")
    await DomainStore(db).mark_verified(user_id, "doc.example.net")  # as its DNS would
    await call("verify_domain", "POST", "/v1/domains/doc.example.net/verify")
    await call("delete_domain", "DELETE", "/v1/domains/doc.example.net")
    hook = {"url": "https://93.184.216.34/hook", "events": ["recipient.delivered"]}
    endpoint = (await call("create_webhook", "POST", "/v1/webhooks", json=hook)).json()["id"]
    await call("list_webhooks", "GET", "/v1/webhooks")
    await call("get_webhook", "GET", f"/v1/webhooks/{endpoint}")
    await call("update_webhook", "PATCH", f"/v1/webhooks/{endpoint}", json={"events": ["*"]})
    await call("rotate_webhook_secret", "POST", f"/v1/webhooks/{endpoint}/rotate")
    await HookQueue(db).enqueue([Queued(uuid.UUID(endpoint), "msg_doc", "recipient.sent", b"{}")])
    await call("list_webhook_deliveries", "GET", f"/v1/webhooks/{endpoint}/deliveries")
    replay = f"/v1/webhooks/{endpoint}/deliveries/msg_doc/replay"
    await call("replay_webhook_delivery", "POST", replay)
    await call("delete_webhook", "DELETE", f"/v1/webhooks/{endpoint}")
    made = await call("create_list", "POST", "/v1/lists", json={"name": "doc"})
    lists_path = f"/v1/lists/{made.json()['id']}"
    await call("list_lists", "GET", "/v1/lists")
    csv = {"Content-Type": "text/csv"}
    started = await call(
        "import_list_contacts",
        "POST",
        f"{lists_path}/imports",
        content=b"email\na@b.co\n",
        headers=csv,
    )
    import_path = f"{lists_path}/imports/{started.json()['import_id']}"
    await eventually(lambda: _ended(api.get(import_path, headers=auth)))
    await call("get_list_import", "GET", import_path)
    await call("get_list", "GET", lists_path)
    await call("list_list_contacts", "GET", f"{lists_path}/contacts")
    await call("delete_list_contact", "DELETE", f"{lists_path}/contacts/a@b.co")
    templates = TemplateStore(db)
    tid = await templates.create(user_id, "doc", "s", None, "t", {})
    template = await templates.get(user_id, tid)
    assert template is not None
    await templates.publish(template, 1)
    draft = {
        "name": "doc",
        "template_id": str(tid),
        "list_id": made.json()["id"],
        "from": "s@example.com",
        "send_at": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
    }
    campaign = (await call("create_campaign", "POST", "/v1/campaigns", json=draft)).json()
    campaign_path = f"/v1/campaigns/{campaign['id']}"
    await call("list_campaigns", "GET", "/v1/campaigns")
    await call("get_campaign", "GET", campaign_path)
    await call("schedule_campaign", "POST", f"{campaign_path}/schedule")
    await call("pause_campaign", "POST", f"{campaign_path}/pause")
    await call("resume_campaign", "POST", f"{campaign_path}/resume")
    await call("cancel_campaign", "POST", f"{campaign_path}/cancel")
    await call("delete_campaign", "DELETE", campaign_path)
    await call("delete_list", "DELETE", lists_path)
    draft_template = {"name": "doc", "subject": "Hi {{ n }}", "text": "t", "sample": {"n": "A"}}
    made = (await call("create_template", "POST", "/v1/templates", json=draft_template)).json()[
        "id"
    ]
    await call("list_templates", "GET", "/v1/templates")
    version = {"subject": "Hello {{ n }}", "html": "<p>x</p>", "sample": {"n": "B"}}
    await call("add_template_version", "POST", f"/v1/templates/{made}/versions", json=version)
    await call("publish_template", "POST", f"/v1/templates/{made}/publish", json={"version": 1})
    canary = {"version": 2, "canary_percent": 10}
    await call("publish_template", "POST", f"/v1/templates/{made}/publish", json=canary)
    await call("get_template", "GET", f"/v1/templates/{made}")
    await call("preview_template", "POST", f"/v1/templates/{made}/preview", json={})
    await call("add_template_version", "POST", f"/v1/templates/{made}/versions", json=version)
    await call("delete_template_version", "DELETE", f"/v1/templates/{made}/versions/3")
    await call("delete_template", "DELETE", f"/v1/templates/{made}")
    await call("list_providers", "GET", "/v1/providers")
    operator = await accounts.create_key(db, user_id, "ops", scopes=("operator",))
    auth = {"Authorization": f"Bearer {operator}"}
    letter = letter_of(dispatch_key("sg", uuid.uuid1()), None, {}, b"{}", datetime.now(UTC))
    await DeadLetterStore(db).archive(letter)
    await call("get_settings", "GET", "/v1/settings")
    patch = {"providers": {"max_attempts": 4}}
    changed = await call("patch_settings", "PATCH", "/v1/settings", json=patch)
    assert changed.json()["announced"] is True  # even with no process listening
    await call("list_dead_letters", "GET", "/v1/dead-letters")
    await call("replay_dead_letter", "POST", f"/v1/dead-letters/{letter.id}/replay")
    await call("delete_dead_letter", "DELETE", f"/v1/dead-letters/{letter.id}")
    await DomainStore(db).add(user_id, "doc.example.net")  # a claim to list
    claims = await call("list_domain_claims", "GET", "/v1/domain-claims/doc.example.net")
    assert [c["user_id"] for c in claims.json()["data"]] == [str(user_id)]

    assert seen == {op.operation_id for op in OPERATIONS}


async def test_errors_are_in_the_documented_envelope(api: httpx.AsyncClient) -> None:
    resp = await api.post("/v1/batches", json={"to": "a@example.com"})

    assert resp.status_code == 401
    ErrorBody.model_validate(resp.json())


async def test_the_document_and_the_docs_page_are_served_without_a_key(
    api: httpx.AsyncClient,
) -> None:
    doc = await api.get("/v1/openapi.json")
    page = await api.get("/v1/docs")

    assert doc.status_code == 200
    assert doc.json()["openapi"] == "3.1.0"
    assert page.status_code == 200
    assert "POST /v1/batches" in page.text
    assert '<script src="http' not in page.text
