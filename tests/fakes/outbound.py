"""Twins of the stores of :mod:`shared.outbound`: users' webhook endpoints and their queue.

In-memory twins of the users' webhook stores: :class:`FakeHookStore` (endpoints,
:class:`shared.outbound.hook_store.HookStore`) and :class:`FakeHookQueue` (queues, leases, cursors,
messages, replays and the delivery log, :class:`shared.outbound.hook_queue.HookQueue`), the tables
of ``deploy/cql/0023_user_webhooks.cql``; and :class:`FakeDeliverer`, an endpoint's side of
``shared.outbound.hook_delivery.Deliverer.send`` answering from a script.

What they keep of Cassandra:

* one :meth:`tests.fakes.wire.Wire.trip` per round trip the real store makes, in the same
  order (a logged batch is one; reading the queue is one for its hours, then one per hour;
  the log one per day read), so a simulator can fail a request before it applies, lose its
  answer after it applied or end the process there; a round trip's effect is applied at
  once, so concurrent callers interleave between round trips as they do against Cassandra;
* lightweight transactions (``IF owner = ?``, ``IF owner = null``, ``IF enabled = true``,
  ``IF NOT EXISTS``) apply only when their condition holds at that moment, and a missing row's
  columns are null to them;
* an UPDATE of a missing row creates it with the cells it writes (an upsert), a DELETE
  removes the row, and a row is read while any of its cells (or the marker an INSERT writes)
  lives; writes land in the order they are applied (last write wins);
* TTLs (``USING TTL`` and each table's ``default_time_to_live``) expire each cell on its own,
  counted as Cassandra counts them: in whole seconds of the server's clock (``now``), a cell
  written at 10.9 s with a TTL of 1 s is gone at 11 s;
* clustering order: a queue's hours oldest first, each hour's events by ``timeuuid`` (time,
  then clock sequence and node as signed bytes), the log newest first; a full scan of
  ``user_webhooks`` in token order (Murmur3 of the user id), 500 rows a page;
* timestamps read back as the driver gives them (UTC, millisecond precision), and timeuuids
  (``seq``, the log's ``at``) taken by the client, as the real store takes them.

Which rows of ``user_webhooks`` are endpoints is decided by the production function
(:func:`shared.outbound.hook_store.endpoints_in`). ``tests/contracts/test_hook_stores.py`` runs one
suite over these twins and the real stores.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

from cassandra.murmur3 import murmur3
from cassandra.util import min_uuid_from_time, unix_time_from_uuid1

from shared.delivery.recipients import timeuuid_order
from shared.infra.db import utc
from shared.outbound import outbound_signing
from shared.outbound.hook_delivery import Outcome
from shared.outbound.hook_queue import (
    ENQUEUE_WINDOW,
    LOG_DAYS,
    REPLAY_MARK_SECONDS,
    Cursor,
    Deliveries,
    Delivery,
    Pending,
    Queued,
    enqueued,
    hour_of,
)
from shared.outbound.hook_store import PREVIOUS_SECRET_FOR, Endpoint, Endpoints, endpoints_in
from shared.outbound.outbound_retry import Health
from shared.outbound.user_hooks import HookEmitter
from tests.fakes.cassandra import Row, as_stored
from tests.fakes.wire import LOOPBACK, Kind, Trip, Wire

#: ``default_time_to_live`` of ``user_webhook_queue`` and ``user_webhook_hours`` (8 days).
QUEUE_TTL: Final = 691_200


#: ``default_time_to_live`` of ``user_webhook_messages`` and ``user_webhook_deliveries``.
MONTH_TTL: Final = 2_592_000


#: ``default_time_to_live`` of ``user_webhook_replays``.
REPLAYS_TTL: Final = 86_400


#: Rows of a page of the sweep's full scan (``HookStore.every_endpoint``).
SCAN_PAGE: Final = 500


#: Each operation's round trips, and what each is (``tests.fakes.wire.Kind``): the names a
#: simulator aims its faults at.
HOOK_OPERATION_KINDS: Final[dict[str, Kind]] = {
    "hooks.create": "write",
    "hooks.delete": "write",
    "hooks.disable": "lwt",
    "hooks.endpoint": "read",
    "hooks.endpoints": "read",
    "hooks.every_endpoint": "read",
    "hooks.rotate": "write",
    "hooks.set_health": "write",
    "hooks.update": "write",
    "hookqueue.claim_replay": "lwt",
    "hookqueue.cursor": "read",
    "hookqueue.deliveries": "read",
    "hookqueue.done": "write",
    "hookqueue.enqueue": "write",
    "hookqueue.hours": "read",
    "hookqueue.log": "write",
    "hookqueue.message": "read",
    "hookqueue.move": "lwt",
    "hookqueue.pending": "read",
    "hookqueue.release_lease": "lwt",
    "hookqueue.renew_lease": "lwt",
    "hookqueue.replay_answered": "write",
    "hookqueue.replay_done": "write",
    "hookqueue.replay_request": "lwt",
    "hookqueue.reset": "write",
    "hookqueue.start": "write",
    "hookqueue.take_lease": "lwt",
}


#: ``user_webhooks``' columns besides its key, as ``HookStore`` selects them.
_ENDPOINT_COLUMNS: Final = (
    "url",
    "events",
    "secret",
    "created_at",
    "enabled",
    "previous_secret",
    "previous_until",
    "disabled_at",
    "disabled_reason",
    "failing_since",
    "failures",
)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _expiry(now: datetime, ttl: int | None) -> datetime | None:
    """When a cell written at ``now`` with ``ttl`` dies: Cassandra adds the TTL to the
    server's time in whole seconds, so a cell lives between ``ttl - 1`` and ``ttl`` seconds."""
    if not ttl:
        return None
    return now.replace(microsecond=0) + timedelta(seconds=ttl)


class _Twin:
    """What both twins share: the server's clock and the wire."""

    def __init__(self, now: Callable[[], datetime], wire: Wire) -> None:
        self.now = now
        """Server time: TTLs count on it, and the real store's server-side times come from it."""
        self.wire = wire
        """How each round trip travels (``tests.fakes.wire``): where a simulator's faults go."""
        self.calls: list[str] = []
        """Every round trip made, by operation name, in order."""

    async def _trip(self, op: str) -> Trip:
        trip = await self.wire.trip(op, HOOK_OPERATION_KINDS[op])
        self.calls.append(op)
        return trip


# ---------------------------------------------------------------------- endpoints


class FakeHookStore(_Twin, Endpoints):
    """Twin of :class:`shared.outbound.hook_store.HookStore`: ``user_webhooks``, one partition per
    user."""

    def __init__(self, now: Callable[[], datetime] = _utcnow, wire: Wire = LOOPBACK) -> None:
        super().__init__(now, wire)
        self.rows: dict[uuid.UUID, dict[uuid.UUID, Row]] = {}
        """user -> endpoint -> row."""

    def _selected(self, user_id: uuid.UUID, endpoint_id: uuid.UUID) -> dict[str, Any] | None:
        row = self.rows.get(user_id, {}).get(endpoint_id)
        live = row.read(self.now()) if row else None
        if live is None:
            return None
        selected = {"user_id": user_id, "endpoint_id": endpoint_id}
        return selected | {c: live.get(c) for c in _ENDPOINT_COLUMNS}

    def _write(
        self, endpoint: Endpoint, values: Mapping[str, Any], *, insert: bool = False
    ) -> None:
        partition = self.rows.setdefault(endpoint.user_id, {})
        row = partition.setdefault(endpoint.endpoint_id, Row())
        row.write({c: _cql(v) for c, v in values.items()}, None, insert=insert)

    async def endpoints(self, user_id: uuid.UUID) -> list[Endpoint]:
        trip = await self._trip("hooks.endpoints")
        # Clustering order (endpoint ids are version 4: Cassandra orders them as Python does).
        rows = [self._selected(user_id, e) for e in sorted(self.rows.get(user_id, {}))]
        trip.landed()
        return endpoints_in(r for r in rows if r is not None)

    async def endpoint(self, user_id: uuid.UUID, endpoint_id: uuid.UUID) -> Endpoint | None:
        trip = await self._trip("hooks.endpoint")
        row = self._selected(user_id, endpoint_id)
        trip.landed()
        found = endpoints_in([row] if row else [])
        return found[0] if found else None

    async def create(
        self, user_id: uuid.UUID, url: str, events: frozenset[str], now: datetime
    ) -> Endpoint:
        endpoint = Endpoint(user_id, uuid.uuid4(), url, events, outbound_signing.new_secret(), now)
        trip = await self._trip("hooks.create")
        values = {
            "url": url,
            "events": events,
            "secret": endpoint.secret,
            "created_at": now,
            "enabled": True,
            "failures": 0,
        }
        self._write(endpoint, values, insert=True)
        trip.landed()
        return endpoint

    async def update(
        self,
        endpoint: Endpoint,
        *,
        url: str | None = None,
        events: frozenset[str] | None = None,
        enabled: bool | None = None,
    ) -> Endpoint:
        changed = replace(
            endpoint,
            url=url if url is not None else endpoint.url,
            events=events if events is not None else endpoint.events,
            enabled=enabled if enabled is not None else endpoint.enabled,
        )
        if enabled is True and not endpoint.enabled:
            changed = replace(changed, disabled_at=None, disabled_reason=None, health=Health())
        trip = await self._trip("hooks.update")
        self._write(
            endpoint,
            {
                "url": changed.url,
                "events": changed.events,
                "enabled": changed.enabled,
                "disabled_at": changed.disabled_at,
                "disabled_reason": changed.disabled_reason,
                "failing_since": changed.health.failing_since,
                "failures": changed.health.failures,
            },
        )
        trip.landed()
        return changed

    async def delete(self, endpoint: Endpoint) -> None:
        trip = await self._trip("hooks.delete")
        self.rows.get(endpoint.user_id, {}).pop(endpoint.endpoint_id, None)
        trip.landed()

    async def rotate(self, endpoint: Endpoint, now: datetime) -> Endpoint:
        rotated = replace(
            endpoint,
            secret=outbound_signing.new_secret(),
            previous_secret=endpoint.secret,
            previous_until=now + PREVIOUS_SECRET_FOR,
        )
        trip = await self._trip("hooks.rotate")
        self._write(
            endpoint,
            {
                "secret": rotated.secret,
                "previous_secret": rotated.previous_secret,
                "previous_until": rotated.previous_until,
            },
        )
        trip.landed()
        return rotated

    async def set_health(self, endpoint: Endpoint, health: Health) -> None:
        trip = await self._trip("hooks.set_health")
        self._write(endpoint, {"failing_since": health.failing_since, "failures": health.failures})
        trip.landed()

    async def disable(self, endpoint: Endpoint, reason: str, now: datetime) -> bool:
        trip = await self._trip("hooks.disable")
        row = self._selected(endpoint.user_id, endpoint.endpoint_id)
        applied = row is not None and row["enabled"] is True
        if applied:
            values = {"enabled": False, "disabled_at": now, "disabled_reason": reason}
            self._write(endpoint, values)
        trip.landed()
        return applied

    async def every_endpoint(self) -> AsyncIterator[tuple[uuid.UUID, uuid.UUID]]:
        after: tuple[int, uuid.UUID] | None = None
        while True:
            trip = await self._trip("hooks.every_endpoint")
            # A page resumes after the last row of the one before, as a paging state does.
            keys = sorted(
                (_token(user_id), endpoint_id, user_id)
                for user_id, partition in self.rows.items()
                for endpoint_id in partition
            )
            page = [
                (user_id, endpoint_id, row)
                for token, endpoint_id, user_id in keys
                if after is None or (token, endpoint_id) > after
                if (row := self._selected(user_id, endpoint_id)) is not None
            ][:SCAN_PAGE]
            trip.landed()
            for user_id, endpoint_id, row in page:
                if row["enabled"]:
                    yield user_id, endpoint_id
            if len(page) < SCAN_PAGE:
                return
            after = (_token(page[-1][0]), page[-1][1])


def _token(user_id: uuid.UUID) -> int:
    """The partition's token (Murmur3Partitioner): a full scan's order."""
    return int(murmur3(user_id.bytes))


def _cql(value: Any) -> Any:
    """A value as Cassandra keeps it: timestamps at millisecond precision, an empty set as
    null."""
    if isinstance(value, datetime):
        return as_stored(value)
    if isinstance(value, frozenset | set):
        return frozenset(value) or None
    return value


# ---------------------------------------------------------------------- queues


class FakeHookQueue(_Twin, Deliveries):
    """Twin of :class:`shared.outbound.hook_queue.HookQueue`: every endpoint's queue in hour
    buckets, its cursor row (lease, low-water mark, attempts), its messages and replay requests, and
    its delivery log."""

    def __init__(self, now: Callable[[], datetime] = _utcnow, wire: Wire = LOOPBACK) -> None:
        super().__init__(now, wire)
        self.queue: dict[tuple[uuid.UUID, datetime], dict[uuid.UUID, Row]] = {}
        """``user_webhook_queue``: (endpoint, hour) -> seq -> row."""
        self.hours: dict[uuid.UUID, dict[datetime, Row]] = {}
        """``user_webhook_hours``: endpoint -> hour -> row."""
        self.cursors: dict[uuid.UUID, Row] = {}
        """``user_webhook_cursors``: endpoint -> row (``owner`` with the lease's TTL)."""
        self.messages: dict[tuple[uuid.UUID, str], Row] = {}
        """``user_webhook_messages``: (endpoint, msg_id) -> row."""
        self.replays: dict[tuple[uuid.UUID, str], dict[str, Row]] = {}
        """``user_webhook_replays``: (endpoint, msg_id) -> Idempotency-Key -> row."""
        self.log_rows: dict[tuple[uuid.UUID, date], dict[uuid.UUID, Row]] = {}
        """``user_webhook_deliveries``: (endpoint, day) -> at -> row."""

    def _expiry(self, ttl: int | None) -> datetime | None:
        return _expiry(self.now(), ttl)

    def _live(self, row: Row | None) -> dict[str, Any] | None:
        return row.read(self.now()) if row is not None else None

    # ------------------------------------------------------------------ queue

    async def enqueue(self, rows: Sequence[Queued]) -> None:
        # The real store's shape: numbered here in order, slices written eight at a time.
        numbered = [(uuid.uuid1(), row) for row in rows]
        window = asyncio.Semaphore(ENQUEUE_WINDOW)

        async def one(part: Sequence[tuple[uuid.UUID, Queued]]) -> None:
            async with window:
                await self._enqueue(part)

        await asyncio.gather(*(one(numbered[run.start : run.stop]) for run in enqueued(rows)))

    async def _enqueue(self, rows: Sequence[tuple[uuid.UUID, Queued]]) -> None:
        """One slice, with the ``seq`` each event was given: one logged batch (all or none)."""
        if not rows:
            return
        trip = await self._trip("hookqueue.enqueue")
        queue_expires, month = self._expiry(QUEUE_TTL), self._expiry(MONTH_TTL)
        for seq, row in rows:
            hour = as_stored(hour_of(datetime.fromtimestamp(unix_time_from_uuid1(seq), UTC)))
            values = {
                "msg_id": row.msg_id,
                "type": row.type,
                "body": row.body,
                "replay": row.replay,
                "done": False,
            }
            partition = self.queue.setdefault((row.endpoint_id, hour), {})
            partition.setdefault(seq, Row()).write(values, queue_expires, insert=True)
            hours = self.hours.setdefault(row.endpoint_id, {})
            hours.setdefault(hour, Row()).write({}, queue_expires, insert=True)
            if not row.replay:
                message = self.messages.setdefault((row.endpoint_id, row.msg_id), Row())
                message.write({"type": row.type, "body": row.body}, month, insert=True)
        trip.landed()

    async def pending(
        self, endpoint_id: uuid.UUID, since: datetime, *, limit: int = 100
    ) -> list[Pending]:
        trip = await self._trip("hookqueue.hours")
        first = as_stored(hour_of(since))
        hours = [
            hour
            for hour, row in sorted(self.hours.get(endpoint_id, {}).items())
            if hour >= first and self._live(row) is not None
        ]
        trip.landed()
        low = timeuuid_order(min_uuid_from_time(since.timestamp()))
        found: list[Pending] = []
        for hour in hours:
            trip = await self._trip("hookqueue.pending")
            partition = self.queue.get((endpoint_id, hour), {})
            rows: list[tuple[uuid.UUID, dict[str, Any]]] = []
            for seq in sorted(partition, key=timeuuid_order):
                live = self._live(partition[seq])
                # seq >= ? AND done = false (ALLOW FILTERING), LIMIT what may still be read.
                if timeuuid_order(seq) >= low and live is not None and live.get("done") is False:
                    rows.append((seq, live))
                    if len(rows) >= limit - len(found):
                        break
            trip.landed()
            for seq, r in rows:
                found.append(
                    Pending(
                        utc(hour),
                        seq,
                        r["msg_id"],
                        r["type"],
                        r["body"],
                        bool(r.get("replay")),
                    )
                )
                if len(found) >= limit:
                    return found
        return found

    async def done(self, endpoint_id: uuid.UUID, item: Pending) -> None:
        trip = await self._trip("hookqueue.done")
        partition = self.queue.setdefault((endpoint_id, as_stored(item.hour)), {})
        partition.setdefault(item.seq, Row()).write({"done": True}, self._expiry(QUEUE_TTL))
        trip.landed()

    # ------------------------------------------------------------------ lease and cursor

    def _cursor_row(self, endpoint_id: uuid.UUID) -> Row:
        return self.cursors.setdefault(endpoint_id, Row())

    def _owner(self, endpoint_id: uuid.UUID) -> uuid.UUID | None:
        live = self._live(self.cursors.get(endpoint_id))
        return live.get("owner") if live else None

    async def start(self, endpoint_id: uuid.UUID, now: datetime) -> None:
        trip = await self._trip("hookqueue.start")
        self._cursor_row(endpoint_id).write({"since": as_stored(now), "attempts": 0}, None)
        trip.landed()

    async def reset(self, endpoint_id: uuid.UUID) -> None:
        trip = await self._trip("hookqueue.reset")
        self._cursor_row(endpoint_id).write({"attempts": 0, "next_try": None}, None)
        trip.landed()

    async def take_lease(self, endpoint_id: uuid.UUID, owner: uuid.UUID, ttl: int) -> bool:
        trip = await self._trip("hookqueue.take_lease")
        applied = self._owner(endpoint_id) is None  # IF owner = null
        if applied:
            self._cursor_row(endpoint_id).write({"owner": owner}, self._expiry(ttl))
        trip.landed()
        return applied

    async def renew_lease(self, endpoint_id: uuid.UUID, owner: uuid.UUID, ttl: int) -> bool:
        trip = await self._trip("hookqueue.renew_lease")
        applied = self._owner(endpoint_id) == owner
        if applied:
            self._cursor_row(endpoint_id).write({"owner": owner}, self._expiry(ttl))
        trip.landed()
        return applied

    async def release_lease(self, endpoint_id: uuid.UUID, owner: uuid.UUID) -> None:
        trip = await self._trip("hookqueue.release_lease")
        if self._owner(endpoint_id) == owner:
            self._cursor_row(endpoint_id).write({"owner": None}, None)
        trip.landed()

    async def cursor(self, endpoint_id: uuid.UUID) -> Cursor:
        trip = await self._trip("hookqueue.cursor")
        live = self._live(self.cursors.get(endpoint_id))
        trip.landed()
        if live is None:
            return Cursor()
        return Cursor(utc(live.get("since")), live.get("attempts") or 0, utc(live.get("next_try")))

    async def move(self, endpoint_id: uuid.UUID, owner: uuid.UUID, cursor: Cursor) -> bool:
        trip = await self._trip("hookqueue.move")
        applied = self._owner(endpoint_id) == owner
        if applied:
            values = {
                "since": as_stored(cursor.since) if cursor.since else None,
                "attempts": cursor.attempts,
                "next_try": as_stored(cursor.next_try) if cursor.next_try else None,
            }
            self._cursor_row(endpoint_id).write(values, None)
        trip.landed()
        return applied

    # ------------------------------------------------------------------ messages and replay

    async def message(self, endpoint_id: uuid.UUID, msg_id: str) -> Queued | None:
        trip = await self._trip("hookqueue.message")
        live = self._live(self.messages.get((endpoint_id, msg_id)))
        trip.landed()
        if live is None or live.get("body") is None:
            return None
        return Queued(endpoint_id, msg_id, live["type"], live["body"], replay=True)

    async def claim_replay(
        self, endpoint_id: uuid.UUID, msg_id: str, replay_id: uuid.UUID
    ) -> uuid.UUID:
        trip = await self._trip("hookqueue.claim_replay")
        row = self.messages.setdefault((endpoint_id, msg_id), Row())
        waiting: uuid.UUID | None = (self._live(row) or {}).get("replay_pending")
        if waiting is None:  # IF replay_pending = null
            row.write({"replay_pending": replay_id}, self._expiry(REPLAY_MARK_SECONDS))
        trip.landed()
        return waiting or replay_id

    async def replay_request(
        self, endpoint_id: uuid.UUID, msg_id: str, key: str, replay_id: uuid.UUID
    ) -> tuple[uuid.UUID, bool] | None:
        trip = await self._trip("hookqueue.replay_request")
        partition = self.replays.setdefault((endpoint_id, msg_id), {})
        first = self._live(partition.get(key))
        if first is None:  # IF NOT EXISTS
            row = partition.setdefault(key, Row())
            row.write({"replay_id": replay_id}, self._expiry(REPLAYS_TTL), insert=True)
        trip.landed()
        if first is None:
            return None
        return first["replay_id"], bool(first.get("queued"))

    async def replay_answered(
        self, endpoint_id: uuid.UUID, msg_id: str, key: str, replay_id: uuid.UUID, queued: bool
    ) -> None:
        trip = await self._trip("hookqueue.replay_answered")
        row = self.replays.setdefault((endpoint_id, msg_id), {}).setdefault(key, Row())
        row.write({"replay_id": replay_id, "queued": queued}, self._expiry(REPLAYS_TTL))
        trip.landed()

    async def replay_done(self, endpoint_id: uuid.UUID, msg_id: str) -> None:
        trip = await self._trip("hookqueue.replay_done")
        row = self.messages.setdefault((endpoint_id, msg_id), Row())
        row.write({"replay_pending": None}, None)
        trip.landed()

    # ------------------------------------------------------------------ delivery log

    async def log(self, endpoint_id: uuid.UUID, entry: Delivery) -> None:
        at = uuid.uuid1()  # the client's, as the real store's
        trip = await self._trip("hookqueue.log")
        partition = self.log_rows.setdefault((endpoint_id, entry.at.astimezone(UTC).date()), {})
        values = {
            "msg_id": entry.msg_id,
            "type": entry.type,
            "attempt": entry.attempt,
            "status": entry.status,
            "error": entry.error,
            "duration_ms": entry.duration_ms,
        }
        partition.setdefault(at, Row()).write(values, self._expiry(MONTH_TTL), insert=True)
        trip.landed()

    async def deliveries(
        self, endpoint_id: uuid.UUID, today: date, *, limit: int = 100
    ) -> list[Delivery]:
        out: list[Delivery] = []
        for back in range(LOG_DAYS + 1):
            trip = await self._trip("hookqueue.deliveries")
            partition = self.log_rows.get((endpoint_id, today - timedelta(days=back)), {})
            rows: list[tuple[uuid.UUID, dict[str, Any]]] = []
            for at in sorted(partition, key=timeuuid_order, reverse=True):  # at DESC
                live = self._live(partition[at])
                if live is not None and len(rows) < limit - len(out):
                    rows.append((at, live))
            trip.landed()
            out.extend(
                Delivery(
                    datetime.fromtimestamp(unix_time_from_uuid1(at), UTC),
                    r["msg_id"],
                    r["type"],
                    r["attempt"],
                    r.get("status"),
                    r.get("error"),
                    r["duration_ms"],
                )
                for at, r in rows
            )
            if len(out) >= limit:
                break
        return out


# ---------------------------------------------------------------------- the services over them


def emitter_over(
    store: FakeHookStore, queue: FakeHookQueue, broker: Any, *, cache_seconds: float = 0.0
) -> HookEmitter:
    """The real :class:`shared.outbound.user_hooks.HookEmitter` over the twins (it builds its stores
    from a ``Database``, doing no I/O: they are swapped for the twins before it does any).
    ``cache_seconds`` defaults to none: its cache runs on the machine's monotonic clock."""
    emitter = HookEmitter(None, broker, cache_seconds=cache_seconds)  # type: ignore[arg-type]
    emitter.store = store  # type: ignore[assignment]
    emitter.queue = queue  # type: ignore[assignment]
    return emitter


#: What an endpoint answers to one delivery: an HTTP status, or an error (no answer).
Answer = int | str


@dataclass(frozen=True)
class Request:
    """One delivery as the endpoint got it."""

    url: str
    msg_id: str
    body: bytes
    secrets: tuple[str, ...]
    timestamp: float
    status: int | None


@dataclass
class FakeDeliverer:
    """Stands in for :class:`shared.outbound.hook_delivery.Deliverer` (its ``send``): each url
    answers from its script (``answers``, then 200), every request is kept in :attr:`requests`."""

    answers: dict[str, list[Answer]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    duration_ms: int = 12

    def script(self, url: str, *answers: Answer) -> None:
        """``url`` answers these to its next deliveries, in order."""
        self.answers.setdefault(url, []).extend(answers)

    async def send(
        self, url: str, msg_id: str, body: bytes, secrets: Sequence[str], now: float
    ) -> Outcome:
        script = self.answers.get(url)
        answer = script.pop(0) if script else 200
        status = answer if isinstance(answer, int) else None
        self.requests.append(Request(url, msg_id, body, tuple(secrets), now, status))
        if isinstance(answer, str):
            return Outcome(None, answer, self.duration_ms)
        return Outcome(answer, None, self.duration_ms)

    def got(self, url: str, *, ok_only: bool = True) -> list[str]:
        """The webhook-ids ``url`` got, in order (only those it answered 2xx by default)."""
        return [
            r.msg_id
            for r in self.requests
            if r.url == url and (not ok_only or (r.status is not None and 200 <= r.status < 300))
        ]
