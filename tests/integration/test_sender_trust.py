"""What a sender may not do, through the real API, Cassandra and RabbitMQ: set headers that
are ours or that pass for another sender or a receiver's verdict; lift a suppression the
recipient made (their unsubscribe, their complaint); send from a dashboard session faster
than a key may."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.api.session_store import SESSION_COOKIE, SessionStore
from shared.accounts import accounts, ratelimit
from shared.accounts.ratelimit import RatePolicy
from shared.audience.suppressions import SuppressionStore
from shared.delivery.validation import HEADER_RESERVED
from shared.infra.config import CassandraSettings
from shared.infra.db import Database
from tests.conftest import stack_settings, unique
from tests.integration.unhappy import Account, api_client, new_account, with_api

#: One request per 50-second window: a second one within a test is always over the limit.
SLOW = RatePolicy(per_second=0.02, burst=1)

GOOD: dict[str, Any] = {
    "from": "Shop <shop@example.com>",
    "to": ["ann@example.com"],
    "subject": "Hi",
    "text": "Hello",
}


@pytest.fixture(scope="module")
async def client(migrated: CassandraSettings) -> AsyncIterator[httpx.AsyncClient]:
    """One API app for the module: tests never share data (each makes its own users)."""
    async with api_client(stack_settings(migrated, unique("t").replace("_", "-"))) as pair:
        yield pair[1]


@pytest.fixture(scope="module")
async def slow(migrated: CassandraSettings) -> AsyncIterator[httpx.AsyncClient]:
    """An API whose request rate is :data:`SLOW` (per key, and per user on a session)."""
    settings = stack_settings(migrated, unique("t").replace("_", "-"))
    limited = with_api(settings, rate_limit_per_second=SLOW.per_second, rate_burst=SLOW.burst)
    async with api_client(limited) as pair:
        yield pair[1]


@pytest.fixture
async def me(db: Database) -> Account:
    return await new_account(db, "trust")


async def batches_of(client: httpx.AsyncClient, account: Account) -> list[Any]:
    answer = await client.get("/v1/batches", headers=account.auth)
    data: list[Any] = answer.json()["data"]
    return data


@pytest.mark.parametrize(
    "name",
    [
        "Resent-From",
        "Resent-Sender",
        "resent-to",
        "RESENT-MESSAGE-ID",
        "Authentication-Results",
        "ARC-Seal",
        "ARC-Message-Signature",
        "arc-authentication-results",
        "List-Unsubscribe",
        "List-Unsubscribe-Post",
    ],
)
async def test_a_newly_reserved_header_is_a_422_naming_it(
    client: httpx.AsyncClient, me: Account, name: str
) -> None:
    """Each is refused with the error every reserved header gets, and nothing is stored."""
    body = {**GOOD, "headers": {name: "<https://sender.example/x>", "X-Campaign": "spring"}}

    answer = await client.post("/v1/batches", json=body, headers=me.auth)

    assert answer.status_code == 422
    assert answer.json()["error"]["fields"] == {f"headers.{name}": HEADER_RESERVED}
    assert await batches_of(client, me) == []


# --- suppressions the recipient made ---------------------------------------------------------


async def recipients_own(db: Database, me: Account) -> None:
    """Entries as the webhook ingest writes them: an unsubscribe and a complaint (marked),
    one from before marks, a list's one-click unsubscribe, and a bounce."""
    store = SuppressionStore(db)
    await store.add(
        me.user_id,
        "unsub@example.com",
        reason="unsubscribe",
        source="sg",
        by_recipient="unsubscribed",
    )
    await store.add(
        me.user_id,
        "spam@example.com",
        reason="complained",
        source="mg",
        by_recipient="complained",
    )
    await store.add(me.user_id, "old@example.com", reason="spamreport", source="sg")
    await store.add(
        me.user_id,
        "news@example.com",
        reason="one-click unsubscribe",
        source="tracking",
        scope="news",
        by_recipient="unsubscribed",
    )
    await store.add(me.user_id, "bounce@example.com", reason="bounce/bounce", source="sg")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("unsub@example.com", "unsubscribed"),
        ("spam@example.com", "spam"),
        ("old@example.com", "spam"),
        ("news@example.com?list=news", "unsubscribed"),
    ],
)
async def test_a_send_key_deleting_a_suppression_the_recipient_made_is_a_403_naming_why(
    client: httpx.AsyncClient, db: Database, me: Account, path: str, why: str
) -> None:
    """403 ``suppressed_by_recipient`` naming the address and why; it stays listed, marked."""
    await recipients_own(db, me)

    answer = await client.delete(f"/v1/suppressions/{path}", headers=me.auth)

    email, _, query = path.partition("?")
    assert answer.status_code == 403
    error = answer.json()["error"]
    assert error["code"] == "suppressed_by_recipient"
    assert email in error["message"] and why in error["message"]
    listed = await client.get(f"/v1/suppressions?{query}", headers=me.auth)
    (row,) = [r for r in listed.json()["data"] if r["email"] == email]
    assert row["by_recipient"] in ("unsubscribed", "complained")


async def test_a_sender_deletes_their_own_suppressions_and_bounces_an_operator_any(
    client: httpx.AsyncClient, db: Database, me: Account
) -> None:
    """204 for a bounce and an address the sender added; an operator key lifts an
    unsubscribe and a list's too."""
    await recipients_own(db, me)
    added = await client.post(
        "/v1/suppressions", json={"email": "mine@example.com"}, headers=me.auth
    )
    operator = await accounts.create_key(db, me.user_id, "ops", scopes=["send", "operator"])
    as_operator = {"Authorization": f"Bearer {operator}"}

    bounce = await client.delete("/v1/suppressions/bounce@example.com", headers=me.auth)
    mine = await client.delete("/v1/suppressions/mine@example.com", headers=me.auth)
    unsub = await client.delete("/v1/suppressions/unsub@example.com", headers=as_operator)
    listed = await client.delete("/v1/suppressions/news@example.com?list=news", headers=as_operator)

    assert added.status_code == 201
    assert [a.status_code for a in (bounce, mine, unsub, listed)] == [204, 204, 204, 204]
    left = (await client.get("/v1/suppressions", headers=me.auth)).json()["data"]
    assert sorted(r["email"] for r in left) == ["old@example.com", "spam@example.com"]


async def test_re_adding_an_unsubscribed_address_does_not_let_the_sender_lift_it(
    client: httpx.AsyncClient, db: Database, me: Account
) -> None:
    """POST /v1/suppressions over the recipient's entry, then DELETE: still 403."""
    await recipients_own(db, me)

    again = await client.post(
        "/v1/suppressions", json={"email": "old@example.com"}, headers=me.auth
    )
    answer = await client.delete("/v1/suppressions/old@example.com", headers=me.auth)

    assert again.status_code == 201
    assert answer.status_code == 403


async def test_the_dashboard_refuses_to_remove_the_recipients_own_and_says_why(
    client: httpx.AsyncClient, db: Database, me: Account
) -> None:
    """The list shows who may lift it instead of a Remove button; a forged remove is a 403
    page naming why, and the address stays."""
    await recipients_own(db, me)
    csrf = await session_of(client, db, me.user_id)

    page = await client.get("/suppressions")
    answer = await client.post(
        "/suppressions/remove", data={"csrf_token": csrf, "email": "unsub@example.com"}
    )
    client.cookies.clear()

    unsub_row = page.text.split('data-email="unsub@example.com"')[1].split("</tr>")[0]
    bounce_row = page.text.split('data-email="bounce@example.com"')[1].split("</tr>")[0]
    assert "only an operator" in unsub_row and "Remove" not in unsub_row
    assert "Remove" in bounce_row
    assert answer.status_code == 403
    assert "unsub@example.com unsubscribed" in answer.text
    assert "unsub@example.com" in [
        r["email"] for r in (await client.get("/v1/suppressions", headers=me.auth)).json()["data"]
    ]


# --- a dashboard session's request rate --------------------------------------------------------


async def session_of(client: httpx.AsyncClient, db: Database, user_id: uuid.UUID) -> str:
    """A new dashboard session of the user, its cookie set on ``client``; its CSRF token."""
    session_id, csrf = await SessionStore(db).create(user_id)
    client.cookies.set(SESSION_COOKIE, session_id, domain="api.test")
    return csrf


async def fresh_window(margin: float = 10.0) -> None:
    """Wait for the next window of :data:`SLOW` when this one has less than ``margin`` s left."""
    now_ms = time.time_ns() // 1_000_000
    end = (ratelimit.window_index(now_ms, SLOW.window_ms) + 1) * SLOW.window_ms
    if end - now_ms < margin * 1000:
        await asyncio.sleep((end - now_ms) / 1000 + 0.05)


def compose(csrf: str, subject: str) -> dict[str, str]:
    return {
        "csrf_token": csrf,
        "idempotency_key": uuid.uuid4().hex,
        "from": "shop@example.com",
        "to": "ann@example.com",
        "subject": subject,
        "text": "Hello",
    }


async def test_the_send_form_over_the_users_request_rate_is_a_429_saying_how_long_to_wait(
    slow: httpx.AsyncClient, db: Database
) -> None:
    """The dashboard's send is limited like a key: the second batch within the window is a
    429 with Retry-After, the form says to wait and keeps the message, and nothing is sent."""
    me = await new_account(db, "dash_rate")
    csrf = await session_of(slow, db, me.user_id)
    await fresh_window()

    first = await slow.post("/send", data=compose(csrf, "First"), follow_redirects=False)
    second = await slow.post("/send", data=compose(csrf, "Second one"), follow_redirects=False)
    listed = await batches_of(slow, me)

    assert first.status_code == 303
    assert second.status_code == 429
    assert 1 <= int(second.headers["Retry-After"]) <= 50
    assert f"wait {second.headers['Retry-After']} second" in second.text
    assert "Second one" in second.text  # the message is kept in the form
    assert len(listed) == 1


async def test_a_session_on_the_originals_api_shares_the_users_rate_with_the_dashboard(
    slow: httpx.AsyncClient, db: Database
) -> None:
    """``POST /api/batch`` on a session cookie is limited per user: after a send from the
    dashboard, another session of the same user gets 429 with Retry-After in the
    original's error shape; the user's API key keeps its own budget."""
    me = await new_account(db, "api_rate")
    csrf = await session_of(slow, db, me.user_id)
    await fresh_window()
    sent = await slow.post("/send", data=compose(csrf, "Dashboard"), follow_redirects=False)
    await session_of(slow, db, me.user_id)  # another browser of the same user

    form = {"from": "shop@example.com", "to": "bob@example.com", "subject": "Hi", "body": "x"}
    refused = await slow.post("/api/batch", data=form, headers={"Origin": "http://api.test"})
    slow.cookies.clear()
    by_key = await slow.post("/v1/batches", json=GOOD, headers=me.auth)

    assert sent.status_code == 303
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) >= 1
    assert "too many requests" in refused.json()["error"]
    assert by_key.status_code == 202
