"""The timeline and webhook-token tables on real Cassandra (``shared.ingest.timeline``,
``services.webhooks.webhook_tokens``): events read back in time order whatever order they arrived
in, details stored cut, and Mailgun tokens that bind to one body under concurrent use and expire."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from datetime import UTC, datetime, timedelta

from services.webhooks.webhook_tokens import WebhookTokens
from shared.core.webhook_events import ProviderEvent
from shared.infra.db import Database
from shared.ingest.timeline import MAX_DETAIL, Timeline

T0 = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)


def _event(
    log_id: uuid.UUID, at: datetime, kind: str = "delivered", **fields: object
) -> ProviderEvent:
    values: dict[str, object] = {
        "provider": "sg",
        "event_id": uuid.uuid4().hex,
        "kind": kind,
        "raw_event": kind,
        "email": "ann@example.org",
        "occurred_at": at,
        "batch_id": None,
        "chunk": 0,
        "log_id": log_id,
        "attempt": "c.0",
        "message_id": None,
        "reason": None,
        "provider_side": False,
        "suppress": False,
    }
    values.update(fields)
    return ProviderEvent(**values)  # type: ignore[arg-type]


async def _timeline(
    db: Database, batch_id: uuid.UUID, log_id: uuid.UUID
) -> list[dict[str, object]]:
    return await db.rows(
        "SELECT at, event_id, kind, detail, counted FROM log_events "
        "WHERE batch_id = ? AND log_id = ?",
        (batch_id, log_id),
    )


async def test_events_arriving_out_of_order_read_back_in_time_order(db: Database) -> None:
    """Providers deliver webhooks late and reordered; the timeline is ordered by when each
    event happened, and a replay in between adds nothing."""
    batch_id, log_id = uuid.uuid1(), uuid.uuid1()
    timeline = Timeline(db)
    sent = _event(log_id, T0, "sent")
    deferred = _event(log_id, T0 + timedelta(minutes=1), "deferred", reason="421 try later")
    delivered = _event(log_id, T0 + timedelta(minutes=7))
    for ev in (delivered, sent, deferred, delivered):
        await timeline.record(batch_id, log_id, ev, counted=ev is not sent)

    rows = await _timeline(db, batch_id, log_id)

    assert [r["kind"] for r in rows] == ["sent", "deferred", "delivered"]
    assert [r["event_id"] for r in rows] == [sent.event_id, deferred.event_id, delivered.event_id]
    assert [r["counted"] for r in rows] == [False, True, True]
    assert rows[1]["detail"] == "421 try later"


async def test_a_long_detail_is_stored_cut_to_the_limit(db: Database) -> None:
    """A provider may send kilobytes of SMTP transcript as the reason; the row keeps the
    first MAX_DETAIL characters."""
    batch_id, log_id = uuid.uuid1(), uuid.uuid1()
    reason = "550 5.1.1 " + "ü" * 5000
    await Timeline(db).record(
        batch_id, log_id, _event(log_id, T0, "bounced", reason=reason), counted=True
    )
    (row,) = await _timeline(db, batch_id, log_id)
    assert row["detail"] == reason[:MAX_DETAIL]


def _hash(body: bytes) -> bytes:
    return hashlib.sha256(body).digest()


async def test_concurrent_first_uses_of_a_token_bind_it_to_exactly_one_body(
    db: Database,
) -> None:
    """Several deliveries race with the same token: one body wins, every other is a forgery,
    and the winner stays accepted afterwards."""
    tokens = WebhookTokens(db)
    token = uuid.uuid4().hex
    bodies = [_hash(f"body {n}".encode()) for n in range(6)]

    verdicts = await asyncio.gather(*(tokens.accept_once(token, b) for b in bodies))

    assert verdicts.count(True) == 1
    winner = bodies[verdicts.index(True)]
    assert await tokens.accept_once(token, winner)
    assert [await tokens.accept_once(token, b) for b in bodies if b != winner] == [False] * 5


async def test_a_body_hash_that_differs_in_any_way_is_refused(db: Database) -> None:
    tokens = WebhookTokens(db)
    token = uuid.uuid4().hex
    original = _hash(b'{"event-data": {"event": "delivered"}}')
    assert await tokens.accept_once(token, original)

    flipped = bytes([original[0] ^ 1]) + original[1:]
    for tampered in (flipped, original[:-1], original + b"\x00", b""):
        assert not await tokens.accept_once(token, tampered)
    assert await tokens.accept_once(token, original)


async def test_a_token_stored_without_a_body_hash_refuses_every_body(db: Database) -> None:
    """A row from before bodies were bound (no hash): no body can prove it is the first."""
    token = uuid.uuid4().hex
    await db.execute("INSERT INTO webhook_tokens (mg_token) VALUES (?)", (token,))
    assert not await WebhookTokens(db).accept_once(token, _hash(b"any body"))


async def test_a_token_is_forgotten_after_two_days(db: Database) -> None:
    """Mailgun's signed timestamps are refused long before then; the table does not grow."""
    token = uuid.uuid4().hex
    await WebhookTokens(db).accept_once(token, _hash(b"body"))
    row = await db.one(
        "SELECT TTL(body_hash) AS ttl FROM webhook_tokens WHERE mg_token = ?", (token,)
    )
    assert row is not None
    assert 2 * 86400 - 120 < row["ttl"] <= 2 * 86400
