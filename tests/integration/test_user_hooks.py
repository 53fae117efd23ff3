"""Users' outbound webhooks end to end on real RabbitMQ and Cassandra: the API creates an
endpoint at the sandbox receiver, the emitter queues events, the hooks process delivers
them signed, in order, through failures, and disables an endpoint that stays down."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import orjson

from services.api.session_store import SESSION_COOKIE, SessionStore
from shared.accounts import accounts
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.ops.alerts import SYSTEM_LOGIN
from shared.outbound.ssrf import NAME_REFUSED
from tests.integration.harness import client_for, eventually
from tests.integration.hookstack import event, hook_stack, hooks_settings


def _ids(received: list[dict[str, object]]) -> list[str]:
    return [str(r["headers"]["webhook-id"]) for r in received]  # type: ignore[index]


def _emails(received: list[dict[str, object]]) -> list[tuple[str, int]]:
    out = []
    for r in received:
        body = orjson.loads(str(r["body"]))
        out.append((body["data"]["email"], body["data"]["attempt"]))
    return out


async def test_a_signed_event_reaches_the_receiver_and_verifies(
    settings: Settings, db: Database
) -> None:
    """The delivery carries the three headers and verifies with the secret from the 201."""
    async with hook_stack(settings, db) as stack:
        created = await stack.endpoint("/signed")

        sent = event("recipient.delivered", "ann@example.com")
        assert await stack.emitter.emit(stack.user_id, [sent]) == 1
        (got,) = await stack.until_received("/signed", 1)
        assert stack.hooks_app is not None
        async with client_for(stack.hooks_app) as hooks:
            metrics = (await hooks.get("/metrics")).text

    assert created["secret"].startswith("whsec_") and created["enabled"] is True
    assert got["verified"] is True
    assert got["headers"]["content-type"] == "application/json"
    body = orjson.loads(got["body"])
    assert body["type"] == "recipient.delivered"
    assert body["data"]["email"] == "ann@example.com"
    assert 'safedelivr_user_webhook_attempts_total{result="ok"} 1.0' in metrics


async def test_events_of_a_recipient_arrive_in_order_of_occurrence(
    settings: Settings, db: Database
) -> None:
    """Emitted one after another, a second apart, delivered in that order."""
    async with hook_stack(settings, db) as stack:
        await stack.endpoint("/ordered")
        kinds = ["recipient.deferred", "recipient.sent", "recipient.attempt"]
        start = datetime.now(UTC) - timedelta(seconds=20)
        for n in range(9):
            at = start + timedelta(seconds=n)
            ev = event(kinds[n % 3], "bob@example.com", n, occurred_at=at)
            await stack.emitter.emit(stack.user_id, [ev])
        got = await stack.until_received("/ordered", 9)

    assert [attempt for _, attempt in _emails(got)] == list(range(9))


async def test_a_receiver_down_for_a_while_gets_everything_later_in_order_once(
    settings: Settings, db: Database
) -> None:
    """Three failures, then the events arrive: none lost, none twice, in order."""
    async with hook_stack(settings, db) as stack:
        created = await stack.endpoint("/down")
        await stack.control.post(
            "/_control/receiver/fail", json={"path": "/down", "status": 503, "count": 3}
        )
        for n in range(5):
            await stack.emitter.emit(stack.user_id, [event("recipient.sent", "cy@example.com", n)])
        got = await stack.until_received("/down", 5, timeout=60)
        await stack.until_settled(created["id"])  # nothing more comes
        final = await stack.received("/down")
        failed = [r for r in await stack.received("/down", ok_only=False) if r["status"] != 200]

    assert [attempt for _, attempt in _emails(final)] == list(range(5))
    assert len(set(_ids(final))) == 5 == len(final)
    assert len(failed) == 3
    assert set(_ids(failed)) == {_ids(got)[0]}  # the head was retried, nothing overtook it


async def test_an_endpoint_that_stays_down_is_disabled_shown_and_mailed_once(
    settings: Settings, db: Database
) -> None:
    """After the limit: disabled with a reason in GET /v1/webhooks, one mail to the user."""
    limits = hooks_settings(disable_after=0, disable_min_failures=3, delays="1,1,1,1,1")
    async with hook_stack(settings, db, hooks=limits) as stack:
        created = await stack.endpoint("/dead")
        await stack.control.post("/_control/receiver/fail", json={"path": "/dead", "status": 500})
        await stack.emitter.emit(stack.user_id, [event("recipient.bounced", "dee@example.com")])

        async def disabled() -> dict[str, object] | None:
            found = (await stack.api.get("/v1/webhooks", headers=stack.auth)).json()["data"]
            return found[0] if not found[0]["enabled"] else None

        shown = await eventually(disabled, timeout=30)
        await asyncio.sleep(2.5)  # no more attempts once disabled
        attempts = len(await stack.received("/dead", ok_only=False))
        mails = await _mails_about(db, created["id"])
        session_id, _ = await SessionStore(db).create(stack.user_id)
        stack.api.cookies.set(SESSION_COOKIE, session_id, domain="api.test")
        dashboard = await stack.api.get("/")

    assert shown["id"] == created["id"]
    assert shown["disabled_reason"] and "3 deliveries in a row failed" in str(
        shown["disabled_reason"]
    )
    assert attempts == 3
    assert mails == ["Your Safedelivr webhook endpoint was disabled"]
    assert dashboard.status_code == 200
    assert f'data-webhook-disabled="{created["id"]}"' in dashboard.text


async def test_a_replay_repeated_with_its_key_is_delivered_once_with_the_same_webhook_id(
    settings: Settings, db: Database
) -> None:
    """Two requests with one Idempotency-Key at once: one replay, delivered once, same id."""
    async with hook_stack(settings, db) as stack:
        created = await stack.endpoint("/replay")
        await stack.emitter.emit(stack.user_id, [event("recipient.opened", "eve@example.com")])
        (first,) = await stack.until_received("/replay", 1)
        msg_id = first["headers"]["webhook-id"]
        path = f"/v1/webhooks/{created['id']}/deliveries/{msg_id}/replay"
        headers = {**stack.auth, "Idempotency-Key": "replay-1"}

        one, two = await asyncio.gather(
            stack.api.post(path, headers=headers), stack.api.post(path, headers=headers)
        )
        await stack.until_received("/replay", 2)
        await stack.until_settled(created["id"])  # nothing more comes
        again = await stack.api.post(path, headers=headers)
        await stack.until_settled(created["id"])
        got = await stack.received("/replay")
        log = (
            await stack.api.get(f"/v1/webhooks/{created['id']}/deliveries", headers=stack.auth)
        ).json()["data"]

    assert {one.status_code, two.status_code, again.status_code} == {202}
    assert one.json()["replay_id"] == two.json()["replay_id"] == again.json()["replay_id"]
    assert _ids(got) == [msg_id, msg_id]
    assert [entry["status"] for entry in log] == [200, 200]


async def test_replays_asked_for_while_one_waits_join_it(settings: Settings, db: Database) -> None:
    """The endpoint fails, so the first replay waits: the second joins it; once the
    endpoint answers again the message is delivered once more, not twice."""
    async with hook_stack(settings, db) as stack:
        created = await stack.endpoint("/joined")
        await stack.emitter.emit(stack.user_id, [event("recipient.opened", "flo@example.com")])
        (first,) = await stack.until_received("/joined", 1)
        msg_id = first["headers"]["webhook-id"]
        path = f"/v1/webhooks/{created['id']}/deliveries/{msg_id}/replay"
        await stack.control.post(
            "/_control/receiver/fail", json={"path": "/joined", "status": 503, "count": 2}
        )

        one = await stack.api.post(path, headers=stack.auth)
        two = await stack.api.post(path, headers=stack.auth)
        await stack.until_received("/joined", 2)
        await stack.until_settled(created["id"])  # nothing more comes
        got = await stack.received("/joined")

    assert (one.json()["queued"], two.json()["queued"]) == (True, False)
    assert one.json()["replay_id"] == two.json()["replay_id"]
    assert _ids(got) == [msg_id, msg_id]


async def test_an_internal_url_is_refused_at_creation(settings: Settings, db: Database) -> None:
    """A private address is a 422 naming the URL's problem, even where http is allowed."""
    async with hook_stack(settings, db, worker=False) as stack:
        answer = await stack.api.post(
            "/v1/webhooks", json={"url": "http://10.1.2.3/hook"}, headers=stack.auth
        )
        unknown = await stack.api.post(
            "/v1/webhooks",
            json={"url": "https://93.184.216.34/", "events": ["recipient.exploded"]},
            headers=stack.auth,
        )

    assert answer.status_code == 422
    assert "not a public address" in answer.json()["error"]["fields"]["url"]
    assert unknown.status_code == 422
    assert "recipient.exploded" in unknown.json()["error"]["fields"]["events"]


async def test_a_name_resolving_inside_is_refused_without_telling_where(
    settings: Settings, db: Database
) -> None:
    """``https://localhost/`` is a 422 that names neither the address the name resolved to
    nor its kind (no DNS oracle), in the same words as a name that does not resolve."""
    closed = hooks_settings(allowed_networks="")
    async with hook_stack(settings, db, hooks=closed, worker=False) as stack:
        inside = await stack.api.post(
            "/v1/webhooks", json={"url": "https://localhost/hook"}, headers=stack.auth
        )
        nowhere = await stack.api.post(
            "/v1/webhooks", json={"url": "https://no-such-host.invalid/hook"}, headers=stack.auth
        )

    assert inside.status_code == 422 and nowhere.status_code == 422
    why = inside.json()["error"]["fields"]["url"]
    assert why == nowhere.json()["error"]["fields"]["url"] == NAME_REFUSED
    for revealing in ("127.0.0.1", "::1", "loopback", "private", "not a public"):
        assert revealing not in inside.text


async def test_the_secret_is_shown_at_creation_and_rotation_only(
    settings: Settings, db: Database
) -> None:
    """Listing shows a hint; rotating answers a new secret and both sign for a while."""
    async with hook_stack(settings, db) as stack:
        created = await stack.endpoint("/rotated")
        listed = (await stack.api.get("/v1/webhooks", headers=stack.auth)).json()["data"]
        rotated = (
            await stack.api.post(f"/v1/webhooks/{created['id']}/rotate", headers=stack.auth)
        ).json()
        await stack.emitter.emit(stack.user_id, [event("recipient.sent", "fay@example.com")])
        (got,) = await stack.until_received("/rotated", 1)

    assert listed[0]["secret"] is None and listed[0]["secret_hint"].startswith("whsec_")
    assert rotated["secret"] != created["secret"]
    assert rotated["previous_secret_expires_at"] is not None
    assert len(got["headers"]["webhook-signature"].split(" ")) == 2
    assert got["verified"] is True  # with the old secret, registered at creation


async def test_a_user_has_at_most_the_cap_of_endpoints(settings: Settings, db: Database) -> None:
    """One over the cap is a 409."""
    async with hook_stack(settings, db, hooks=hooks_settings(max_endpoints=2), worker=False) as s:
        answers = [
            await s.api.post(
                "/v1/webhooks", json={"url": f"https://93.184.216.34/{n}"}, headers=s.auth
            )
            for n in range(3)
        ]

    assert [a.status_code for a in answers] == [201, 201, 409]


async def test_an_endpoint_of_another_user_is_not_found(settings: Settings, db: Database) -> None:
    """Ids of other users' endpoints are 404s."""
    async with hook_stack(settings, db, worker=False) as stack:
        other = await accounts.ensure_user(db, f"other-{uuid.uuid4().hex[:8]}")
        theirs = await stack.store.create(other, "https://93.184.216.34/", frozenset(), _now())
        answer = await stack.api.get(f"/v1/webhooks/{theirs.endpoint_id}", headers=stack.auth)

    assert answer.status_code == 404


def _now() -> datetime:
    return datetime.now(UTC)


async def _mails_about(db: Database, endpoint_id: str) -> list[str]:
    """Subjects of the system account's mail this month that name the endpoint."""
    system = await accounts.ensure_user(db, SYSTEM_LOGIN)
    rows = await db.rows(
        "SELECT batch_id, subject FROM batches_by_user WHERE user_id = ? AND month = ?",
        (system, _now().strftime("%Y-%m")),
    )
    subjects = []
    for row in rows:
        found = await db.one(
            "SELECT message FROM batches WHERE batch_id = ? LIMIT 1", (row["batch_id"],)
        )
        if found and endpoint_id.encode() in found["message"]:
            subjects.append(row["subject"])
    return subjects


async def test_enabling_a_disabled_endpoint_sends_what_waited(
    settings: Settings, db: Database
) -> None:
    """PATCH ``enabled: true`` clears the failures and the waiting event is delivered."""
    limits = hooks_settings(disable_after=0, disable_min_failures=2, delays="1,1,1,1")
    async with hook_stack(settings, db, hooks=limits) as stack:
        created = await stack.endpoint("/back")
        url = f"/v1/webhooks/{created['id']}"
        await stack.control.post("/_control/receiver/fail", json={"path": "/back", "status": 502})
        await stack.emitter.emit(stack.user_id, [event("recipient.clicked", "ida@example.com")])

        async def disabled() -> bool:
            return not (await stack.api.get(url, headers=stack.auth)).json()["enabled"]

        await eventually(disabled, timeout=30)
        await stack.control.delete("/_control/receiver/fail", params={"path": "/back"})
        enabled = await stack.api.patch(url, json={"enabled": True}, headers=stack.auth)
        (got,) = await stack.until_received("/back", 1)

    assert enabled.status_code == 200
    assert enabled.json()["enabled"] is True and enabled.json()["failures"] == 0
    assert enabled.json()["disabled_reason"] is None
    assert orjson.loads(got["body"])["type"] == "recipient.clicked"
