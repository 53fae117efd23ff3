"""Operator tools for the dead-letter queue: list poison messages, or replay them.

Listing takes each message and rejects it back (requeue) so it stays; replaying republishes
it with confirms under its original routing key, and only then acks the dead copy.
"""

from __future__ import annotations

from typing import Any

from shared.broker import Broker
from shared.config import Settings
from shared.resources import topology_for


def describe(routing_key: str, headers: dict[str, Any], body: bytes) -> str:
    """One line about a dead letter. ``x-death`` is RabbitMQ's list of tables, but anyone who
    can publish to the dead-letter exchange can set it to anything: one odd letter must not
    stop the tool for every other."""
    deaths = headers.get("x-death")
    first = deaths[0] if isinstance(deaths, list) and deaths else {}
    reason = first.get("reason", "?") if isinstance(first, dict) else "?"
    queue = first.get("queue", "?") if isinstance(first, dict) else "?"
    return f"{routing_key}  reason={reason} queue={queue}  body={body[:120]!r}"


def replayed_headers(headers: dict[str, Any]) -> dict[str, Any]:
    """The headers a replayed letter keeps: ours (``x-safedelivr-*``, e.g. when a webhook
    delivery was received) and the application's, not RabbitMQ's death records."""
    return {
        k: v for k, v in headers.items() if k.startswith("x-safedelivr-") or not k.startswith("x-")
    }


async def drain_dead_letters(settings: Settings, *, replay: bool, limit: int) -> list[str]:
    broker = Broker(
        settings.amqp.url.get_secret_value(), topology_for(settings), name="safedelivr-dead"
    )
    await broker.connect()
    shown: list[str] = []
    held = []
    try:
        for _ in range(limit):
            message = await broker.get(broker.topology.dead_letter_queue)
            if message is None:
                break
            key = message.routing_key or ""
            shown.append(describe(key, dict(message.headers or {}), message.body))
            if replay:
                await broker.publish(
                    key,
                    message.body,
                    message_id=message.message_id,
                    headers=replayed_headers(dict(message.headers or {})),
                )
                await message.ack()
            else:
                held.append(message)
        for message in held:  # put listed messages back, untouched
            await message.nack(requeue=True)
    finally:
        await broker.close()
    return shown
