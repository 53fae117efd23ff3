"""Read models of the batch API: paging cursors, the batch list, a batch's overview and the
per-recipient log page.

Each query returns typed values (UUIDs, aware datetimes, dataclasses), never answer-shaped
dicts: the JSON API (``services/api/answers.py``), the original's API
(``services/api/original_form.py``) and the dashboard (``services/api/dashboard/views.py``)
each shape them for their own audience.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import orjson
from starlette.requests import Request

from shared.core.digits import natural
from shared.delivery import precedence, recipients
from shared.delivery.attempts import Attempt, Attempts, chunk_line, recipient_line
from shared.delivery.batchstore import BatchHeader, BatchStore, month_of, timeuuid_datetime
from shared.delivery.precedence import visible
from shared.delivery.recipients import RecipientStore
from shared.infra.db import Database, utc
from shared.infra.http import ApiError
from shared.templates import template_use

#: How far back (in months) the batch list looks for older batches.
LIST_HORIZON_MONTHS = 36

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing and the cursor of the next (None on the last page)."""

    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class BatchSummary:
    """A batch as the batch list shows it."""

    batch_id: uuid.UUID
    subject: str
    recipients: int
    created_at: datetime
    status: str


@dataclass(frozen=True, slots=True)
class BatchOverview:
    """A batch: its header, its status and its recipients counted by state, latest event and
    failure reason (the five most common)."""

    header: BatchHeader
    status: str
    counts: dict[str, int]
    events: dict[str, int]
    failure_reasons: dict[str, int]


@dataclass(frozen=True, slots=True)
class Step:
    """One provider call for a recipient: an attempt of its chunk, or a re-send of it alone."""

    attempt: int
    provider: str
    state: str
    at: datetime | None
    error: str | None
    resolution: str | None = None
    """How an ambiguous call was settled: ``accepted``, ``partial`` or ``not_accepted``."""
    template_version: int | None = None
    """The template version the call was made with (None: none, or none recorded)."""


@dataclass(frozen=True, slots=True)
class ProviderEvent:
    """One event a provider reported for a recipient (``log_events``)."""

    at: datetime
    provider: str
    kind: str
    detail: str | None


@dataclass(frozen=True, slots=True)
class RecipientLog:
    """One recipient of a batch: its visible state, providers, and history."""

    log_id: uuid.UUID
    email: str
    name: str | None
    state: str
    event: str
    providers: dict[str, str]
    """Provider code → its latest word on this recipient (``dropped: Spam Content``)."""
    message_ids: dict[str, str]
    reason: str | None
    updated_at: datetime | None
    attempts: list[Step]
    resends: list[Step]
    events: list[ProviderEvent]
    """Oldest first."""
    template_version: int | None = None
    """The template version this recipient got (None: the batch was not from a template)."""

    @property
    def accepted_by(self) -> dict[str, bool]:
        """Provider code → whether that provider took the recipient."""
        return {p: v in _ACCEPTED for p, v in self.providers.items() if p != "safedelivr"}


def page_limit(request: Request, *, default: int = 20, maximum: int = 500) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    limit = natural(raw)
    if limit is None or not 1 <= limit <= maximum:
        raise ApiError(
            422,
            "invalid_fields",
            "bad limit",
            fields={"limit": f"must be a whole number from 1 to {maximum}"},
        )
    return limit


def path_uuid(request: Request, name: str) -> uuid.UUID:
    """A batch id from the path: our ids are time UUIDs (Cassandra refuses any other kind in
    a ``timeuuid`` column), so anything else names nothing."""
    try:
        value = uuid.UUID(request.path_params[name])
    except ValueError:
        value = None
    if value is None or value.version != 1:
        raise ApiError(404, "not_found", f"no such {name.removesuffix('_id')}")
    return value


def encode_cursor(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")


def cursor_uuid(value: object, *, time_based: bool = False) -> uuid.UUID:
    """A UUID from a decoded cursor (client input: any JSON value); ValueError otherwise."""
    if not isinstance(value, str):
        raise ValueError("not a UUID string")
    parsed = uuid.UUID(value)
    if time_based and parsed.version != 1:
        raise ValueError("not a time UUID")
    return parsed


def cursor_index(value: object) -> int:
    """A non-negative index from a decoded cursor; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("not an index")
    return value


def decode_cursor(cursor: str | None) -> dict[str, Any] | None:
    if not cursor:
        return None
    try:
        data = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(data, dict):
            raise ValueError("cursor is not an object")
    except ValueError:
        raise ApiError(400, "bad_cursor", "the cursor is malformed") from None
    return data


def _previous_month(month: str) -> str:
    year, mon = int(month[:4]), int(month[5:7])
    return f"{year - 1}-12" if mon == 1 else f"{year}-{mon - 1:02d}"


async def list_for_user(
    store: BatchStore, user_id: uuid.UUID, limit: int, cursor: str | None
) -> Page[BatchSummary]:
    """Newest first, across monthly buckets, resuming after ``cursor``."""
    after = decode_cursor(cursor)
    try:
        # Batch ids are time UUIDs: Cassandra refuses to compare any other kind with them.
        last = cursor_uuid(after["after"], time_based=True) if after else None
    except (KeyError, ValueError):
        raise ApiError(400, "bad_cursor", "the cursor is malformed") from None
    month = month_of(last) if last else datetime.now(UTC).strftime("%Y-%m")
    items: list[dict[str, Any]] = []
    for _ in range(LIST_HORIZON_MONTHS):
        query = (
            "SELECT batch_id, subject, recipient_count FROM batches_by_user "
            "WHERE user_id = ? AND month = ?"
        )
        params: list[Any] = [user_id, month]
        if last is not None and month == month_of(last):
            query += " AND batch_id < ?"
            params.append(last)
        rows = await store.db.rows(query + " LIMIT ?", (*params, limit - len(items) + 1))
        for r in rows:
            items.append(r)
        if len(items) > limit:
            break
        month = _previous_month(month)
    more = len(items) > limit
    items = items[:limit]
    statuses = await asyncio.gather(*(store.status(r["batch_id"]) for r in items))
    data = [
        BatchSummary(
            batch_id=r["batch_id"],
            subject=r["subject"],
            recipients=r["recipient_count"],
            created_at=timeuuid_datetime(r["batch_id"]),
            status=status or "incomplete",
        )
        for r, status in zip(items, statuses, strict=True)
    ]
    next_cursor = encode_cursor({"after": str(data[-1].batch_id)}) if more and data else None
    return Page(data, next_cursor)


async def batch_counts(
    store: BatchStore, batch_id: uuid.UUID
) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Recipients per state, per latest event, and the reasons of the failed ones.

    A chunk none of whose recipients has a row of its own is counted from its row alone."""
    rows = await store.db.all_pages(
        f"SELECT {recipients.SELECT} FROM batches WHERE batch_id = ?",  # noqa: S608
        (batch_id,),
        page_size=5000,
    )
    states: Counter[str] = Counter()
    events: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for chunk, stored in recipients.by_chunk(rows).items():
        if len(stored) == 1 and stored[0]["log_id"] == recipients.CHUNK_ROW:
            seen = [visible(precedence.merge(stored[0], None))]
            weight = recipients.listed(stored[0])
        else:
            seen = [visible(r) for r in recipients.merged_chunk(batch_id, chunk, stored)]
            weight = 1
        for v in seen:
            states[v.state] += weight
            events[v.event] += weight
            if v.state == "failed" and v.reason:
                reasons[v.reason] += weight
    return states, events, reasons


async def recipient_history(
    db: Database, batch_id: uuid.UUID, log_ids: list[uuid.UUID]
) -> tuple[dict[uuid.UUID, list[ProviderEvent]], dict[uuid.UUID, list[Step]]]:
    """Provider events (oldest first) and single-recipient re-sends of the given recipients,
    by log id."""
    events: dict[uuid.UUID, list[ProviderEvent]] = {}
    resends: dict[uuid.UUID, list[Step]] = {}
    if not log_ids:
        return events, resends
    for row in await db.all_pages(
        "SELECT log_id, at, provider, kind, detail FROM log_events "
        "WHERE batch_id = ? AND log_id IN ?",
        (batch_id, log_ids),
    ):
        events.setdefault(row["log_id"], []).append(
            ProviderEvent(
                at=utc(row["at"]),
                provider=row["provider"],
                kind=row["kind"],
                detail=row["detail"] or None,
            )
        )
    for row in await db.all_pages(
        "SELECT line, attempt, provider, state, created_at, error, resolution, template_version "
        "FROM send_attempts WHERE batch_id = ? AND line IN ?",
        (batch_id, [recipient_line(i) for i in log_ids]),
    ):
        resends.setdefault(uuid.UUID(row["line"][1:]), []).append(
            Step(
                attempt=row["attempt"],
                provider=row["provider"],
                state=row["state"],
                at=utc(row["created_at"]) if row["created_at"] else None,
                error=_error_text(row["error"]) or None,
                resolution=row["resolution"],
                template_version=row.get("template_version"),
            )
        )
    for found in events.values():
        found.sort(key=lambda e: e.at)
    return events, resends


def _error_text(error: str | None) -> str:
    """The message of an attempt's ``<kind>|<message>`` error."""
    return (error or "").partition("|")[2]


def batch_status(header: BatchHeader, states: Counter[str]) -> str:
    if states.get("queued", 0) == 0 and header.recipient_count:
        return "failed" if states.get("failed", 0) == header.recipient_count else "completed"
    return header.status


def batch_overview(
    header: BatchHeader, states: Counter[str], events: Counter[str], reasons: Counter[str]
) -> BatchOverview:
    return BatchOverview(
        header=header,
        status=batch_status(header, states),
        counts={s: states.get(s, 0) for s in ("queued", "success", "failed")},
        events=dict(events),
        failure_reasons=dict(reasons.most_common(5)),
    )


async def overview(store: BatchStore, header: BatchHeader) -> BatchOverview:
    """A stored batch's overview (its recipients counted)."""
    return batch_overview(header, *await batch_counts(store, header.batch_id))


async def logs_page(
    store: BatchStore,
    attempts: Attempts,
    batch_id: uuid.UUID,
    limit: int,
    cursor: str | None,
    state: str | None,
) -> Page[RecipientLog]:
    after = decode_cursor(cursor)
    try:
        position = (cursor_index(after["chunk"]), cursor_uuid(after["log_id"])) if after else None
    except (KeyError, ValueError):
        raise ApiError(400, "bad_cursor", "the cursor is malformed") from None
    states = RecipientStore(store.db, store.stats)
    header = await store.header(batch_id)
    chunks = header.chunk_count if header else 0
    out: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None
    chunk = position[0] if position else 0
    while chunk < chunks and len(out) <= limit:
        rows = sorted(
            await states.chunk_rows(batch_id, chunk),
            key=lambda r: recipients.timeuuid_order(r["log_id"]),
        )
        for row in rows:
            if (
                position is not None
                and chunk == position[0]
                and recipients.timeuuid_order(row["log_id"])
                <= recipients.timeuuid_order(position[1])
            ):
                continue
            if state is None or visible(row).state == state:
                out.append(row)
                if len(out) > limit:
                    break
            last = row
        chunk += 1
    more = len(out) > limit or chunk < chunks
    out = out[:limit]
    history = {}
    for chunk in sorted({r["chunk"] for r in out}):
        history[chunk] = await attempts.line(batch_id, chunk_line(chunk))
    events, resends = await recipient_history(store.db, batch_id, [r["log_id"] for r in out])
    data = [
        _log_view(
            r,
            history.get(r["chunk"], []),
            events.get(r["log_id"], []),
            resends.get(r["log_id"], []),
            _version_sent(r, history.get(r["chunk"], []), resends.get(r["log_id"], []), header),
        )
        for r in out
    ]
    anchor = out[-1] if len(out) == limit and more else (last if more else None)
    next_cursor = (
        encode_cursor({"chunk": anchor["chunk"], "log_id": str(anchor["log_id"])})
        if anchor is not None
        else None
    )
    return Page(data, next_cursor)


#: Providers-map values that mean the provider took the recipient.
_ACCEPTED = frozenset({"sent", "deferred", "delivered", "opened", "clicked", "complained"})


def _updated_at(row: dict[str, Any], state: str) -> datetime | None:
    """When the recipient last changed: its give-up when that is what it shows."""
    when = row.get("last_update")
    if state == "failed" and row.get("gave_up_reason") and row.get("state") != "failed":
        when = row.get("gave_up_at") or when
    return utc(when) if when else None


def _version_sent(
    row: dict[str, Any], history: list[Attempt], resends: list[Step], header: BatchHeader | None
) -> int | None:
    """The template version a recipient got, as its attempts recorded it (the batch's plan
    for its chunk when they recorded none: attempts written before versions were)."""
    if header is None or header.message.template is None:
        return None
    return template_use.version_sent(
        row.get("evidence") or (),
        {a.attempt: a.template_version for a in history},
        {r.attempt: r.template_version for r in resends},
        template_use.version_for(header.message, row["chunk"]),
    )


def _log_view(
    row: dict[str, Any],
    history: list[Attempt],
    events: list[ProviderEvent],
    resends: list[Step],
    template_version: int | None = None,
) -> RecipientLog:
    seen = visible(row)
    return RecipientLog(
        log_id=row["log_id"],
        email=row["email"],
        name=row["name"],
        state=seen.state,
        event=seen.event,
        providers=dict(row["providers"] or {}),
        message_ids=dict(row["message_ids"] or {}),
        reason=seen.reason,
        updated_at=_updated_at(row, seen.state),
        attempts=[
            Step(
                attempt=a.attempt,
                provider=a.provider,
                state=a.state,
                at=a.started_at,
                error=_error_text(a.error) or None,
                resolution=a.resolution,
            )
            for a in history
        ],
        resends=resends,
        events=events,
        template_version=template_version,
    )
