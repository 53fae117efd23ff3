"""The webhook intake and receivers over the in-memory twins: a verified delivery is applied,
or queued when Cassandra does not answer, before any 2xx; forgeries, replays and malformed or
unsigned bodies get their status code and change nothing."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from pydantic import SecretStr

from sandbox import signing
from services.webhooks import receivers
from services.webhooks.app import create_app
from services.webhooks.intake import RECEIVED_AT, intake_key
from shared.core.errors import ConfigError, DependencyUnavailable, PublishError
from shared.delivery.batchstore import NewBatch
from shared.delivery.recipients import log_id_for
from shared.infra.config import WebhookSettings
from shared.infra.http import ApiError
from tests.fakes.broker import FakeMessage
from tests.fakes.wire import Held
from tests.fakes.world import World
from tests.unit.loop_turns import MANY, turns_during

A, B = "a@example.org", "b@example.org"
SG_KEY = signing.generate_private_key()
MG_KEY = "unit-mailgun-signing-key"


def sendgrid_body(batch: NewBatch, kind: str = "delivered", email: str = A) -> bytes:
    """A SendGrid Event Webhook body about ``email`` of ``batch`` (our custom args echoed)."""
    return orjson.dumps(
        [
            {
                "email": email,
                "timestamp": int(time.time()),
                "event": kind,
                "sg_event_id": uuid.uuid4().hex,
                "batch_id": str(batch.batch_id),
                "log_id": str(log_id_for(batch.batch_id, email)),
                "chunk": "0",
                "sd_attempt": "c.0",
            }
        ]
    )


def mailgun_body(
    batch: NewBatch, email: str = A, *, signature: dict[str, str] | None = None
) -> bytes:
    event_data = {
        "event": "delivered",
        "id": uuid.uuid4().hex,
        "timestamp": time.time(),
        "recipient": email,
        "user-variables": {
            "batch_id": str(batch.batch_id),
            "log_id": str(log_id_for(batch.batch_id, email)),
            "chunk": "0",
            "sd_attempt": "c.0",
        },
    }
    sig = signature or signing.mailgun_signature(MG_KEY, int(time.time()))
    return orjson.dumps({"signature": sig, "event-data": event_data})


async def test_a_delivery_is_applied_directly_when_cassandra_answers() -> None:
    w = World()
    batch = await w.sent(A)
    answer = await w.intake.receive("sg", sendgrid_body(batch))
    assert answer == {"received": 1, "applied": 1, "orphans": 0}
    assert await w.states(batch) == {A: "success"}
    assert await w.broker.queue_depth(w.broker.topology.webhooks_queue) == 0


async def test_a_delivery_is_queued_when_cassandra_fails_and_applied_once_it_is_back() -> None:
    w = World()
    batch = await w.sent(A)
    w.db.fail("batches.owner", DependencyUnavailable("cassandra", "no host available"))
    before = time.time()
    answer = await w.intake.receive("sg", sendgrid_body(batch))
    after = time.time()
    assert answer == {"received": 1, "queued": True}
    assert await w.states(batch) == {A: "queued"}
    (queued,) = w.broker.queues[w.broker.topology.webhooks_queue]
    assert queued.routing_key == intake_key("sg")
    assert before <= float(queued.headers[RECEIVED_AT]) <= after
    await w.settle()
    assert await w.states(batch) == {A: "success"}
    assert w.intake.metrics.queued.labels("sg")._value.get() == 1


async def test_a_delivery_too_slow_to_apply_directly_is_queued() -> None:
    w = World()
    batch = await w.sent(A)
    w.intake.budget = 0
    assert (await w.intake.receive("sg", sendgrid_body(batch)))["queued"] is True
    await w.settle()
    assert await w.states(batch) == {A: "success"}


async def test_a_delivery_cassandra_holds_past_the_budget_is_queued_and_applied_once() -> None:
    """A direct apply still waiting on Cassandra when the budget runs out is given up: the
    delivery is queued (and answered so), then applied by the intake's consumer."""
    w = World()
    batch = await w.sent(A)
    w.db.wire = Held("batches.owner")  # never answered
    w.intake.budget = 0.05

    answer = await w.intake.receive("sg", sendgrid_body(batch))
    await w.settle()

    assert (answer, await w.states(batch)) == ({"received": 1, "queued": True}, {A: "success"})


async def test_a_delivery_cancelled_as_its_direct_apply_ends_is_cancelled() -> None:
    """A delivery whose request is cancelled (a shutdown) in the turn Cassandra answers its
    last query ends cancelled, instead of answering as if nobody had asked it to stop."""
    w = World()
    held = Held("tokens.accept_once")  # the last query of a Mailgun event naming no one
    w.db.wire = held
    body = orjson.dumps(
        {
            "signature": signing.mailgun_signature(MG_KEY, int(time.time())),
            "event-data": {"event": "delivered", "id": "x", "timestamp": time.time()},
        }
    )
    receiving = asyncio.create_task(w.intake.receive("mg", body))
    await held.reached.wait()

    held.release()
    receiving.cancel()
    await asyncio.wait({receiving}, timeout=5.0)

    assert receiving.cancelled()


async def test_when_neither_cassandra_nor_rabbitmq_takes_it_the_provider_must_retry() -> None:
    w = World()
    batch = await w.sent(A)
    w.db.fail("batches.owner", DependencyUnavailable("cassandra", "down"))
    w.broker.fail(PublishError("connection refused"))
    with pytest.raises(DependencyUnavailable, match="cassandra and rabbitmq"):
        await w.intake.receive("sg", sendgrid_body(batch))
    assert await w.states(batch) == {A: "queued"}


@pytest.mark.parametrize("provider", ["sg", "mg"])
async def test_a_malformed_body_is_a_400(provider: str) -> None:
    w = World()
    with pytest.raises(ApiError) as raised:
        await w.intake.receive(provider, b"{not json")
    assert (raised.value.status, raised.value.code) == (400, "malformed_body")


async def test_a_mailgun_token_is_accepted_again_only_with_the_same_body() -> None:
    w = World()
    batch = await w.sent(A, B)
    signature = signing.mailgun_signature(MG_KEY, int(time.time()))
    body = mailgun_body(batch, A, signature=signature)
    assert (await w.intake.receive("mg", body))["applied"] == 1
    assert (await w.intake.receive("mg", body))["applied"] == 1  # a replay: harmless
    with pytest.raises(ApiError) as raised:
        await w.intake.receive("mg", mailgun_body(batch, B, signature=signature))
    assert raised.value.status == 401
    assert await w.states(batch) == {A: "success", B: "queued"}


async def test_a_queued_forgery_is_dropped_and_counted() -> None:
    w = World()
    batch = await w.sent(A, B)
    signature = signing.mailgun_signature(MG_KEY, int(time.time()))
    await w.intake.receive("mg", mailgun_body(batch, A, signature=signature))
    forged = FakeMessage(intake_key("mg"), mailgun_body(batch, B, signature=signature))
    assert await w.deliver(forged) == "ack"
    assert w.intake.metrics.forged._value.get() == 1
    assert await w.states(batch) == {A: "success", B: "queued"}


async def test_a_mailgun_event_naming_no_recipient_is_ignored() -> None:
    w = World()
    body = orjson.dumps(
        {
            "signature": signing.mailgun_signature(MG_KEY, int(time.time())),
            "event-data": {"event": "delivered", "id": "x", "timestamp": time.time()},
        }
    )
    assert await w.intake.receive("mg", body) == {
        "received": 1,
        "applied": 0,
        "orphans": 0,
        "ignored": 1,
    }


async def test_a_queued_delivery_under_an_unknown_key_is_dead_lettered() -> None:
    w = World()
    assert await w.deliver(FakeMessage("hook.zz", b"[]")) == "reject"


async def test_a_queued_delivery_without_its_receipt_time_is_still_applied() -> None:
    w = World()
    batch = await w.sent(A)
    message = FakeMessage(intake_key("sg"), sendgrid_body(batch), {RECEIVED_AT: "garbage"})
    assert await w.deliver(message) == "ack"
    assert await w.states(batch) == {A: "success"}


# --- the receivers: signatures over the raw bytes, then the intake ---------------------


def webhook_settings(**overrides: object) -> WebhookSettings:
    values: dict[str, object] = {
        "sendgrid_public_key": signing.public_key_base64(SG_KEY),
        "mailgun_signing_key": SecretStr(MG_KEY),
        "deferred_deadline": 3600,
    }
    values.update(overrides)
    return WebhookSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
def world() -> World:
    return World(webhooks=webhook_settings())


@pytest.fixture
async def client(world: World) -> AsyncIterator[httpx.AsyncClient]:
    async with world.webhooks() as c:
        yield c


def sg_headers(body: bytes, *, stamp: int | None = None, key: object = SG_KEY) -> dict[str, str]:
    timestamp = str(stamp if stamp is not None else int(time.time()))
    return {
        receivers.SG_TIMESTAMP: timestamp,
        receivers.SG_SIGNATURE: signing.sign_sendgrid(key, timestamp, body),  # type: ignore[arg-type]
    }


async def test_a_signed_sendgrid_delivery_is_applied(
    world: World, client: httpx.AsyncClient
) -> None:
    batch = await world.sent(A)
    body = sendgrid_body(batch)
    response = await client.post("/webhooks/sendgrid", content=body, headers=sg_headers(body))
    assert (response.status_code, response.json()["applied"]) == (200, 1)
    assert await world.states(batch) == {A: "success"}


@pytest.mark.parametrize(
    "headers",
    [
        lambda body: sg_headers(body, key=signing.generate_private_key()),
        lambda body: sg_headers(body, stamp=int(time.time()) - 3600),
        lambda body: sg_headers(body + b" "),
        lambda body: {},
    ],
    ids=["other-key", "stale", "other-body", "unsigned"],
)
async def test_an_unverified_sendgrid_delivery_is_a_401_and_changes_nothing(
    world: World, client: httpx.AsyncClient, headers: object
) -> None:
    batch = await world.sent(A)
    body = sendgrid_body(batch)
    response = await client.post("/webhooks/sendgrid", content=body, headers=headers(body))  # type: ignore[operator]
    assert (response.status_code, response.json()["error"]["code"]) == (401, "bad_signature")
    assert await world.states(batch) == {A: "queued"}


async def test_sendgrid_without_any_verification_configured_is_a_503() -> None:
    w = World(webhooks=webhook_settings(sendgrid_public_key=None))
    async with w.webhooks() as client:
        response = await client.post("/webhooks/sendgrid", content=b"[]")
        assert response.status_code == 503


async def test_sendgrid_basic_auth_is_checked_when_configured() -> None:
    w = World(
        webhooks=webhook_settings(
            sendgrid_basic_user="hooks", sendgrid_basic_password=SecretStr("s3cret")
        )
    )
    batch = await w.sent(A)
    body = sendgrid_body(batch)
    async with w.webhooks() as client:
        wrong = await client.post(
            "/webhooks/sendgrid",
            content=body,
            headers=sg_headers(body),
            auth=("hooks", "guess"),
        )
        right = await client.post(
            "/webhooks/sendgrid", content=body, headers=sg_headers(body), auth=("hooks", "s3cret")
        )
        assert (wrong.status_code, right.status_code) == (401, 200)


async def test_sendgrid_basic_auth_alone_is_not_enough() -> None:
    """Without the signature key a right password is still a 503: the provider retries, and
    nobody who learnt the password can write events."""
    w = World(
        webhooks=webhook_settings(
            sendgrid_public_key=None,
            sendgrid_basic_user="hooks",
            sendgrid_basic_password=SecretStr("s3cret"),
        )
    )
    batch = await w.sent(A)
    async with w.webhooks() as client:
        response = await client.post(
            "/webhooks/sendgrid", content=sendgrid_body(batch), auth=("hooks", "s3cret")
        )
        assert (response.status_code, response.json()["error"]["code"]) == (503, "not_configured")
    assert await w.states(batch) == {A: "queued"}


async def test_sendgrid_basic_auth_alone_is_accepted_only_when_explicitly_insecure() -> None:
    w = World(
        webhooks=webhook_settings(
            sendgrid_public_key=None,
            sendgrid_basic_user="hooks",
            sendgrid_basic_password=SecretStr("s3cret"),
            sendgrid_insecure_basic_only=True,
        )
    )
    batch = await w.sent(A)
    body = sendgrid_body(batch)
    async with w.webhooks() as client:
        wrong = await client.post("/webhooks/sendgrid", content=body, auth=("hooks", "guess"))
        right = await client.post("/webhooks/sendgrid", content=body, auth=("hooks", "s3cret"))
        assert (wrong.status_code, right.status_code) == (401, 200)
    assert await w.states(batch) == {A: "success"}


async def test_a_sendgrid_post_without_a_signature_is_refused_before_its_body_is_read(
    world: World, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No signature header: 401, even for a body far over the limit (it is never buffered)."""
    monkeypatch.setattr(receivers, "MAX_BODY", 100)
    response = await client.post("/webhooks/sendgrid", content=b"[" + b" " * 200 + b"]")
    assert (response.status_code, response.json()["error"]["code"]) == (401, "bad_signature")


async def test_a_webhook_body_over_the_limit_is_a_413(
    world: World, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receivers, "MAX_BODY", 100)
    body = b"[" + b" " * 200 + b"]"
    response = await client.post("/webhooks/sendgrid", content=body, headers=sg_headers(body))
    assert response.status_code == 413


async def test_a_signed_mailgun_delivery_is_applied(
    world: World, client: httpx.AsyncClient
) -> None:
    batch = await world.sent(A)
    response = await client.post("/webhooks/mailgun", content=mailgun_body(batch))
    assert (response.status_code, response.json()["applied"]) == (200, 1)
    assert await world.states(batch) == {A: "success"}


@pytest.mark.parametrize(
    ("signature", "status"),
    [
        (lambda: signing.mailgun_signature("another-key", int(time.time())), 401),
        (lambda: signing.mailgun_signature(MG_KEY, int(time.time()) - 3600), 401),
        (lambda: {"timestamp": "1", "token": "t"}, 400),
    ],
    ids=["other-key", "stale", "incomplete"],
)
async def test_an_unverified_mailgun_delivery_is_refused_and_changes_nothing(
    world: World, client: httpx.AsyncClient, signature: object, status: int
) -> None:
    batch = await world.sent(A)
    body = mailgun_body(batch, signature=signature())  # type: ignore[operator]
    response = await client.post("/webhooks/mailgun", content=body)
    assert response.status_code == status
    assert await world.states(batch) == {A: "queued"}


async def test_mailgun_without_a_signing_key_is_a_503() -> None:
    w = World(webhooks=webhook_settings(mailgun_signing_key=None))
    async with w.webhooks() as client:
        assert (await client.post("/webhooks/mailgun", content=b"{}")).status_code == 503


def test_an_unreadable_sendgrid_public_key_stops_the_service_at_start() -> None:
    w = World(webhooks=webhook_settings(sendgrid_public_key="not a key"))
    with pytest.raises(ConfigError, match="SENDGRID_PUBLIC_KEY"):
        create_app(w.app_settings)


# --- bounded work before authentication -------------------------------------------------


async def test_a_body_that_trickles_in_is_a_408(
    world: World, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sender dribbling its body cannot hold a request slot for ever."""
    monkeypatch.setattr(receivers, "BODY_TIMEOUT", 0.2)
    batch = await world.sent(A)
    body = sendgrid_body(batch)

    async def trickle() -> AsyncIterator[bytes]:
        yield body[:10]
        await asyncio.sleep(1.0)
        yield body[10:]

    response = await client.post("/webhooks/sendgrid", content=trickle(), headers=sg_headers(body))

    assert (response.status_code, response.json()["error"]["code"]) == (408, "body_timeout")
    assert await world.states(batch) == {A: "queued"}


async def test_a_mailgun_body_bigger_than_any_event_is_refused_before_it_is_read(
    client: httpx.AsyncClient,
) -> None:
    """Mailgun's signature is inside the body: only a small one is read unauthenticated."""
    response = await client.post(
        "/webhooks/mailgun", content=b"{" + b" " * receivers.MAILGUN_MAX_BODY + b"}"
    )
    assert response.status_code == 413


async def test_webhook_posts_beyond_the_concurrency_limit_get_a_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beyond the limit a post is turned away at once (the provider retries), not queued."""
    w = World(webhooks=webhook_settings(max_concurrency=1))
    batch = await w.sent(A)
    body = sendgrid_body(batch)
    monkeypatch.setattr(receivers, "BODY_TIMEOUT", 5.0)
    holding = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        holding.set()
        await asyncio.sleep(0.5)
        yield body

    async with w.webhooks() as client:
        first = asyncio.create_task(
            client.post("/webhooks/sendgrid", content=slow(), headers=sg_headers(body))
        )
        await holding.wait()
        second = await client.post("/webhooks/sendgrid", content=body, headers=sg_headers(body))
        assert (second.status_code, second.headers["Retry-After"]) == (503, "1")
        assert (await first).status_code == 200


@pytest.mark.offloop
async def test_a_large_sendgrid_delivery_is_parsed_off_the_event_loop() -> None:
    """The event loop goes on with other work while a 3 MB delivery's events are parsed."""
    w = World()
    # Applied directly, however long a loaded machine takes to parse it: past the 2 s
    # budget the delivery would be queued instead, and this test is about the loop.
    w.intake.budget = 600.0
    body = orjson.dumps([{"event": "delivered", "email": None}] * 100_000)

    answer, turns = await turns_during(w.intake.receive("sg", body))

    assert answer == {"received": 100_000, "applied": 0, "orphans": 0}
    assert turns >= MANY
