"""Hostile templates against the real stack (API in process, consumers, RabbitMQ, Cassandra,
sandbox providers): each is refused with the limit it passes named, while a normal template
batch sent at the same time is accepted and delivered, and the renderers go on serving."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from shared.infra.config import Settings, TemplateSettings
from shared.infra.db import Database
from shared.templates.templates import TemplateStore
from tests.integration.harness import eventually
from tests.integration.stack import Stack, emails, fast_settings, full_stack

#: 1,500 strings of a megabyte: 1.46 GB of the API process before the renderers.
MEGABYTES = "".join(f'{{% set a{i} = "x" * 1000000 %}}' for i in range(1500)) + "done"
#: 70,000 printed names: compiling them takes seconds in one C step.
SLOW_TO_COMPILE = "{{ x }}" * 70_000
#: 2**49999 squared 14 times: 6.3 s of one C step before the cap.
SQUARINGS = "{% set v0 = 2**49999 %}" + "".join(
    f"{{% set v{i + 1} = v{i} * v{i} %}}" for i in range(14)
)


#: Limits within each hostile template's reach, the others far away (which one a template
#: passes first must not depend on how busy the machine is).
MEMORY = TemplateSettings(memory_mb=256, cpu_seconds=120, deadline=120)
TIME = TemplateSettings(deadline=2, cpu_seconds=120)


@pytest.fixture
async def stack(
    settings: Settings, db: Database, request: pytest.FixtureRequest
) -> AsyncIterator[Stack]:
    limits: TemplateSettings = request.param
    async with full_stack(
        fast_settings(settings).model_copy(update={"templates": limits}), db
    ) as s:
        yield s


async def _hostile(stack: Stack, text: str) -> str:
    resp = await stack.api.post(
        "/v1/templates",
        json={"name": "hostile", "subject": "s", "text": text, "sample": {"x": 1}},
        headers=stack.auth,
    )
    assert resp.status_code == 201, resp.text
    template_id: str = resp.json()["id"]
    return template_id


async def _welcome(stack: Stack) -> uuid.UUID:
    store = TemplateStore(stack.db)
    tid = await store.create(
        stack.user_id, "welcome", "Hi {{ first_name }}", "<p>Hello {{ first_name }}</p>", None, {}
    )
    template = await store.get(stack.user_id, tid)
    assert template is not None
    await store.publish(template, 1)
    return tid


@pytest.mark.parametrize(
    ("source", "path", "limit", "stack"),
    [
        (MEGABYTES, "publish", "memory", MEMORY),
        (SLOW_TO_COMPILE, "preview", "time", TIME),
        (SQUARINGS, "preview", "integer_size", TemplateSettings()),
    ],
    indirect=["stack"],
)
async def test_a_hostile_template_is_refused_naming_its_limit_while_a_batch_goes_out(
    stack: Stack, source: str, path: str, limit: str
) -> None:
    """The hostile publish or preview is a 422 naming the limit; a template batch sent while
    a renderer works on it is accepted and delivered; the renderers render afterwards."""
    hostile = await _hostile(stack, source)
    welcome = await _welcome(stack)
    pool = stack.api_app.state.template_pool
    to = emails(3)
    body: dict[str, Any] = {"version": 1, "data": {"x": 1}} if path == "preview" else {"version": 1}

    async with stack.consuming():
        refusal = asyncio.create_task(
            stack.api.post(f"/v1/templates/{hostile}/{path}", json=body, headers=stack.auth)
        )
        if limit != "integer_size":  # the others hold a renderer until it is killed
            await eventually(lambda: _true(pool.busy > 0), interval=0.01)
        sent = await stack.api.post(
            "/v1/batches",
            json={
                "from": "Shop <shop@example.com>",
                "to": [{"email": a, "substitutions": {"first_name": a[:3]}} for a in to],
                "template_id": str(welcome),
            },
            headers=stack.auth,
        )
        refused: httpx.Response = await refusal
        assert sent.status_code == 202, sent.text
        logs = await stack.final(sent.json()["batch_id"], 3)

    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["limit"]["name"]) == ("template_does_not_render", limit)
    assert limit in error["message"]
    assert {r["state"] for r in logs.values()} == {"success"}
    assert (await stack.received(to[0]))["subject"] == f"Hi {to[0][:3]}"
    again = await stack.api.post(
        f"/v1/templates/{welcome}/preview",
        json={"data": {"first_name": "Ann"}},
        headers=stack.auth,
    )
    assert (again.status_code, again.json()["subject"]) == (200, "Hi Ann")


async def _true(value: bool) -> bool:
    return value
