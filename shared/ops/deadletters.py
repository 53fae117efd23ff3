"""Dead letters: the work RabbitMQ parked, archived where an operator can act on each one.

A message no consumer can process (undecodable, or redelivered past its queue's delivery
limit) is dead-lettered by RabbitMQ to ``<exchange>.dead``. The consumers archive every
letter from that queue into the ``dead_letters`` table (:func:`archiver`) and only then ack
it; the API (``/v1/dead-letters``) and the CLI (``safedelivr dead``) list, replay and delete
the letters there by id (:class:`DeadLetters`). A queue cannot address one message; a table
can.

* Archiving is idempotent. A letter's id derives from what it carries (routing key, message
  id, first death, body) and its row is written ``IF NOT EXISTS``, so a letter redelivered
  after a crash between the write and the ack is stored once. The archiver never rejects a
  letter: the dead queue has nowhere further to send it.
* Replaying claims the letter (a lightweight transaction with a lease), republishes it with
  confirms under its routing key with the headers a replay keeps, then marks it replayed:
  replaying it again is refused and publishes nothing. A process that dies between the
  publish and the mark leaves its claim to expire, and a later replay publishes the letter
  once more, which is harmless: every consumer claims each send once.
* A letter whose routing key no longer reaches a queue is released and stays, with the reason.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, Protocol

import aio_pika.abc
import orjson

from shared.core.errors import PublishError
from shared.infra.broker import Broker
from shared.infra.db import Database, Row, utc
from shared.infra.settle import Delivery, Process
from shared.infra.topology import parse_routing_key

log = logging.getLogger(__name__)

#: The one partition of ``dead_letters``.
_BUCKET: Final = 0
#: How long a replay may hold its claim before another replay may take the letter over.
REPLAY_LEASE: Final = timedelta(seconds=60)
#: Longest body preview shown in a listing.
PREVIEW: Final = 200

State = Literal["waiting", "replaying", "replayed"]

_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)
_FAR: Final = datetime(9999, 1, 1, tzinfo=UTC)
_UNIX: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MILLI: Final = timedelta(milliseconds=1)


# --------------------------------------------------------------------------- pure


@dataclass(frozen=True, slots=True)
class Death:
    """The most recent death RabbitMQ recorded in ``x-death`` (``?`` when unusable)."""

    reason: str
    queue: str
    count: int
    first_time: datetime | None


def death_of(headers: Mapping[str, Any]) -> Death:
    """``x-death`` is RabbitMQ's list of tables, newest first, but anyone who can publish to
    the dead-letter exchange can set it to anything: an odd one gives ``?``, never an error."""
    deaths = headers.get("x-death")
    first = deaths[0] if isinstance(deaths, list) and deaths else {}
    if not isinstance(first, Mapping):
        return Death("?", "?", 0, None)
    count = first.get("count")
    when = first.get("time")
    return Death(
        reason=str(first.get("reason", "?"))[:100],
        queue=str(first.get("queue", "?"))[:200],
        count=count if isinstance(count, int) and not isinstance(count, bool) else 0,
        first_time=utc(when) if isinstance(when, datetime) else None,
    )


def replayed_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The headers a replayed letter keeps: ours (``x-safedelivr-*``, e.g. when a webhook
    delivery was received) and the application's, not RabbitMQ's death records."""
    return {
        k: v for k, v in headers.items() if k.startswith("x-safedelivr-") or not k.startswith("x-")
    }


def _plain(value: Any) -> Any:
    """A header value as JSON keeps it (AMQP tables may hold bytes, times, decimals)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def letter_id(routing_key: str, message_id: str | None, dead_at: datetime, body: bytes) -> str:
    """The letter's id: its death time in milliseconds and a digest of what it carries."""
    digest = hashlib.sha256()
    for part in (routing_key.encode(), (message_id or "").encode(), body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    # Integer arithmetic: a float timestamp times 1000 truncates about one date in 150 to
    # the millisecond before, and such an id would not lead back to its row.
    millis = (dead_at - _UNIX) // _MILLI
    return f"{millis}-{digest.hexdigest()[:24]}"


def parse_id(text: str) -> tuple[datetime, str] | None:
    """``(dead_at, letter_id)`` of an id from :func:`letter_id`, or None if it is not one."""
    millis, sep, digest = text.partition("-")
    if not sep or len(digest) != 24 or len(millis) > 15 or not millis.isascii():
        return None
    if not millis.isdecimal() or any(c not in "0123456789abcdef" for c in digest):
        return None
    try:
        return _UNIX + int(millis) * _MILLI, text
    except OverflowError:
        return None


@dataclass(frozen=True, slots=True)
class Letter:
    """One archived dead letter."""

    id: str
    dead_at: datetime
    routing_key: str
    message_id: str | None
    reason: str
    queue: str
    deaths: int
    headers: dict[str, Any]
    """The headers a replay sends again."""
    body: bytes
    archived_at: datetime
    state: State = "waiting"
    replayed_at: datetime | None = None


def letter_of(
    routing_key: str,
    message_id: str | None,
    headers: Mapping[str, Any],
    body: bytes,
    now: datetime,
) -> Letter:
    """The archive record of a message taken from the dead-letter queue."""
    death = death_of(headers)
    # RabbitMQ's first death time is the same on every redelivery: the id stays the same.
    dead_at = death.first_time or now
    if not _EPOCH <= dead_at < _FAR:
        dead_at = now  # a forged record; the id still derives from what the letter carries
    dead_at = dead_at.replace(microsecond=dead_at.microsecond // 1000 * 1000)
    return Letter(
        id=letter_id(routing_key, message_id, dead_at, body),
        dead_at=dead_at,
        routing_key=routing_key[:255],
        message_id=message_id,
        reason=death.reason,
        queue=death.queue,
        deaths=death.count,
        headers={str(k): _plain(v) for k, v in replayed_headers(headers).items()},
        body=body,
        archived_at=now,
    )


def summary(letter: Letter) -> dict[str, Any]:
    """What an operator needs to judge a letter, without its whole body."""
    about: dict[str, Any] = {"kind": "unknown", "bytes": len(letter.body)}
    key = letter.routing_key
    if key.startswith("hook."):
        about.update(kind="webhook", provider=key.removeprefix("hook."))
    else:
        try:
            parsed = parse_routing_key(key)
        except ValueError:
            pass
        else:
            about.update(kind=parsed.kind, id=str(parsed.id), attempt=parsed.attempt)
            if parsed.provider:
                about["provider"] = parsed.provider
    try:
        decoded = orjson.loads(letter.body)
    except orjson.JSONDecodeError:
        decoded = None
    if isinstance(decoded, dict):
        for field in ("batch_id", "chunk", "log_id", "attempt"):
            value = decoded.get(field)
            if isinstance(value, str | int) and not isinstance(value, bool):
                about[field] = value
    about["preview"] = letter.body[:PREVIEW].decode("utf-8", "replace")
    return about


def line(letter: Letter) -> str:
    """One line about a letter, for the CLI (whatever its key or death record holds)."""
    key, reason, queue = (_printable(t) for t in (letter.routing_key, letter.reason, letter.queue))
    return (
        f"{letter.id}  {letter.state}  {key}  reason={reason} queue={queue}  "
        f"body={letter.body[:120]!r}"
    )


def _printable(text: str) -> str:
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def view(letter: Letter) -> dict[str, Any]:
    """A letter as the API and the CLI show it."""
    return {
        "id": letter.id,
        "routing_key": letter.routing_key,
        "reason": letter.reason,
        "queue": letter.queue,
        "deaths": letter.deaths,
        "dead_at": letter.dead_at.isoformat(),
        "state": letter.state,
        "replayed_at": letter.replayed_at.isoformat() if letter.replayed_at else None,
        "payload": summary(letter),
    }


# --------------------------------------------------------------------------- the table


_SELECT = (
    "SELECT dead_at, letter_id, routing_key, message_id, reason, queue, deaths, headers, body, "
    "archived_at, replay_state, replay_until, replayed_at FROM dead_letters WHERE bucket = ?"
)


def _stored_times(letter_id: str) -> tuple[datetime, ...]:
    """The death times a letter with this id may be stored under.

    Ids made before November 2026 came from a truncated float, and about one in 150 names the
    millisecond before its row's; such a letter is looked for there too, so it can still be
    replayed or deleted.
    """
    key = parse_id(letter_id)
    return () if key is None else (key[0], key[0] + _MILLI)


def _row_letter(row: Row) -> Letter:
    state = row["replay_state"]
    headers = orjson.loads(row["headers"] or "{}")
    return Letter(
        id=str(row["letter_id"]),
        dead_at=utc(row["dead_at"]),
        routing_key=str(row["routing_key"]),
        message_id=row["message_id"],
        reason=str(row["reason"] or "?"),
        queue=str(row["queue"] or "?"),
        deaths=int(row["deaths"] or 0),
        headers=headers if isinstance(headers, dict) else {},
        body=bytes(row["body"] or b""),
        archived_at=utc(row["archived_at"]),
        state="replayed" if state == "replayed" else "replaying" if state else "waiting",
        replayed_at=utc(row["replayed_at"]),
    )


class LetterArchive(Protocol):
    """What callers use of :class:`DeadLetterStore` (its twin: ``tests/fakes/ops.py``)."""

    async def archive(self, letter: Letter) -> bool: ...

    async def page(self, limit: int, after: str | None = None) -> list[Letter]: ...

    async def get(self, letter_id: str) -> Letter | None: ...

    async def claim(self, letter: Letter, owner: uuid.UUID, now: datetime) -> bool: ...

    async def finish(self, letter: Letter, owner: uuid.UUID, now: datetime) -> None: ...

    async def release(self, letter: Letter, owner: uuid.UUID) -> None: ...

    async def delete(self, letter_id: str) -> bool: ...

    async def waiting(self) -> int: ...


class DeadLetterStore:
    """The ``dead_letters`` table (its only writer)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def archive(self, letter: Letter) -> bool:
        """Store a letter; False when it was already there (a redelivery)."""
        row = await self._db.one(
            "INSERT INTO dead_letters (bucket, dead_at, letter_id, routing_key, message_id, "
            "reason, queue, deaths, headers, body, archived_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
            (
                _BUCKET,
                letter.dead_at,
                letter.id,
                letter.routing_key,
                letter.message_id,
                letter.reason,
                letter.queue,
                letter.deaths,
                orjson.dumps(letter.headers).decode(),
                letter.body,
                letter.archived_at,
            ),
        )
        return bool(row and row["[applied]"])

    async def page(self, limit: int, after: str | None = None) -> list[Letter]:
        """Up to ``limit`` letters, newest first, after the letter with id ``after``."""
        key = parse_id(after) if after else None
        if key is None:
            rows = await self._db.rows(_SELECT + " LIMIT ?", (_BUCKET, limit))
        else:
            rows = await self._db.rows(
                _SELECT + " AND (dead_at, letter_id) < (?, ?) LIMIT ?",
                (_BUCKET, await self._cursor_time(key), key[1], limit),
            )
        return [_row_letter(r) for r in rows]

    async def _cursor_time(self, key: tuple[datetime, str]) -> datetime:
        """Where the letter a page follows is stored, read from its row: an old truncated id
        names the millisecond before it (:func:`_stored_times`), and paging from there would
        skip letters of that millisecond. The id's own time when the letter is gone."""
        dead_at, letter_id = key
        found = await self.get(letter_id)
        return found.dead_at if found is not None else dead_at

    async def get(self, letter_id: str) -> Letter | None:
        for dead_at in _stored_times(letter_id):
            row = await self._db.one(
                _SELECT + " AND dead_at = ? AND letter_id = ?",
                (_BUCKET, dead_at, letter_id),
                serial=True,
            )
            if row is not None:
                return _row_letter(row)
        return None

    async def claim(self, letter: Letter, owner: uuid.UUID, now: datetime) -> bool:
        """Claim a waiting letter for a replay, or take over a replay whose lease ran out."""
        until = now + REPLAY_LEASE
        row = await self._db.one(
            "UPDATE dead_letters SET replay_state = 'replaying', replay_owner = ?, "
            "replay_until = ? WHERE bucket = ? AND dead_at = ? AND letter_id = ? "
            # A conditional update of a missing row could create one: archived_at is set on
            # every archived letter, so a deleted letter is not resurrected.
            "IF archived_at != null AND replay_state = null",
            (owner, until, _BUCKET, letter.dead_at, letter.id),
        )
        if row and row["[applied]"]:
            return True
        row = await self._db.one(
            "UPDATE dead_letters SET replay_owner = ?, replay_until = ? "
            "WHERE bucket = ? AND dead_at = ? AND letter_id = ? "
            "IF replay_state = 'replaying' AND replay_until < ?",
            (owner, until, _BUCKET, letter.dead_at, letter.id, now),
        )
        return bool(row and row["[applied]"])

    async def finish(self, letter: Letter, owner: uuid.UUID, now: datetime) -> None:
        """Mark a letter this replay claimed as replayed."""
        await self._db.one(
            "UPDATE dead_letters SET replay_state = 'replayed', replayed_at = ? "
            "WHERE bucket = ? AND dead_at = ? AND letter_id = ? IF replay_owner = ?",
            (now, _BUCKET, letter.dead_at, letter.id, owner),
        )

    async def release(self, letter: Letter, owner: uuid.UUID) -> None:
        """Give back a claim whose publish failed: the letter waits again."""
        await self._db.one(
            "UPDATE dead_letters SET replay_state = null, replay_owner = null, "
            "replay_until = null WHERE bucket = ? AND dead_at = ? AND letter_id = ? "
            "IF replay_owner = ?",
            (_BUCKET, letter.dead_at, letter.id, owner),
        )

    async def delete(self, letter_id: str) -> bool:
        for dead_at in _stored_times(letter_id):
            row = await self._db.one(
                "DELETE FROM dead_letters WHERE bucket = ? AND dead_at = ? AND letter_id = ? "
                "IF EXISTS",
                (_BUCKET, dead_at, letter_id),
            )
            if row and row["[applied]"]:
                return True
        return False

    async def waiting(self) -> int:
        """How many letters wait for an operator (not replayed)."""
        rows = await self._db.all_pages(
            "SELECT replay_state FROM dead_letters WHERE bucket = ?", (_BUCKET,)
        )
        return sum(1 for r in rows if r["replay_state"] != "replayed")


# --------------------------------------------------------------------------- use cases


class ReplayRefused(Exception):
    """A replay that did not happen: ``code`` is ``not_found``, ``already_replayed``,
    ``replaying`` (another replay holds it) or ``unroutable``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class DeadLetters:
    """Replay and delete archived letters (the API's and the CLI's shared use cases)."""

    store: DeadLetterStore
    broker: Broker

    async def replay(self, letter_id: str, now: datetime | None = None) -> Letter:
        """Publish the letter again, once; the letter as it is now (``replayed``)."""
        now = now or datetime.now(UTC)
        letter = await self.store.get(letter_id)
        if letter is None:
            raise ReplayRefused("not_found", "no such dead letter")
        if letter.state == "replayed":
            raise ReplayRefused("already_replayed", "this dead letter was already replayed")
        owner = uuid.uuid4()
        if not await self.store.claim(letter, owner, now):
            again = await self.store.get(letter_id)
            if again is None:
                raise ReplayRefused("not_found", "no such dead letter")
            if again.state == "replayed":
                raise ReplayRefused("already_replayed", "this dead letter was already replayed")
            raise ReplayRefused("replaying", "another replay of this letter is in progress")
        try:
            await self.broker.publish(
                letter.routing_key, letter.body, message_id=letter.message_id,
                headers=letter.headers,
            )  # fmt: skip
        except PublishError as exc:
            await self.store.release(letter, owner)
            if exc.detail.startswith("unroutable"):
                raise ReplayRefused(
                    "unroutable",
                    f"no queue takes routing key {letter.routing_key!r} now; the letter stays",
                ) from exc
            raise  # not confirmed: RabbitMQ is in trouble (503), the letter waits again
        await self.store.finish(letter, owner, datetime.now(UTC))
        found = await self.store.get(letter_id)
        return found or letter

    async def delete(self, letter_id: str) -> bool:
        return await self.store.delete(letter_id)


def archiver(
    store: DeadLetterStore, on_archived: Callable[[Letter], None] | None = None
) -> Process:
    """The consumer of the dead-letter queue: archive each letter; the caller acks it after.

    Nothing here may raise an error that rejects the letter: headers that cannot be read are
    recorded as such, and the body is kept byte for byte.
    """

    async def archive(message: aio_pika.abc.AbstractIncomingMessage, _: Delivery) -> None:
        now = datetime.now(UTC)
        key = message.routing_key or ""
        try:
            letter = letter_of(
                key, message.message_id, dict(message.headers or {}), message.body, now
            )
        except Exception:  # odd headers must not lose the letter
            log.exception("dead letter %s has unreadable headers; archiving it without them", key)
            letter = letter_of(key, message.message_id, {}, message.body, now)
        if await store.archive(letter):
            log.warning(
                "dead letter archived: %s (%s from %s), id %s",
                key, letter.reason, letter.queue, letter.id,
            )  # fmt: skip
            if on_archived is not None:
                on_archived(letter)

    return archive
