"""``POST /webhooks/ses`` (``services.webhooks.receivers.ses``) over the in-memory world, with
SNS played by the sandbox (its key signs, its root serves the certificate and the
``ConfirmSubscription`` action, reached through a client that sends SNS's host there): what
is taken, what is refused (401/400/503), and that nothing refused is fetched or stored."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from pydantic import SecretStr

from sandbox import signing
from sandbox.app import create_app as create_sandbox
from sandbox.ses_feed import notification, subscription_confirmation
from services.webhooks.app import create_app as create_webhooks
from services.webhooks.sns import SnsCertificates
from shared.delivery.batchstore import NewBatch
from shared.delivery.recipients import log_id_for
from shared.infra.config import SandboxSettings, WebhookSettings
from shared.ops.alerts import AlertConfig, Alerter
from tests.fakes.world import World

A = "a@example.org"
TOPIC = "arn:aws:sns:us-east-1:000000000000:safedelivr-ses-events"
SNS = "https://sns.us-east-1.amazonaws.com"
KEY = signing.generate_sns_key()
CERT = signing.sns_certificate(KEY)


def record(batch: NewBatch, event: str = "Delivery", email: str = A) -> dict[str, Any]:
    """An SES event record about ``email`` of ``batch``, our tags published with it."""
    tags = {
        "batch_id": [str(batch.batch_id)],
        "chunk": ["0"],
        "log_id": [str(log_id_for(batch.batch_id, email))],
        "sd_attempt": ["c-0"],
    }
    mail = {"messageId": "0100-ses", "destination": [email], "tags": tags}
    detail = {"recipients": [email], "smtpResponse": "250 OK"} if event == "Delivery" else {}
    return {"eventType": event, "mail": mail, event[:1].lower() + event[1:]: detail}


def signed(fields: dict[str, str], key: Any = KEY) -> bytes:
    return orjson.dumps({**fields, "Signature": signing.sign_sns(key, fields)})


def body(batch: NewBatch, *, key: Any = KEY, topic: str = TOPIC, **changes: str) -> bytes:
    """A signed notification of a Delivery about ``A``; ``changes`` are made before signing."""
    return signed({**notification(record(batch), topic, time.time()), **changes}, key)


@dataclass
class Receiver:
    client: httpx.AsyncClient
    sns_requests: list[str]
    """Every URL the receiver fetched (through the sandbox standing in for SNS)."""
    sandbox: Any


@asynccontextmanager
async def receiver(world: World, *, pinned: bool = True) -> AsyncIterator[Receiver]:
    sandbox = create_sandbox(SandboxSettings(ses_signing_key=_pem()))
    fetched: list[str] = []

    async def seen(request: httpx.Request) -> None:
        fetched.append(str(request.url))

    sns_client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=sandbox), event_hooks={"request": [seen]}
    )
    app = create_webhooks(world.app_settings)
    app.state.intake = world.intake
    app.state.sns = SnsCertificates(pinned=CERT if pinned else None, client=sns_client)
    transport = httpx.ASGITransport(app=app)
    async with (
        sns_client,
        httpx.AsyncClient(transport=transport, base_url="http://webhooks") as client,
        httpx.AsyncClient() as alert_client,
    ):
        # No sink: the log line is the alert (shared.ops.alerts).
        no_sink = AlertConfig("", 600)
        app.state.alerter = Alerter(world.db, "s", alert_client, lambda: no_sink)  # type: ignore[arg-type]
        yield Receiver(client, fetched, sandbox)


def _pem() -> SecretStr:
    return SecretStr(signing.rsa_key_pem(KEY))


def ses_world(**overrides: object) -> World:
    values: dict[str, object] = {"ses_topic_arns": TOPIC, "deferred_deadline": 3600}
    values.update(overrides)
    return World(webhooks=WebhookSettings(**values))  # type: ignore[arg-type]


async def post(r: Receiver, raw: bytes) -> httpx.Response:
    return await r.client.post("/webhooks/ses", content=raw)


async def test_a_signed_notification_is_applied() -> None:
    world = ses_world()
    batch = await world.sent(A)
    async with receiver(world) as r:
        response = await post(r, body(batch))

    assert (response.status_code, response.json()["applied"]) == (200, 1), response.text
    assert await world.states(batch) == {A: "success"}


async def test_the_certificate_is_fetched_from_sns_once_and_kept() -> None:
    world = ses_world()
    batch = await world.sent(A)
    async with receiver(world, pinned=False) as r:
        first = await post(r, body(batch))
        second = await post(r, body(batch))

    assert (first.status_code, second.status_code) == (200, 200), first.text
    assert [u.split("/")[-1] for u in r.sns_requests] == [
        "SimpleNotificationService-0000000000000000000000.pem"
    ]


def _flip(raw: bytes) -> bytes:
    data = orjson.loads(raw)
    data["Message"] = data["Message"].replace("Delivery", "Deliverz", 1)
    return orjson.dumps(data)


CERT_PATH = "SimpleNotificationService-0.pem"


@pytest.mark.parametrize(
    "forge",
    [
        lambda batch: body(batch, key=signing.generate_sns_key()),
        lambda batch: _flip(body(batch)),
        lambda batch: body(batch, topic="arn:aws:sns:us-east-1:123456789012:strangers"),
        lambda batch: body(batch, SigningCertURL=f"http://sns.us-east-1.amazonaws.com/{CERT_PATH}"),
        lambda batch: body(
            batch, SigningCertURL=f"https://sns.us-east-1.amazonaws.com.evil.example/{CERT_PATH}"
        ),
        lambda batch: body(
            batch, SigningCertURL=f"https://sns.eu-west-1.amazonaws.com/{CERT_PATH}"
        ),
    ],
    ids=[
        "other-key",
        "one-byte-changed",
        "unknown-topic",
        "http-cert",
        "foreign-cert",
        "other-region-cert",
    ],
)
async def test_a_forged_notification_is_a_401_and_changes_nothing(
    forge: Callable[[NewBatch], bytes],
) -> None:
    world = ses_world()
    batch = await world.sent(A)
    async with receiver(world, pinned=False) as r:
        response = await post(r, forge(batch))
        fetched = list(r.sns_requests)

    assert (response.status_code, response.json()["error"]["code"]) == (401, "bad_signature")
    assert await world.states(batch) == {A: "queued"}
    # A certificate is fetched only from SNS's own address of the topic's region.
    assert all(u.startswith(f"{SNS}/SimpleNotificationService-") for u in fetched)


async def test_a_subscription_is_confirmed_at_sns() -> None:
    async with receiver(ses_world()) as r:
        fields = subscription_confirmation(TOPIC, f"{SNS}/", time.time())
        response = await post(r, signed(fields))
        confirmations = r.sandbox.state.sandbox.dispatcher.ses_confirmations

    assert response.status_code == 200, response.text
    assert r.sns_requests == [fields["SubscribeURL"]]
    assert confirmations == 1


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/?Action=ConfirmSubscription",
        "https://sns.us-east-1.amazonaws.com.evil.example/?Action=ConfirmSubscription",
        "http://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription",
        "https://sns.us-east-1.amazonaws.com/admin?Action=ConfirmSubscription",
    ],
    ids=["metadata", "foreign-host", "http", "other-path"],
)
async def test_an_unsafe_subscribe_url_is_refused_and_never_fetched(url: str) -> None:
    async with receiver(ses_world()) as r:
        fields = {**subscription_confirmation(TOPIC, f"{SNS}/", time.time()), "SubscribeURL": url}
        response = await post(r, signed(fields))

    assert (response.status_code, response.json()["error"]["code"]) == (
        400,
        "subscribe_url_refused",
    )
    assert r.sns_requests == []


async def test_an_unsubscribe_confirmation_is_answered_and_alerts_the_operators(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SES's events stop coming: the operators hear of it (with no sink set, the log line is
    the alert); nothing is fetched or applied."""
    caplog.set_level("WARNING", logger="shared.ops.alerts")
    async with receiver(ses_world()) as r:
        fields = {
            **subscription_confirmation(TOPIC, f"{SNS}/", time.time()),
            "Type": "UnsubscribeConfirmation",
        }
        response = await post(r, signed(fields))

    assert (response.status_code, response.json()) == (200, {"unsubscribed": True})
    assert r.sns_requests == []
    alerts = [r.getMessage() for r in caplog.records if r.name == "shared.ops.alerts"]
    assert len(alerts) == 1 and alerts[0].startswith(f"alert ses_unsubscribed/{TOPIC}: ")


async def test_without_allowed_topics_ses_events_are_a_503() -> None:
    world = ses_world(ses_topic_arns="")
    batch = await world.sent(A)
    async with receiver(world) as r:
        response = await post(r, body(batch))

    assert response.status_code == 503
    assert await world.states(batch) == {A: "queued"}


async def test_a_replayed_notification_changes_nothing_more() -> None:
    world = ses_world()
    batch = await world.sent(A)
    raw = body(batch)
    async with receiver(world) as r:
        answers = [(await post(r, raw)).status_code for _ in range(3)]

    assert answers == [200, 200, 200]
    assert await world.states(batch) == {A: "success"}
