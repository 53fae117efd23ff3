"""In-memory twin of :class:`shared.accounts.domains.DomainStore`: users' sending domains, the state
of their checks, and the ``domain_claims`` index.

It keeps what the store's callers depend on: every round trip yields to the event loop (over
a :mod:`tests.fakes.wire`, where a simulator injects faults); every write to a domain is a
lightweight transaction that applies only when its condition holds at that moment (no write
resurrects a removed domain; a check's write lands only on the domain as it was read); the
index is written before a domain is added and cleared after it is removed, and reads keep
only the entries whose domain exists; timestamps come back as Cassandra returns them (UTC,
millisecond precision). ``tests/contracts/test_domain_stores.py`` runs one suite over this
twin and the real store.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

from services.api.domain_claims import related
from shared.accounts.domains import MAX_DOMAINS, Claim, Domains, SendingDomain
from tests.fakes.wire import LOOPBACK, Kind, Wire

_CHECKED = frozenset(
    {"checked_at", "seen_at", "verified_at", "missing_since", "unverified_at", "unverified_reason"}
)


def _stored(value: object) -> Any:
    """A cell as read back from Cassandra: timestamps in UTC at millisecond precision."""
    if isinstance(value, datetime):
        value = value.astimezone(UTC)
        return value.replace(microsecond=value.microsecond // 1000 * 1000)
    return value


def _zone(domain: str) -> str:
    return ".".join(domain.split(".")[-2:])


class FakeDomainStore(Domains):
    """Twin of :class:`shared.accounts.domains.DomainStore` (every operation)."""

    def __init__(self, wire: Wire = LOOPBACK) -> None:
        self.wire = wire
        self.rows: dict[tuple[uuid.UUID, str], dict[str, Any]] = {}
        self.index_rows: set[tuple[str, str, uuid.UUID]] = set()
        """(zone, domain, user) of ``domain_claims``."""

    async def _trip(self, op: str, kind: Kind) -> Any:
        return await self.wire.trip(op, kind)

    def legacy(self, user_id: uuid.UUID, domain: str, *, verified: bool = True) -> None:
        """A domain as a release before the checks wrote it: no index entry, no check yet."""
        now = _stored(datetime.now(UTC))
        row = {"proof": secrets.token_urlsafe(24), "created_at": now}
        self.rows[(user_id, domain)] = {**row, "verified_at": now if verified else None}

    async def add(self, user_id: uuid.UUID, domain: str) -> SendingDomain:
        await self.index(user_id, domain)
        trip = await self._trip("domains.add", "lwt")
        if (user_id, domain) not in self.rows:
            self.rows[(user_id, domain)] = {
                "proof": secrets.token_urlsafe(24),
                "created_at": _stored(datetime.now(UTC)),
            }
        trip.landed()
        found = await self.get(user_id, domain)
        assert found is not None
        return found

    async def get(self, user_id: uuid.UUID, domain: str) -> SendingDomain | None:
        trip = await self._trip("domains.get", "read")
        row = self.rows.get((user_id, domain))
        trip.landed()
        return _domain(domain, row) if row is not None else None

    async def all(self, user_id: uuid.UUID) -> list[SendingDomain]:
        trip = await self._trip("domains.all", "read")
        found = sorted((d, row) for (u, d), row in self.rows.items() if u == user_id)
        trip.landed()
        return [_domain(d, row) for d, row in found[: MAX_DOMAINS + 1]]

    async def verified(self, user_id: uuid.UUID) -> frozenset[str]:
        return frozenset(d.domain for d in await self.all(user_id) if d.verified)

    async def mark_verified(self, user_id: uuid.UUID, domain: str) -> bool:
        trip = await self._trip("domains.mark_verified", "lwt")
        row = self.rows.get((user_id, domain))
        if row is not None:
            now = _stored(datetime.now(UTC))
            row.update(verified_at=now, seen_at=now, checked_at=now, missing_since=None)
            row.update(unverified_at=None, unverified_reason=None)
        trip.landed()
        return row is not None

    async def record(
        self, user_id: uuid.UUID, read: SendingDomain, cells: Mapping[str, object]
    ) -> bool:
        unknown = set(cells) - _CHECKED
        if unknown:
            raise ValueError(f"not a column a check writes: {sorted(unknown)}")
        trip = await self._trip("domains.record", "lwt")
        row = self.rows.get((user_id, read.domain))
        applies = row is not None and (
            row["proof"],
            row.get("verified_at"),
            row.get("missing_since"),
        ) == (read.token, read.verified_at, read.missing_since)
        if row is not None and applies:
            row.update({name: _stored(value) for name, value in cells.items()})
        trip.landed()
        return applies

    async def remove(self, user_id: uuid.UUID, domain: str) -> bool:
        trip = await self._trip("domains.remove", "lwt")
        removed = self.rows.pop((user_id, domain), None) is not None
        trip.landed()
        if not removed:
            return False
        trip = await self._trip("domains.unindex", "write")
        self.index_rows.discard((_zone(domain), domain, user_id))
        trip.landed()
        return True

    async def every(self) -> AsyncIterator[tuple[uuid.UUID, SendingDomain]]:
        trip = await self._trip("domains.every", "read")
        found = list(self.rows.items())
        trip.landed()
        for (user_id, domain), row in found:
            yield user_id, _domain(domain, row)

    async def index(self, user_id: uuid.UUID, domain: str) -> None:
        trip = await self._trip("domains.index", "write")
        self.index_rows.add((_zone(domain), domain, user_id))
        trip.landed()

    async def claims(self, domain: str, limit: int = 200) -> list[Claim]:
        trip = await self._trip("domains.claims", "read")
        entries = [
            (u, name)
            for zone, name, u in sorted(self.index_rows)
            if zone == _zone(domain) and related(domain, name)
        ]
        trip.landed()
        found = [(u, await self.get(u, name)) for u, name in entries]
        return [Claim(u, d) for u, d in found if d is not None]

    async def index_all(self) -> int:
        count = 0
        async for user_id, d in self.every():
            await self.index(user_id, d.domain)
            count += 1
        return count


def _domain(domain: str, row: Mapping[str, Any]) -> SendingDomain:
    return SendingDomain(
        domain=domain,
        token=row["proof"],
        created_at=row["created_at"],
        verified_at=row.get("verified_at"),
        seen_at=row.get("seen_at"),
        checked_at=row.get("checked_at"),
        missing_since=row.get("missing_since"),
        unverified_at=row.get("unverified_at"),
        unverified_reason=row.get("unverified_reason"),
    )
