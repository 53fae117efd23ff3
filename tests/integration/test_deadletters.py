"""Dead letters against the real RabbitMQ and Cassandra: the archiver empties the dead-letter
queue into the archive (once per letter, whatever it carries), and a replay publishes a
letter back exactly once, keeping its bytes, message id and our headers."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aio_pika
import httpx
import pytest

from services.api.app import create_app
from shared.accounts import accounts
from shared.infra.broker import Broker
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.infra.resources import topology_for
from shared.infra.settle import InFlight, settling
from shared.infra.topology import Topology, batch_key, dispatch_key
from shared.ops.deadletters import (
    DeadLetters,
    DeadLetterStore,
    Letter,
    ReplayRefused,
    archiver,
    letter_of,
)
from tests.conftest import unique
from tests.integration.harness import client_for, running


@pytest.fixture
async def dlq(settings: Settings) -> AsyncIterator[Broker]:
    """A connected broker on the test's own topology (``settings`` deletes it afterwards)."""
    broker = Broker(settings.amqp.url.get_secret_value(), topology_for(settings), name="dlq-test")
    await broker.connect()
    await broker.declare()
    try:
        yield broker
    finally:
        await broker.close()


@pytest.fixture
def store(db: Database) -> DeadLetterStore:
    return DeadLetterStore(db)


@pytest.fixture
async def archiving(dlq: Broker, store: DeadLetterStore) -> AsyncIterator[list[Letter]]:
    """The consumers' archiver on this test's dead-letter queue; the letters it stored."""
    stored: list[Letter] = []
    handler = settling(archiver(store, stored.append), InFlight(), hold=None)
    await dlq.consume(dlq.topology.dead_letter_queue, handler, prefetch=8)
    yield stored
    await dlq.stop_consuming()


async def _next(broker: Broker, queue: str) -> aio_pika.abc.AbstractIncomingMessage:
    for _ in range(100):
        message = await broker.get(queue)
        if message is not None:
            return message
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing arrived on {queue}")


async def _archived(stored: list[Letter], count: int) -> list[Letter]:
    for _ in range(200):
        if len(stored) >= count:
            return stored
        await asyncio.sleep(0.05)
    raise AssertionError(f"{len(stored)} letters archived, not {count}")


async def _kill(
    broker: Broker,
    key: str,
    body: bytes,
    *,
    headers: dict[str, Any] | None = None,
    message_id: str | None = None,
) -> None:
    """Publish under ``key`` and reject it from its queue as poison, as settle does."""
    await broker.publish(key, body, headers=headers, message_id=message_id)
    message = await _next(broker, _queue_of(broker.topology, key))
    await message.reject(requeue=False)


def _queue_of(t: Topology, key: str) -> str:
    head = key.split(".")[0]
    return {"batch": t.batches_queue, "hook": t.webhooks_queue}.get(head) or t.provider_queue(head)


async def _straight_to_dlx(
    settings: Settings, key: str, body: bytes, headers: dict[str, Any]
) -> None:
    """Publish to the dead-letter exchange directly, as any client of the vhost can."""
    t = topology_for(settings)
    raw = Broker(settings.amqp.url.get_secret_value(), Topology(exchange=t.dead_letter_exchange))
    await raw.connect()
    try:
        await raw.publish(key, body, headers=headers)
    finally:
        await raw.close()


async def test_rejected_and_looping_work_is_archived_with_why_and_where_and_the_queue_emptied(
    dlq: Broker, archiving: list[Letter], store: DeadLetterStore
) -> None:
    """Rejected and delivery-limit deaths alike are archived with their reason and origin,
    and the dead-letter queue is left empty (each letter acked once stored)."""
    t = dlq.topology
    rejected = dispatch_key("sg", uuid.uuid1())
    await _kill(dlq, rejected, b"rejected one")
    looping = batch_key(uuid.uuid1())
    await dlq.publish(looping, b"looping one")
    for _ in range(t.delivery_limit + 1):
        message = await dlq.get(t.batches_queue)
        if message is None:
            break
        await message.nack(requeue=True)

    by_key = {x.routing_key: x for x in await _archived(archiving, 2)}

    assert (by_key[rejected].reason, by_key[rejected].queue) == ("rejected", t.provider_queue("sg"))
    assert (by_key[looping].reason, by_key[looping].queue) == ("delivery_limit", t.batches_queue)
    assert await dlq.queue_depth(t.dead_letter_queue) == 0
    listed = {x.id for x in await store.page(500)}
    assert {by_key[rejected].id, by_key[looping].id} <= listed


async def test_a_letter_archived_twice_is_stored_once(store: DeadLetterStore) -> None:
    """A redelivery (the archiver died between the write and the ack) adds no second row."""
    death = {"reason": "rejected", "queue": "q", "count": 1, "time": datetime.now(UTC)}
    key = dispatch_key("sg", uuid.uuid1())
    letter = letter_of(key, "m-1", {"x-death": [death]}, b"body", datetime.now(UTC))
    again = letter_of(key, "m-1", {"x-death": [death]}, b"body", datetime.now(UTC))

    assert await store.archive(letter) is True
    assert await store.archive(again) is False
    assert again.id == letter.id
    assert [x.id for x in await store.page(500) if x.routing_key == key] == [letter.id]


async def test_a_hostile_x_death_header_is_archived_like_any_other(
    settings: Settings, dlq: Broker, archiving: list[Letter]
) -> None:
    """Anyone on the vhost can publish to the dead-letter exchange with headers of their own."""
    await _straight_to_dlx(settings, "sg.hostile", b"x", {"x-death": {"reason": "forged"}})

    (letter,) = await _archived(archiving, 1)

    assert (letter.routing_key, letter.reason, letter.body) == ("sg.hostile", "?", b"x")


async def test_an_undecodable_body_is_replayed_byte_for_byte_with_its_message_id(
    dlq: Broker, archiving: list[Letter], store: DeadLetterStore
) -> None:
    """Poison is often not JSON at all: it is never decoded, and the replay sends the very
    bytes back with their message id."""
    key = dispatch_key("sg", uuid.uuid1())
    body = b"\xff\xfe\x00\n{not json"
    await _kill(dlq, key, body, message_id="m-1")
    (letter,) = await _archived(archiving, 1)

    replayed = await DeadLetters(store, dlq).replay(letter.id)

    back = await _next(dlq, dlq.topology.provider_queue("sg"))
    await back.ack()
    assert (back.routing_key, back.body, back.message_id) == (key, body, "m-1")
    assert replayed.state == "replayed" and replayed.replayed_at is not None


async def test_replaying_a_letter_twice_publishes_it_once(
    dlq: Broker, archiving: list[Letter], store: DeadLetterStore
) -> None:
    """The second replay is refused and nothing more reaches the queue."""
    key = dispatch_key("mg", uuid.uuid1())
    await _kill(dlq, key, b"once")
    (letter,) = await _archived(archiving, 1)
    letters = DeadLetters(store, dlq)

    await letters.replay(letter.id)
    with pytest.raises(ReplayRefused) as second:
        await letters.replay(letter.id)

    assert second.value.code == "already_replayed"
    await _next(dlq, dlq.topology.provider_queue("mg"))
    await asyncio.sleep(0.3)
    assert await dlq.queue_depth(dlq.topology.provider_queue("mg")) == 0


async def test_concurrent_replays_of_one_letter_publish_it_once(
    dlq: Broker, archiving: list[Letter], store: DeadLetterStore
) -> None:
    """Two operators pressing replay at once: one publishes, the other is refused."""
    await _kill(dlq, dispatch_key("mg", uuid.uuid1()), b"race")
    (letter,) = await _archived(archiving, 1)
    letters = DeadLetters(store, dlq)

    results = await asyncio.gather(
        *(letters.replay(letter.id) for _ in range(4)), return_exceptions=True
    )

    assert sum(isinstance(r, Letter) for r in results) == 1
    assert all(isinstance(r, Letter | ReplayRefused) for r in results)
    await asyncio.sleep(0.3)
    assert await dlq.queue_depth(dlq.topology.provider_queue("mg")) == 1


async def test_a_replay_whose_claim_expired_may_be_taken_over(
    dlq: Broker, archiving: list[Letter], store: DeadLetterStore
) -> None:
    """A replay that died after claiming does not block the letter for ever."""
    await _kill(dlq, dispatch_key("sg", uuid.uuid1()), b"stuck")
    (letter,) = await _archived(archiving, 1)
    long_ago = datetime(2020, 1, 1, tzinfo=UTC)
    assert await store.claim(letter, uuid.uuid4(), long_ago) is True

    replayed = await DeadLetters(store, dlq).replay(letter.id)

    assert replayed.state == "replayed"


async def test_an_unroutable_letter_is_refused_and_stays_waiting(
    settings: Settings, dlq: Broker, archiving: list[Letter], store: DeadLetterStore
) -> None:
    """A letter whose key no queue takes any more cannot go back; it stays for the operator."""
    await _straight_to_dlx(settings, "gone.provider.key", b"orphan", {})
    (letter,) = await _archived(archiving, 1)

    with pytest.raises(ReplayRefused) as refused:
        await DeadLetters(store, dlq).replay(letter.id)

    assert refused.value.code == "unroutable"
    after = await store.get(letter.id)
    assert after is not None and after.state == "waiting"


async def test_a_replayed_webhook_delivery_keeps_the_time_it_was_received(
    dlq: Broker, archiving: list[Letter], store: DeadLetterStore
) -> None:
    """Webhook deliveries queued while Cassandra was down carry their receive time in a
    header; events without a timestamp of their own are dated by it."""
    received = {"x-safedelivr-received-at": "1767225600.5"}
    await _kill(dlq, "hook.sg", b'[{"event": "processed"}]', headers=received)
    (letter,) = await _archived(archiving, 1)

    await DeadLetters(store, dlq).replay(letter.id)

    back = await _next(dlq, dlq.topology.webhooks_queue)
    await back.ack()
    assert (back.headers or {}).get("x-safedelivr-received-at") == "1767225600.5"
    assert "x-death" not in (back.headers or {})


async def test_a_deleted_letter_is_gone_and_cannot_be_replayed(
    dlq: Broker, archiving: list[Letter], store: DeadLetterStore
) -> None:
    await _kill(dlq, dispatch_key("sg", uuid.uuid1()), b"bye")
    (letter,) = await _archived(archiving, 1)
    letters = DeadLetters(store, dlq)

    assert await letters.delete(letter.id) is True
    assert await letters.delete(letter.id) is False
    with pytest.raises(ReplayRefused) as refused:
        await letters.replay(letter.id)
    assert refused.value.code == "not_found"
    assert await store.get(letter.id) is None


async def test_pages_run_newest_first_without_repeats(store: DeadLetterStore) -> None:
    """Paging with the last id of a page continues where it stopped."""
    base = datetime.now(UTC).replace(microsecond=0)
    mine = set()
    for n in range(5):
        death = {"reason": "rejected", "queue": "q", "time": base.replace(year=2099 - n)}
        letter = letter_of(f"sg.page{n}", None, {"x-death": [death]}, b"p", base)
        await store.archive(letter)
        mine.add(letter.id)

    first = await store.page(2)
    second = await store.page(2, after=first[-1].id)
    rest = await store.page(500, after=second[-1].id)

    seen = [x.id for x in first + second + rest if x.id in mine]
    assert len(seen) == len(set(seen)) == 5
    times = [x.dead_at for x in first + second + rest]
    assert times == sorted(times, reverse=True)
    for letter_id in mine:
        await store.delete(letter_id)


# --------------------------------------------------------------------------- /v1/dead-letters


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with running(app), client_for(app) as client:
        await app.state.resources.broker.declare()
        yield client


async def _key(db: Database, *scopes: str) -> dict[str, str]:
    user = await accounts.ensure_user(db, unique("dl"))
    key = await accounts.create_key(db, user, "k", scopes=scopes)
    return {"Authorization": f"Bearer {key}"}


async def _archived_letter(store: DeadLetterStore, key: str) -> Letter:
    death = {"reason": "delivery_limit", "queue": "q.sg", "count": 10, "time": datetime.now(UTC)}
    body = b'{"batch_id": "x", "chunk": 1, "attempt": 0}'
    letter = letter_of(key, "m-9", {"x-death": [death]}, body, datetime.now(UTC))
    assert await store.archive(letter)
    return letter


@pytest.mark.parametrize("scopes", [("send", "read", "keys"), ("read",)])
async def test_dead_letter_routes_need_an_operator_key(
    api: httpx.AsyncClient, db: Database, store: DeadLetterStore, scopes: tuple[str, ...]
) -> None:
    """A normal key gets 403 on every operator route, and nothing is replayed or deleted."""
    letter = await _archived_letter(store, dispatch_key("sg", uuid.uuid1()))
    headers = await _key(db, *scopes)

    answers = [
        await api.get("/v1/dead-letters", headers=headers),
        await api.post(f"/v1/dead-letters/{letter.id}/replay", headers=headers),
        await api.delete(f"/v1/dead-letters/{letter.id}", headers=headers),
    ]

    assert [a.status_code for a in answers] == [403, 403, 403]
    assert all(a.json()["error"]["code"] == "forbidden" for a in answers)
    after = await store.get(letter.id)
    assert after is not None and after.state == "waiting"


async def test_an_operator_lists_replays_once_and_deletes_a_dead_letter(
    api: httpx.AsyncClient, db: Database, store: DeadLetterStore, dlq: Broker
) -> None:
    """The listing shows why, where and what; a replay is 200 then 409; delete is 204 then 404."""
    batch = uuid.uuid1()
    letter = await _archived_letter(store, dispatch_key("sg", batch))
    headers = await _key(db, "operator")

    listed = await api.get("/v1/dead-letters", params={"limit": 500}, headers=headers)
    replayed = await api.post(f"/v1/dead-letters/{letter.id}/replay", headers=headers)
    again = await api.post(f"/v1/dead-letters/{letter.id}/replay", headers=headers)
    deleted = await api.delete(f"/v1/dead-letters/{letter.id}", headers=headers)
    gone = await api.delete(f"/v1/dead-letters/{letter.id}", headers=headers)

    (shown,) = [x for x in listed.json()["data"] if x["id"] == letter.id]
    assert shown["reason"] == "delivery_limit" and shown["deaths"] == 10
    assert shown["payload"]["kind"] == "dispatch" and shown["payload"]["id"] == str(batch)
    assert (replayed.status_code, replayed.json()["state"]) == (200, "replayed")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "already_replayed")
    assert (deleted.status_code, gone.status_code) == (204, 404)
    back = await _next(dlq, dlq.topology.provider_queue("sg"))
    await back.ack()
    assert back.message_id == "m-9"


@pytest.mark.parametrize(
    "letter_id", ["nope", "1795000000000-" + "a" * 24, "1795000000000-" + "g" * 24]
)
async def test_an_unknown_dead_letter_is_a_404(
    api: httpx.AsyncClient, db: Database, letter_id: str
) -> None:
    headers = await _key(db, "operator")
    replay = await api.post(f"/v1/dead-letters/{letter_id}/replay", headers=headers)
    delete = await api.delete(f"/v1/dead-letters/{letter_id}", headers=headers)
    assert (replay.status_code, delete.status_code) == (404, 404)
