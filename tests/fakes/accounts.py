"""Twins of the stores of :mod:`shared.accounts`: users and API keys (:class:`FakeAccounts`, in
:class:`tests.fakes.cassandra.FakeCassandra`), the recipient quota and rate windows,
preferences, sending domains and sign-up requests.

They keep the Cassandra semantics these stores depend on:

* every round trip yields to the event loop, so concurrent callers interleave where they
  would in production, and a lightweight transaction (``IF NOT EXISTS``, ``IF EXISTS``,
  ``IF col = ?``) applies only when its condition holds at that moment;
* timestamps come back as Cassandra returns them: naive UTC, millisecond precision;
* a ``USING TTL`` or a table's ``default_time_to_live`` expires each cell on its own: a row
  lives as long as any of its cells (or the marker an INSERT writes) does;
* an UPDATE of a missing row creates it (an upsert), a DELETE removes the whole row;
* rows cluster in Cassandra's order (text by its UTF-8 bytes, the order of ``str``).

Where a store derives something from what it read (hashing a session id, expiry, parsing and
verifying a key) the twins call the production functions themselves. The module-level
functions of :mod:`shared.accounts.accounts` take a ``Database``; :class:`FakeAccounts` offers them
as methods without it. ``tests/contracts/test_account_stores.py`` runs one suite over each twin
and the real store, so the twins cannot drift from what they stand in for.

The quota, the rate windows and preferences, as accepting a batch uses them, live in the
tables of :class:`tests.fakes.cassandra.FakeCassandra`: the quota and a rate window are
counters, added to and read back in separate round trips, so a counter update whose answer is
lost stays counted, as in Cassandra, and a refund is a row per batch (a repeat rewrites it).
``tests/contracts/test_acceptance_stores.py`` (the rate windows:
``tests/contracts/test_rate_windows.py``) runs one suite over each twin and its real store.

In-memory twin of :class:`shared.accounts.domains.DomainStore`: users' sending domains, the state
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
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import UTC, date, datetime
from typing import Any

from cassandra import InvalidRequest

from services.api.domain_claims import related
from shared.accounts import apikeys
from shared.accounts.accounts import ApiKeyRecord, StoredKey, UserProfile, key_record
from shared.accounts.domains import MAX_DOMAINS, Claim, Domains, SendingDomain
from shared.accounts.preferences import CACHE_SECONDS, PreferenceRows, Preferences
from shared.accounts.ratelimit import (
    Grant,
    QuotaStore,
    RateStore,
    Verdict,
    grant_of,
    over_limit,
    seconds_until_midnight,
)
from shared.accounts.signup import RequestState, SignupQueue, SignupRequest
from shared.core.batch_ids import accepted_at
from shared.infra.db import utc
from tests.fakes.cassandra import FakeCassandra, as_stored, interleave, ms
from tests.fakes.wire import LOOPBACK, Kind, Wire


class FakeAccounts:
    """Twin of the functions of :mod:`shared.accounts.accounts` (each without its ``db``
    argument)."""

    def __init__(self, tables: FakeCassandra | None = None) -> None:
        self.tables = tables or FakeCassandra()

    async def ensure_user(self, login: str) -> uuid.UUID:
        await interleave()
        _not_empty(login)
        existing = self.tables.users_by_login.get(login)
        if existing:
            return existing
        await interleave()
        user_id = self.tables.users_by_login.setdefault(login, uuid.uuid4())  # IF NOT EXISTS
        await interleave()
        self._user(user_id).update(login=login, created_at=as_stored(self.tables.now()))
        return user_id

    async def upsert_github_user(
        self,
        *,
        github_id: int,
        login: str,
        name: str | None,
        email: str | None,
        avatar_url: str | None,
    ) -> uuid.UUID:
        now = as_stored(self.tables.now())
        await interleave()
        user_id = self.tables.users_by_github.get(github_id)
        if user_id is None:
            await interleave()
            candidate = uuid.uuid4()
            user_id = self.tables.users_by_github.setdefault(github_id, candidate)
            if user_id == candidate:
                await interleave()
                self._user(user_id)["created_at"] = now
        await interleave()
        self._user(user_id).update(
            login=login, github_id=github_id, name=name, email=email, avatar_url=avatar_url
        )
        return user_id

    async def get_user(self, user_id: uuid.UUID) -> UserProfile | None:
        await interleave()
        row = self.tables.users.get(user_id)
        if row is None or row.get("login") is None:
            return None
        return UserProfile(
            user_id=user_id,
            login=str(row["login"]),
            name=row.get("name"),
            email=row.get("email"),
            avatar_url=row.get("avatar_url"),
            sessions_after=utc(row.get("sessions_after")),
            github_id=row.get("github_id"),
        )

    async def end_sessions(self, user_id: uuid.UUID) -> None:
        await interleave()
        self._user(user_id)["sessions_after"] = as_stored(self.tables.now())

    async def create_key(
        self,
        user_id: uuid.UUID,
        name: str,
        *,
        scopes: Iterable[str] = apikeys.DEFAULT_SCOPES,
        expires_at: datetime | None = None,
    ) -> str:
        key = apikeys.generate()
        now = as_stored(self.tables.now())
        await interleave()
        self._key(key.key_id).update(
            user_id=user_id,
            secret_hash=key.secret_hash,
            name=name,
            created_at=now,
            scopes=set(scopes) or None,  # Cassandra stores an empty set as null
            expires_at=as_stored(expires_at) if expires_at else None,
        )
        await interleave()
        self.tables.api_keys_by_user.setdefault(user_id, set()).add(key.key_id)
        return key.plaintext

    async def authenticate(self, presented: str) -> ApiKeyRecord | None:
        parsed = apikeys.parse(presented)
        key_id, secret = parsed if parsed else ("", presented)
        row = None
        if parsed:
            await interleave()
            row = self.tables.api_keys.get(key_id)
        stored_hash = row["secret_hash"] if row else b"\0" * 32
        if not apikeys.verify(secret, stored_hash) or row is None:
            return None
        record = key_record(row)
        return record if record.live(self.tables.now()) else None

    async def read_key(self, key_id: str) -> StoredKey | None:
        await interleave()
        _not_empty(key_id)
        row = self.tables.api_keys.get(key_id)
        return StoredKey(key_record(row), bytes(row["secret_hash"])) if row else None

    async def list_keys(self, user_id: uuid.UUID) -> list[ApiKeyRecord]:
        await interleave()
        out = []
        for key_id in sorted(self.tables.api_keys_by_user.get(user_id, ())):
            await interleave()
            row = self.tables.api_keys.get(key_id)
            if row:
                out.append(key_record(row))
        return out

    async def revoke_key(self, user_id: uuid.UUID, key_id: str) -> bool:
        await interleave()
        _not_empty(key_id)
        row = self.tables.api_keys.get(key_id)
        if row is None or row["user_id"] != user_id:
            return False
        await interleave()
        row["revoked_at"] = as_stored(self.tables.now())
        return True

    async def touch_key(self, key_id: str) -> None:
        await interleave()
        _not_empty(key_id)
        self._key(key_id)["last_used_at"] = as_stored(self.tables.now())

    def _user(self, user_id: uuid.UUID) -> dict[str, Any]:
        return self.tables.users.setdefault(user_id, {})

    def _key(self, key_id: str) -> dict[str, Any]:
        """A row of ``api_keys`` to write (an UPDATE creates it when missing)."""
        columns = (
            "user_id",
            "secret_hash",
            "name",
            "created_at",
            "revoked_at",
            "last_used_at",
            "scopes",
            "expires_at",
        )
        return self.tables.api_keys.setdefault(key_id, {"key_id": key_id, **dict.fromkeys(columns)})


def _not_empty(key: str) -> None:
    """Cassandra refuses an empty partition key (the driver's error leaks through as is)."""
    if not key:
        raise InvalidRequest("Key may not be empty")


class FakeQuota(QuotaStore):
    """Twin of :class:`shared.accounts.ratelimit.RecipientQuota`: the counter per (user, day), added
    to and read back in separate round trips (an addition whose answer is lost stays
    counted, as in Cassandra), and the refund rows per (user, day, batch), which a repeat
    rewrites."""

    def __init__(self, db: FakeCassandra, daily_limit: int = 1000) -> None:
        self.db = db
        self.daily_limit = daily_limit

    async def consume(
        self, user_id: uuid.UUID, recipients: int, *, now: datetime | None = None
    ) -> tuple[Verdict, date]:
        now = datetime.now(UTC) if now is None else now
        day = now.astimezone(UTC).date()
        wait = seconds_until_midnight(now)
        if recipients > self.daily_limit:
            return Verdict(False, wait), day
        await self._add(user_id, day, recipients)
        self.db._after(await self.db._before("quota.read"))
        used = self.db.quota.get((user_id, day), 0)
        if not over_limit(used, self.daily_limit):
            return Verdict(True), day
        if not over_limit(used - await self._refunded(user_id, day), self.daily_limit):
            return Verdict(True), day
        await self._add(user_id, day, -recipients)
        return Verdict(False, wait), day

    async def lease(self, user_id: uuid.UUID, day: date, batch: int, want: int) -> Grant:
        await self._add(user_id, day, want)
        self.db._after(await self.db._before("quota.read"))
        used = self.db.quota.get((user_id, day), 0)
        if over_limit(used, self.daily_limit):
            used -= await self._refunded(user_id, day)
        grant = grant_of(want, batch, used, self.daily_limit)
        if grant.kept < want:
            await self._add(user_id, day, grant.kept - want)
        return grant

    async def give_back(self, user_id: uuid.UUID, day: date, recipients: int) -> None:
        await self._add(user_id, day, -recipients)

    async def refund(self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int) -> None:
        done = await self.db._before("quota.refund")
        self.db.refunds[(user_id, accepted_at(batch_id).date())][batch_id] = recipients
        self.db._after(done)

    async def used(self, user_id: uuid.UUID, day: date) -> int:
        self.db._after(await self.db._before("quota.read"))
        charged = self.db.quota.get((user_id, day), 0)
        return charged - await self._refunded(user_id, day)

    async def _refunded(self, user_id: uuid.UUID, day: date) -> int:
        self.db._after(await self.db._before("quota.refunded"))
        return sum(self.db.refunds.get((user_id, day), {}).values())

    async def _add(self, user_id: uuid.UUID, day: date, delta: int) -> None:
        done = await self.db._before("quota.add")
        self.db.quota[(user_id, day)] += delta
        self.db._after(done)


class FakeRateWindows(RateStore):
    """Twin of :class:`shared.accounts.ratelimit.RateWindows`: a counter per (key, day, window),
    added to and read back in separate round trips (an addition whose answer is lost stays
    counted, as in Cassandra)."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def take(self, key_id: str, day: date, index: int, slots: int) -> int:
        done = await self.db._before("rate.add")
        self.db.rate_windows[(key_id, day, index)] += slots
        self.db._after(done)
        self.db._after(await self.db._before("rate.read"))
        return max(self.db.rate_windows[(key_id, day, index)], slots)


class FakePreferences(PreferenceRows):
    """Twin of :class:`shared.accounts.preferences.PreferenceStore` (read through the same short
    per-process cache, so a change applies within its seconds)."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db
        self._cache: dict[uuid.UUID, tuple[float, Preferences]] = {}

    async def get(self, user_id: uuid.UUID, *, fresh: bool = False) -> Preferences:
        now = time.monotonic()
        cached = self._cache.get(user_id)
        if cached is not None and not fresh and now - cached[0] < CACHE_SECONDS:
            return cached[1]
        self.db._after(await self.db._before("preferences.get"))
        prefs = self.db.preferences.get(user_id) or Preferences()
        self._cache[user_id] = (now, prefs)
        return prefs

    async def put(self, user_id: uuid.UUID, prefs: Preferences) -> None:
        done = await self.db._before("preferences.put")
        self.db.preferences[user_id] = prefs
        self.db._after(done)
        self._cache[user_id] = (time.monotonic(), prefs)


_CHECKED = frozenset(
    {"checked_at", "seen_at", "verified_at", "missing_since", "unverified_at", "unverified_reason"}
)


def _stored(value: object) -> Any:
    """A cell as read back from Cassandra: timestamps in UTC at millisecond precision."""
    return ms(value) if isinstance(value, datetime) else value


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


class FakeSignupRequests(SignupQueue):
    """In-memory twin of :class:`shared.accounts.signup.SignupRequests`: one request per
    GitHub account, recorded once (asking again keeps the first time and any answer),
    answered by id, removed once the account signed up. ``all`` returns every open request
    oldest first, as the real store does once it has read them (the table is small: it expires
    rows after 30 days, which the twin does not model). ``tests/contracts/test_signup_store.py``
    runs one suite over this twin and the real store."""

    def __init__(self) -> None:
        self.rows: dict[int, SignupRequest] = {}

    async def state(self, github_id: int) -> RequestState | None:
        await interleave()
        row = self.rows.get(github_id)
        return row.state if row else None

    async def ask(self, github_id: int, login: str, name: str | None, email: str | None) -> None:
        await interleave()
        if github_id not in self.rows:
            now = ms(datetime.now(UTC))
            self.rows[github_id] = SignupRequest(
                github_id, login, name, email, now, "pending", None
            )

    async def answer(self, github_id: int, state: RequestState, operator: str) -> bool:
        await interleave()
        row = self.rows.get(github_id)
        if row is None:
            return False
        self.rows[github_id] = SignupRequest(
            row.github_id, row.login, row.name, row.email, row.requested_at, state, operator
        )
        return True

    async def done(self, github_id: int) -> None:
        await interleave()
        self.rows.pop(github_id, None)

    async def all(self, limit: int = 1000) -> list[SignupRequest]:
        await interleave()
        return sorted(self.rows.values(), key=lambda r: r.requested_at)[:limit]
