"""Users' webhook endpoints in Cassandra: the only module that writes ``user_webhooks``
(``deploy/cql/0023_user_webhooks.cql``): a user's endpoints, one partition per user (at most
``hooks.max_endpoints``), with their url, event filter, secrets (the previous one signs too
for a day after a rotation), whether they are enabled and their run of failures. What is
queued for them and how it was delivered is ``shared.outbound.hook_queue``'s.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Final, Protocol

from shared.infra.db import Database, Row, utc
from shared.outbound import outbound_signing
from shared.outbound.outbound_retry import Health

#: How long a rotated-out secret keeps signing beside the new one.
PREVIOUS_SECRET_FOR: Final = timedelta(hours=24)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One of a user's webhook endpoints."""

    user_id: uuid.UUID
    endpoint_id: uuid.UUID
    url: str
    events: frozenset[str]
    secret: str
    created_at: datetime
    enabled: bool = True
    previous_secret: str | None = None
    previous_until: datetime | None = None
    disabled_at: datetime | None = None
    disabled_reason: str | None = None
    health: Health = field(default_factory=Health)

    @property
    def collecting(self) -> bool:
        """Whether events are queued for it: while enabled, and while disabled after failing
        (what happens meanwhile waits for it to be enabled again, for the queue's days); an
        endpoint its user turned off gets nothing."""
        return self.enabled or self.disabled_at is not None

    def secrets_in_force(self, now: datetime) -> list[str]:
        """The secrets that sign a delivery at ``now``, newest first."""
        if self.previous_secret and self.previous_until and now < self.previous_until:
            return [self.secret, self.previous_secret]
        return [self.secret]


def _endpoint(row: Row) -> Endpoint:
    return Endpoint(
        user_id=row["user_id"],
        endpoint_id=row["endpoint_id"],
        url=row["url"],
        events=frozenset(row["events"] or ()),
        secret=row["secret"],
        created_at=utc(row["created_at"]),
        enabled=bool(row["enabled"]),
        previous_secret=row["previous_secret"],
        previous_until=utc(row["previous_until"]),
        disabled_at=utc(row["disabled_at"]),
        disabled_reason=row["disabled_reason"],
        health=Health(utc(row["failing_since"]), row["failures"] or 0),
    )


def endpoints_in(rows: Iterable[Row]) -> list[Endpoint]:
    """The endpoints among rows of ``user_webhooks``, oldest first. A row is an endpoint when
    ``create`` wrote it (its ``created_at``): an UPDATE of a deleted endpoint (the worker
    recording the health of a delivery that was under way, a PATCH racing the DELETE) writes
    its own cells back, and those are not an endpoint."""
    return sorted(
        (_endpoint(r) for r in rows if r["created_at"] is not None), key=lambda e: e.created_at
    )


_SELECT_ENDPOINTS = (
    "SELECT user_id, endpoint_id, url, events, secret, created_at, enabled, previous_secret, "
    "previous_until, disabled_at, disabled_reason, failing_since, failures FROM user_webhooks "
)


class Endpoints(Protocol):
    """What callers use of :class:`HookStore` (the store, or its in-memory twin)."""

    async def endpoints(self, user_id: uuid.UUID) -> list[Endpoint]: ...

    async def endpoint(self, user_id: uuid.UUID, endpoint_id: uuid.UUID) -> Endpoint | None: ...

    async def create(
        self, user_id: uuid.UUID, url: str, events: frozenset[str], now: datetime
    ) -> Endpoint: ...

    async def update(
        self,
        endpoint: Endpoint,
        *,
        url: str | None = None,
        events: frozenset[str] | None = None,
        enabled: bool | None = None,
    ) -> Endpoint: ...

    async def delete(self, endpoint: Endpoint) -> None: ...

    async def rotate(self, endpoint: Endpoint, now: datetime) -> Endpoint: ...

    async def set_health(self, endpoint: Endpoint, health: Health) -> None: ...

    async def disable(self, endpoint: Endpoint, reason: str, now: datetime) -> bool: ...

    def every_endpoint(self) -> AsyncIterator[tuple[uuid.UUID, uuid.UUID]]: ...


class HookStore:
    """Every read and write of users' webhook endpoints and their queues."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------------ endpoints

    async def endpoints(self, user_id: uuid.UUID) -> list[Endpoint]:
        rows = await self.db.rows(_SELECT_ENDPOINTS + "WHERE user_id = ?", (user_id,))
        return endpoints_in(rows)

    async def endpoint(self, user_id: uuid.UUID, endpoint_id: uuid.UUID) -> Endpoint | None:
        row = await self.db.one(
            _SELECT_ENDPOINTS + "WHERE user_id = ? AND endpoint_id = ?",
            (user_id, endpoint_id),
        )
        found = endpoints_in([row] if row else [])
        return found[0] if found else None

    async def create(
        self, user_id: uuid.UUID, url: str, events: frozenset[str], now: datetime
    ) -> Endpoint:
        endpoint = Endpoint(user_id, uuid.uuid4(), url, events, outbound_signing.new_secret(), now)
        await self.db.execute(
            "INSERT INTO user_webhooks (user_id, endpoint_id, url, events, secret, created_at, "
            "enabled, failures) VALUES (?, ?, ?, ?, ?, ?, true, 0)",
            (user_id, endpoint.endpoint_id, url, set(events), endpoint.secret, now),
            idempotent=True,
        )
        return endpoint

    async def update(
        self,
        endpoint: Endpoint,
        *,
        url: str | None = None,
        events: frozenset[str] | None = None,
        enabled: bool | None = None,
    ) -> Endpoint:
        """Change what is given; enabling a disabled endpoint clears its failures (and the
        caller its waiting retry: ``HookQueue.reset``)."""
        changed = replace(
            endpoint,
            url=url if url is not None else endpoint.url,
            events=events if events is not None else endpoint.events,
            enabled=enabled if enabled is not None else endpoint.enabled,
        )
        reenabled = enabled is True and not endpoint.enabled
        if reenabled:
            changed = replace(changed, disabled_at=None, disabled_reason=None, health=Health())
        await self.db.execute(
            "UPDATE user_webhooks SET url = ?, events = ?, enabled = ?, disabled_at = ?, "
            "disabled_reason = ?, failing_since = ?, failures = ? "
            "WHERE user_id = ? AND endpoint_id = ?",
            (
                changed.url,
                set(changed.events),
                changed.enabled,
                changed.disabled_at,
                changed.disabled_reason,
                changed.health.failing_since,
                changed.health.failures,
                endpoint.user_id,
                endpoint.endpoint_id,
            ),
            idempotent=True,
        )
        return changed

    async def delete(self, endpoint: Endpoint) -> None:
        await self.db.execute(
            "DELETE FROM user_webhooks WHERE user_id = ? AND endpoint_id = ?",
            (endpoint.user_id, endpoint.endpoint_id),
            idempotent=True,
        )

    async def rotate(self, endpoint: Endpoint, now: datetime) -> Endpoint:
        """A new secret; the current one keeps signing for :data:`PREVIOUS_SECRET_FOR`."""
        rotated = replace(
            endpoint,
            secret=outbound_signing.new_secret(),
            previous_secret=endpoint.secret,
            previous_until=now + PREVIOUS_SECRET_FOR,
        )
        await self.db.execute(
            "UPDATE user_webhooks SET secret = ?, previous_secret = ?, previous_until = ? "
            "WHERE user_id = ? AND endpoint_id = ?",
            (
                rotated.secret,
                rotated.previous_secret,
                rotated.previous_until,
                endpoint.user_id,
                endpoint.endpoint_id,
            ),
            idempotent=True,
        )
        return rotated

    async def set_health(self, endpoint: Endpoint, health: Health) -> None:
        await self.db.execute(
            "UPDATE user_webhooks SET failing_since = ?, failures = ? "
            "WHERE user_id = ? AND endpoint_id = ?",
            (health.failing_since, health.failures, endpoint.user_id, endpoint.endpoint_id),
            idempotent=True,
        )

    async def disable(self, endpoint: Endpoint, reason: str, now: datetime) -> bool:
        """Disable an enabled endpoint; True for the one caller that did (it tells the user)."""
        row = await self.db.one(
            "UPDATE user_webhooks SET enabled = false, disabled_at = ?, disabled_reason = ? "
            "WHERE user_id = ? AND endpoint_id = ? IF enabled = true",
            (now, reason, endpoint.user_id, endpoint.endpoint_id),
        )
        return bool(row and row["[applied]"])

    async def every_endpoint(self) -> AsyncIterator[tuple[uuid.UUID, uuid.UUID]]:
        """(user, endpoint) of every enabled endpoint (the worker's sweep; a full scan of a
        small table, page by page)."""
        state: bytes | None = None
        while True:
            page = await self.db.execute(
                "SELECT user_id, endpoint_id, enabled FROM user_webhooks",
                page_size=500,
                paging_state=state,
            )
            for row in page.rows:
                if row["enabled"]:
                    yield row["user_id"], row["endpoint_id"]
            if page.paging_state is None:
                return
            state = page.paging_state
