"""Batches made from templates, end to end on real services (API, consumers, RabbitMQ,
Cassandra, sandbox providers and webhooks): each recipient gets the version with their own
values (html-escaped in html), the logs say which version, a canary goes to its stable share,
the judge promotes a canary that does no harm and rolls back one that bounces, and a batch's
canary chunks not yet sent when it is rolled back go with the live version."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from services.consumers.canary_judge import CanaryJudge
from services.consumers.main import judge_of
from shared.delivery.attempts import AttemptStore
from shared.delivery.batchstore import BatchStore
from shared.delivery.recipients import RecipientStore
from shared.delivery.stats import StatsStore
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.templates.canary import Margins, in_canary
from shared.templates.canary_store import CanaryStore
from shared.templates.templates import TemplateStore
from tests.integration.stack import Stack, emails, fast_settings, full_stack

HTML = "<p>Hello {{ first_name }}, from {{ shop }}</p>"


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings), db) as s:
        yield s


async def _template(stack: Stack, *versions: str) -> uuid.UUID:
    """A template whose versions have ``versions`` as subjects, the first one live."""
    store = TemplateStore(stack.db)
    tid = await store.create(stack.user_id, "welcome", versions[0], HTML, None, {})
    template = await store.get(stack.user_id, tid)
    assert template is not None
    for subject in versions[1:]:
        await store.add_version(template, subject, HTML, None, {})
    await store.publish(template, 1)
    return tid


async def _canary(stack: Stack, tid: uuid.UUID, version: int, percent: float) -> None:
    store = TemplateStore(stack.db)
    template = await store.get(stack.user_id, tid)
    assert template is not None
    await store.publish(template, version, canary_percent=percent)


async def _post(stack: Stack, to: list[Any], **body: Any) -> dict[str, Any]:
    resp = await stack.api.post(
        "/v1/batches",
        json={"from": "Shop <shop@example.com>", "to": to, **body},
        headers=stack.auth,
    )
    assert resp.status_code == 202, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def _to(addresses: list[str]) -> list[dict[str, Any]]:
    return [{"email": a, "substitutions": {"first_name": f"<b>{a[:3]}</b>"}} for a in addresses]


async def test_each_recipient_gets_the_live_version_with_their_own_values(stack: Stack) -> None:
    tid = await _template(stack, "Hi {{ first_name }}")
    to = emails(3)

    async with stack.consuming():
        answer = await _post(stack, _to(to), template_id=str(tid), data={"shop": "A & B"})
        got = {a: await stack.received(a) for a in to}
        logs = await stack.final(answer["batch_id"], 3)

    assert answer["template"] == {"id": str(tid), "version": 1, "canary_version": None}
    for address in to:
        name = address[:3]
        assert got[address]["subject"] == f"Hi <b>{name}</b>"  # the subject is not html
        assert got[address]["html"] == f"<p>Hello &lt;b&gt;{name}&lt;/b&gt;, from A &amp; B</p>"
        assert f"Hello <b>{name}</b>, from A & B" in got[address]["text"]  # derived, unescaped
        assert logs[address]["template_version"] == 1


async def test_a_recipient_missing_a_variable_is_a_422_naming_it(stack: Stack) -> None:
    tid = await _template(stack, "Hi")
    to = [*_to(emails(1)), {"email": emails(1)[0]}]

    resp = await stack.api.post(
        "/v1/batches",
        json={"from": "s@example.com", "to": to, "template_id": str(tid), "data": {"shop": "x"}},
        headers=stack.auth,
    )

    assert resp.status_code == 422
    assert "first_name" in resp.json()["error"]["fields"]["to[1].substitutions"]


async def test_an_unknown_or_unpublished_template_is_a_422(stack: Stack) -> None:
    store = TemplateStore(stack.db)
    draft = await store.create(stack.user_id, "draft", "s", "<p>x</p>", None, {})
    for tid in (uuid.uuid1(), draft):
        resp = await stack.api.post(
            "/v1/batches",
            json={"from": "s@example.com", "to": ["a@example.com"], "template_id": str(tid)},
            headers=stack.auth,
        )
        assert resp.status_code == 422, resp.text
        assert "template_id" in resp.json()["error"]["fields"]


async def test_a_template_id_that_is_not_a_time_uuid_is_a_422_naming_it(stack: Stack) -> None:
    """A random or nil UUID cannot be a template id: refused before Cassandra is asked."""
    for tid in (uuid.uuid4(), uuid.UUID(int=0)):
        resp = await stack.api.post(
            "/v1/batches",
            json={"from": "s@example.com", "to": ["a@example.com"], "template_id": str(tid)},
            headers=stack.auth,
        )
        assert resp.status_code == 422, resp.text
        assert "time UUID" in resp.json()["error"]["fields"]["template_id"]


async def test_a_named_version_that_does_not_parse_is_a_422_with_its_error(stack: Stack) -> None:
    """A stored version that does not parse, named by number, answers 422 naming the error."""
    tid = await _template(stack, "Hi", "{{")

    resp = await stack.api.post(
        "/v1/batches",
        json={"from": "s@example.com", "to": _to(emails(1)), "template_id": str(tid), "version": 2},
        headers=stack.auth,
    )

    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["code"] == "template_does_not_render"
    assert "line 1" in resp.json()["error"]["message"]


async def test_a_canary_whose_subject_breaks_a_header_is_a_422(stack: Stack) -> None:
    """The canary's rendered subject is held to the header rules the live one is."""
    tid = await _template(stack, "Hi", "Hi {{ shop }}")
    await _canary(stack, tid, 2, 50.0)

    resp = await stack.api.post(
        "/v1/batches",
        json={
            "from": "s@example.com",
            "to": _to(emails(1)),
            "template_id": str(tid),
            "data": {"shop": "A\r\nBcc: x@example.com"},
        },
        headers=stack.auth,
    )

    assert resp.status_code == 422, resp.text
    assert "version 2" in resp.json()["error"]["fields"]["subject"]


async def test_a_canary_goes_to_its_stable_share_and_the_rest_get_the_live_version(
    stack: Stack,
) -> None:
    tid = await _template(stack, "Old", "New")
    await _canary(stack, tid, 2, 50)
    to = emails(12)

    async with stack.consuming():
        answer = await _post(stack, _to(to), template_id=str(tid), data={"shop": "x"})
        got = {a: await stack.received(a) for a in to}
        logs = await stack.final(answer["batch_id"], len(to))

    for address in to:
        expected = 2 if in_canary(tid, address, 50) else 1
        assert got[address]["subject"] == ("New" if expected == 2 else "Old")
        assert logs[address]["template_version"] == expected
    assert {r["template_version"] for r in logs.values()} == {1, 2}  # both sides had some


def _split(tid: uuid.UUID, percent: float, *, canary_prefix: str, live_prefix: str) -> list[str]:
    """Addresses whose canary side matches their prefix: the sandbox decides each
    recipient's fate by its local part (``bounce…@`` bounces)."""
    out: list[str] = []
    canary = live = 0
    while canary < 6 or live < 6:
        tag = uuid.uuid4().hex[:10]
        for prefix in (canary_prefix, live_prefix):
            address = f"{prefix}{tag}@example.com"
            inside = in_canary(tid, address, percent)
            if inside and prefix == canary_prefix and canary < 6:
                out.append(address)
                canary += 1
            elif not inside and prefix == live_prefix and live < 6:
                out.append(address)
                live += 1
    return out


async def _judged(stack: Stack, tid: uuid.UUID, to: list[str]) -> dict[str, Any]:
    """Send ``to`` from the template, wait for every outcome, and let a judge decide (the
    consumers' own waits the default hour: it must not judge before the outcomes are in)."""
    quick = stack.settings.consumers.model_copy(
        update={"canary_window": 0.1, "canary_min_sent": 4, "canary_margin_bounces": 0.2}
    )
    async with stack.consuming() as consumers:
        answer = await _post(stack, _to(to), template_id=str(tid), data={"shop": "x"})
        await stack.final(answer["batch_id"], len(to))
        res = consumers.state.resources
        stats = StatsStore(res.db, stack.settings.stats.buckets)
        judge = judge_of(
            stack.settings.model_copy(update={"consumers": quick}),
            res,
            BatchStore(res.db, stats),
            RecipientStore(res.db, stats),
        )
        verdicts = await judge.pass_once()
    assert [v.decision for v in verdicts] in (["promote"], ["rollback"]), verdicts
    history = await CanaryStore(stack.db, stack.settings.amqp.exchange).history(tid)
    template = await TemplateStore(stack.db).get(stack.user_id, tid)
    assert template is not None
    return {"history": history, "template": template}


async def test_a_canary_that_bounces_more_is_rolled_back_and_audited(stack: Stack) -> None:
    tid = await _template(stack, "Old", "New")
    await _canary(stack, tid, 2, 50)
    to = _split(tid, 50, canary_prefix="bounce", live_prefix="ok")

    judged = await _judged(stack, tid, to)

    assert judged["template"].live_version == 1  # rolled back
    assert judged["template"].canary_version is None
    [outcome] = judged["history"]
    assert outcome.decision == "rollback"
    assert "hard bounces" in outcome.reason
    assert outcome.canary.hard_bounces == 6 and outcome.live.hard_bounces == 0


async def test_a_canary_that_does_no_harm_is_promoted(stack: Stack) -> None:
    tid = await _template(stack, "Old", "New")
    await _canary(stack, tid, 2, 50)
    to = _split(tid, 50, canary_prefix="ok", live_prefix="fine")

    judged = await _judged(stack, tid, to)

    assert judged["template"].live_version == 2  # promoted
    assert judged["template"].canary_version is None
    [outcome] = judged["history"]
    assert outcome.decision == "promote"


async def test_a_rolled_back_canary_stops_at_once(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch accepted with a canary and not sent yet when the judge rolls the canary back
    (its jobs wait in RabbitMQ, no consumer running) goes out with the live version to every
    recipient, its canary's share too: the sandbox's mailbox shows the live copy, the logs
    version 1 for each, and the send logs name the version per chunk."""
    tid = await _template(stack, "Old", "New")
    await _canary(stack, tid, 2, 50)
    judged = _split(tid, 50, canary_prefix="bounce", live_prefix="ok")
    waiting = _split(tid, 50, canary_prefix="late", live_prefix="fine")
    async with stack.consuming():
        first = await _post(stack, _to(judged), template_id=str(tid), data={"shop": "x"})
        first_logs = await stack.final(first["batch_id"], len(judged))
    later = await _post(stack, _to(waiting), template_id=str(tid), data={"shop": "x"})
    assert later["template"] == {"id": str(tid), "version": 1, "canary_version": 2}

    quick = stack.settings.consumers.model_copy(
        update={"canary_window": 0.1, "canary_min_sent": 4, "canary_margin_bounces": 0.2}
    )
    stats = StatsStore(stack.db, stack.settings.stats.buckets)
    judge = CanaryJudge(
        CanaryStore(stack.db, stack.settings.amqp.exchange),
        TemplateStore(stack.db),
        BatchStore(stack.db, stats),
        RecipientStore(stack.db, stats),
        Margins.of(quick),
        timedelta(seconds=0.1),
        timedelta(hours=1),
        attempts=AttemptStore(stack.db),
    )
    assert [v.decision for v in await judge.pass_once()] == ["rollback"]

    with caplog.at_level(logging.INFO, "services.consumers.calls"):
        async with stack.consuming():
            got = {a: await stack.received(a) for a in waiting}
            logs = await stack.final(later["batch_id"], len(waiting))

    assert any(in_canary(tid, a, 50) for a in waiting)  # the canary's share was in it
    assert {a: m["subject"] for a, m in got.items()} == dict.fromkeys(waiting, "Old")
    assert {a: r["template_version"] for a, r in logs.items()} == dict.fromkeys(waiting, 1)
    sent = [r.getMessage() for r in caplog.records if later["batch_id"] in r.getMessage()]
    assert sent and all("template version 1 (live)" in m for m in sent)
    # The batch the judge counted keeps the versions its recipients were sent.
    assert {a: r["template_version"] for a, r in first_logs.items()} == {
        a: 2 if in_canary(tid, a, 50) else 1 for a in judged
    }
