"""Hostile webhook deliveries through the real webhook service, against real Cassandra and
RabbitMQ: correctly signed bodies that are not in the provider's format get a clear 400 and
write nothing (not even part of a delivery, nor a Mailgun token), garbage events beside a
valid one do not stop or corrupt it, and a delivery the provider sends twice counts once. The
tests share one webhook service, each aiming at a batch of its own."""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import SecretStr
from starlette.applications import Starlette

from sandbox import signing
from services.webhooks.app import create_app
from shared.accounts import accounts
from shared.audience.suppressions import SuppressionStore
from shared.core.models import Address, Message, Recipient
from shared.delivery.batchstore import BatchStore, NewBatch
from shared.delivery.precedence import visible
from shared.delivery.recipients import RecipientStore, log_id_for
from shared.delivery.stats import StatsStore, batch_day
from shared.infra.config import Settings, WebhookSettings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.harness import client_for, running

MG_KEY = "hostile-mailgun-signing-key"


@dataclass
class Hostile:
    """One running webhook service and a stored batch of its own to aim events at."""

    client: httpx.AsyncClient
    db: Database
    sg_key: ec.EllipticCurvePrivateKey
    user_id: uuid.UUID
    batch_id: uuid.UUID
    emails: list[str]

    def log_id(self, email: str) -> uuid.UUID:
        return log_id_for(self.batch_id, email)

    def sg_event(self, email: str, event: str = "delivered", **extra: Any) -> dict[str, Any]:
        """A SendGrid event about ``email`` carrying our custom args, as SendGrid echoes them."""
        return {
            "email": email,
            "event": event,
            "timestamp": int(time.time()),
            "sg_event_id": secrets.token_urlsafe(16),
            "sg_message_id": "hostile.filter0001",
            "batch_id": str(self.batch_id),
            "chunk": "0",
            "log_id": str(self.log_id(email)),
            **extra,
        }

    def mg_event(self, email: str, event: str = "delivered", **extra: Any) -> dict[str, Any]:
        """A Mailgun ``event-data`` about ``email`` with our ``user-variables``."""
        return {
            "event": event,
            "id": secrets.token_urlsafe(12),
            "timestamp": time.time(),
            "recipient": email,
            "user-variables": {
                "batch_id": str(self.batch_id),
                "chunk": "0",
                "log_id": str(self.log_id(email)),
            },
            **extra,
        }

    async def post_sendgrid(self, body: bytes) -> httpx.Response:
        """``body`` exactly as given, correctly signed with a fresh timestamp."""
        stamp = str(int(time.time()))
        return await self.client.post(
            "/webhooks/sendgrid",
            content=body,
            headers={
                "X-Twilio-Email-Event-Webhook-Signature": signing.sign_sendgrid(
                    self.sg_key, stamp, body
                ),
                "X-Twilio-Email-Event-Webhook-Timestamp": stamp,
                "Content-Type": "application/json",
            },
        )

    async def post_mailgun(self, body: bytes) -> httpx.Response:
        return await self.client.post(
            "/webhooks/mailgun", content=body, headers={"Content-Type": "application/json"}
        )

    async def state(self, email: str) -> str:
        row = await RecipientStore(self.db).one(self.batch_id, 0, self.log_id(email))
        assert row is not None
        return visible(row).state

    async def timeline(self, email: str) -> list[str]:
        rows = await self.db.rows(
            "SELECT event_id FROM log_events WHERE batch_id = ? AND log_id = ?",
            (self.batch_id, self.log_id(email)),
        )
        return [r["event_id"] for r in rows]

    async def stats(self) -> dict[str, int]:
        return await StatsStore(self.db).day(self.user_id, batch_day(self.batch_id))

    async def token_stored(self, token: str) -> bool:
        row = await self.db.one("SELECT mg_token FROM webhook_tokens WHERE mg_token = ?", (token,))
        return row is not None

    async def orphan_stored(self, provider: str, event_id: str) -> bool:
        row = await self.db.one(
            "SELECT event_id FROM orphan_events WHERE provider = ? AND day = ? AND event_id = ?",
            (provider, datetime.now(UTC).date(), event_id),
        )
        return row is not None

    async def untouched(self) -> bool:
        """Whether no event of this test reached the batch: every recipient still queued,
        no timeline line, no count."""
        for email in self.emails:
            if await self.state(email) != "queued" or await self.timeline(email):
                return False
        stats = await self.stats()
        return not any(stats.get(k) for k in ("success", "failed", "bounced", "opened"))


@dataclass
class Service:
    """The module's running webhook service and the key its SendGrid events are signed with."""

    app: Starlette
    sg_key: ec.EllipticCurvePrivateKey


@pytest.fixture(scope="module")
async def service(module_settings: Settings) -> AsyncIterator[Service]:
    """One webhook service for the module (starting one costs seconds): each test aims at a
    batch of its own, so tests share no data."""
    private = signing.generate_private_key()
    s = module_settings.model_copy(
        update={
            "webhooks": WebhookSettings(
                sendgrid_public_key=signing.public_key_base64(private),
                mailgun_signing_key=SecretStr(MG_KEY),
            )
        }
    )
    app = create_app(s)
    async with running(app):
        yield Service(app, private)


@pytest.fixture
async def hostile(service: Service, db: Database) -> AsyncIterator[Hostile]:
    user_id = await accounts.ensure_user(db, unique("hostile"))
    emails = [f"{n}.{uuid.uuid4().hex[:8]}@example.com" for n in ("ann", "bob", "cat")]
    batch_id = uuid.uuid1()
    recipients = [Recipient(log_id=log_id_for(batch_id, e), email=e) for e in emails]
    message = Message(sender=Address(email="shop@example.com"), subject="s", text="t")
    # Stored and indexed, never published: only this test's events act on it.
    batch = NewBatch(batch_id, user_id, message, recipients, 1000)
    await BatchStore(db).write(batch)
    await BatchStore(db).index(batch)
    async with client_for(service.app) as client:
        yield Hostile(client, db, service.sg_key, user_id, batch_id, emails)


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# Each hostile body carries a perfectly good event for the first recipient (``{ok}``), so a
# parser that applied part of a delivery before refusing the rest would show in the store.
SENDGRID_HOSTILE = {
    "object-not-array": b'{"events": [{ok}]}',
    "truncated": b"[{ok}",
    "trailing-garbage": b"[{ok}] trailing",
    "non-object-item": b"[{ok}, 3]",
    "null-item": b"[{ok}, null]",
    "string-item": b'[{ok}, "{ok}"]',
    "nested-array-item": b"[{ok}, [{ok}]]",
    "nesting-past-the-limit": b"[{ok}, " + _deep(5000) + b"]",
    "byte-order-mark": b"\xef\xbb\xbf[{ok}]",
    "nan": b"[{ok}, NaN]",
    "lone-surrogate": b'[{ok}, {"email": "\\ud800@x.com"}]',
    "invalid-utf8": b'[{ok}, {"email": "\xff\xfe@x.com"}]',
    "two-documents": b"[{ok}][{ok}]",
    "empty": b"",
}


@pytest.mark.parametrize("template", SENDGRID_HOSTILE.values(), ids=SENDGRID_HOSTILE.keys())
async def test_a_signed_sendgrid_body_in_the_wrong_format_is_400_and_writes_nothing(
    hostile: Hostile, template: bytes
) -> None:
    """A correctly signed body that is not a JSON array of objects is refused as a whole."""
    good = orjson.dumps(hostile.sg_event(hostile.emails[0]))
    body = template.replace(b"{ok}", good)

    response = await hostile.post_sendgrid(body)

    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "malformed_body"
    assert await hostile.untouched()


def _envelope(sig: Any, event: Any) -> bytes:
    return orjson.dumps({"signature": sig, "event-data": event})


#: Bodies built from a fresh, valid signature object and a good event, each broken one way.
MAILGUN_HOSTILE: dict[str, Callable[[dict[str, str], dict[str, Any]], bytes]] = {
    "event-data-array": lambda sig, ev: _envelope(sig, [ev]),
    "event-data-string": lambda sig, ev: _envelope(sig, orjson.dumps(ev).decode()),
    "envelope-in-array": lambda sig, ev: orjson.dumps([{"signature": sig, "event-data": ev}]),
    "float-timestamp": lambda sig, ev: _envelope({**sig, "timestamp": float(sig["timestamp"])}, ev),
    "signature-as-string": lambda sig, ev: _envelope(orjson.dumps(sig).decode(), ev),
    "trailing-garbage": lambda sig, ev: _envelope(sig, ev) + b"}",
    "truncated": lambda sig, ev: _envelope(sig, ev)[:-1],
    "nesting-past-the-limit": lambda sig, ev: (
        _envelope(sig, ev)[:-1] + b', "x": ' + _deep(5000) + b"}"
    ),
}


@pytest.mark.parametrize("make", MAILGUN_HOSTILE.values(), ids=MAILGUN_HOSTILE.keys())
async def test_a_signed_mailgun_body_in_the_wrong_format_is_400_and_burns_no_token(
    hostile: Hostile, make: Callable[[dict[str, str], dict[str, Any]], bytes]
) -> None:
    """An envelope that is not Mailgun's is refused before its token is recorded, so the
    genuine delivery with that token is still accepted afterwards."""
    sig = signing.mailgun_signature(MG_KEY, int(time.time()))
    event = hostile.mg_event(hostile.emails[0])

    response = await hostile.post_mailgun(make(sig, event))

    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "malformed_body"
    assert not await hostile.token_stored(sig["token"])
    assert await hostile.untouched()
    genuine = await hostile.post_mailgun(_envelope(sig, event))
    assert (genuine.status_code, genuine.json()["applied"]) == (200, 1)


async def test_an_unsigned_hostile_body_is_refused_before_it_is_read(hostile: Hostile) -> None:
    """Without a signature even a body the parser would choke on is a 401, not a 400."""
    response = await hostile.client.post("/webhooks/sendgrid", content=_deep(5000))

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "bad_signature"


async def test_a_valid_event_among_garbage_events_is_applied_alone(hostile: Hostile) -> None:
    """Objects without a usable address are skipped, objects naming nothing we sent are
    orphans, and the one valid event still settles its recipient."""
    ann, bob, _ = hostile.emails
    orphan_id = f"orphan-{uuid.uuid4().hex}"
    garbage: list[dict[str, Any]] = [
        {},
        {"email": None, "event": "bounce", "batch_id": str(hostile.batch_id)},
        {"email": ["x@y.z"], "event": "delivered"},
        {"email": "no-at-sign", "event": "delivered", "batch_id": str(hostile.batch_id)},
        {"email": 42, "event": {"nested": ["x"]}, "timestamp": "soon"},
        # An address and a wrong-typed batch id: it names no batch of ours.
        {
            "email": "stranger@example.net",
            "event": "bounce",
            "batch_id": 7,
            "sg_event_id": orphan_id,
        },
    ]
    valid = hostile.sg_event(ann)
    events = [*garbage[:3], valid, *garbage[3:]]

    response = await hostile.post_sendgrid(orjson.dumps(events))

    assert response.status_code == 200, response.text
    assert response.json() == {"received": len(events), "applied": 1, "orphans": 1}
    assert (await hostile.state(ann), await hostile.state(bob)) == ("success", "queued")
    assert await hostile.timeline(ann) == [valid["sg_event_id"]]
    assert (await hostile.stats()).get("success") == 1
    assert await hostile.orphan_stored("sg", orphan_id)


async def test_an_event_with_a_log_id_of_another_batch_does_not_touch_ours(
    hostile: Hostile,
) -> None:
    """Our batch id with a log id that names none of its recipients is an orphan: no row is
    created for it, and the real recipient is left alone."""
    ann = hostile.emails[0]
    stray = hostile.sg_event(ann, "bounce", type="bounce", log_id=str(uuid.uuid1()))

    response = await hostile.post_sendgrid(orjson.dumps([stray]))

    assert (response.status_code, response.json()["orphans"]) == (200, 1)
    assert await hostile.untouched()
    assert ann not in await SuppressionStore(hostile.db).suppressed(hostile.user_id, [ann])


async def test_a_chunk_out_of_the_int_range_is_ignored_not_a_crash(hostile: Hostile) -> None:
    """A chunk index no batch can have is ignored like any garbage field: the event is
    placed by its batch and address instead, and the delivery is answered 200."""
    ann, bob, _ = hostile.emails
    events = [hostile.sg_event(ann), hostile.sg_event(bob, chunk=2**40)]

    response = await hostile.post_sendgrid(orjson.dumps(events))

    assert response.status_code == 200, response.text
    assert await hostile.state(ann) == "success"
    assert await hostile.state(bob) == "success"


async def test_an_id_less_event_nested_past_the_encoder_limit_is_not_a_crash(
    hostile: Hostile,
) -> None:
    """A signed delivery whose second event has no sg_event_id and a field nested 300 deep
    is answered with a 2xx or a 4xx, never a 500."""
    good = orjson.dumps(hostile.sg_event(hostile.emails[0]))
    deep = b'{"email": "x@example.net", "event": "open", "x": ' + _deep(300) + b"}"

    response = await hostile.post_sendgrid(b"[" + good + b", " + deep + b"]")

    assert response.status_code < 500, response.text


async def test_the_same_sendgrid_event_twice_in_one_delivery_counts_once(
    hostile: Hostile,
) -> None:
    """SendGrid may repeat an event inside one POST: one timeline line, one count."""
    ann = hostile.emails[0]
    bounce = hostile.sg_event(ann, "bounce", type="bounce", reason="550 5.1.1 unknown user")

    response = await hostile.post_sendgrid(orjson.dumps([bounce, bounce]))

    assert response.status_code == 200, response.text
    assert await hostile.timeline(ann) == [bounce["sg_event_id"]]
    stats = await hostile.stats()
    assert (stats.get("failed"), stats.get("bounced")) == (1, 1)


async def test_a_redelivery_without_event_ids_in_another_key_order_counts_once(
    hostile: Hostile,
) -> None:
    """An event without sg_event_id is keyed by its content, so the same event
    re-serialised with its keys in another order (a new body, a new signature) is the same
    event."""
    ann = hostile.emails[0]
    event = hostile.sg_event(ann)
    del event["sg_event_id"]
    reordered = dict(reversed(list(event.items())))
    first, second = orjson.dumps([event]), orjson.dumps([reordered])
    assert first != second

    responses = [await hostile.post_sendgrid(first), await hostile.post_sendgrid(second)]

    assert [r.status_code for r in responses] == [200, 200]
    assert len(await hostile.timeline(ann)) == 1
    assert (await hostile.stats()).get("success") == 1


async def test_a_mailgun_event_redelivered_under_a_new_token_counts_once(
    hostile: Hostile,
) -> None:
    """Mailgun's retry of an event arrives with a fresh signature: its id and timestamp
    still make it the same event."""
    ann = hostile.emails[0]
    event = hostile.mg_event(
        ann, "failed", severity="permanent", reason="bounce", **{"delivery-status": {"code": 550}}
    )
    stamp = int(time.time())
    first, second = (_envelope(signing.mailgun_signature(MG_KEY, stamp), event) for _ in range(2))

    responses = [await hostile.post_mailgun(first), await hostile.post_mailgun(second)]

    assert [r.status_code for r in responses] == [200, 200]
    assert len(await hostile.timeline(ann)) == 1
    stats = await hostile.stats()
    assert (stats.get("failed"), stats.get("bounced")) == (1, 1)
    assert ann in await SuppressionStore(hostile.db).suppressed(hostile.user_id, [ann])


async def test_mailgun_events_sharing_an_id_on_other_timestamps_are_distinct(
    hostile: Hostile,
) -> None:
    """Mailgun's id is unique only within a day, so the same id at another time is another
    event (both on the timeline), not a duplicate."""
    ann = hostile.emails[0]
    first = hostile.mg_event(ann, "opened", timestamp=time.time() - 60)
    again = {**first, "timestamp": first["timestamp"] + 30}

    for event in (first, again):
        sig = signing.mailgun_signature(MG_KEY, int(time.time()))
        response = await hostile.post_mailgun(_envelope(sig, event))
        assert response.status_code == 200, response.text

    assert len(await hostile.timeline(ann)) == 2
    assert (await hostile.stats()).get("opened") == 1
