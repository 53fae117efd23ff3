"""Sending domains: which domains a user has proven they control, so ``from`` cannot be any
address on the internet (an open relay).

A user adds a domain and gets a TXT record to publish at ``_safedelivr.<domain>``; verifying
looks the record up and, when the token is there, marks the domain verified. A verified domain
covers its subdomains (``news.example.com`` under ``example.com``), as SES and Mailgun do.
A verified domain stays verified only while its record stays published: it is looked up again
periodically (``shared.accounts.domain_checks``), and any number of accounts may claim one domain,
each seeing that others do (``services.api.domain_claims``). The pure rules are functions here;
:class:`DomainStore` owns ``sending_domains`` and its index ``domain_claims``, and
:class:`DohResolver` asks a DNS-over-HTTPS resolver (its JSON API, which Cloudflare and Google
serve and the sandbox imitates) for TXT records.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Protocol

import httpx

from shared.core.errors import DependencyUnavailable
from shared.infra.db import Database, utc

#: Where the verification record lives, under the domain.
RECORD_LABEL = "_safedelivr"
#: What the record's value starts with; the token follows.
RECORD_PREFIX = "safedelivr-verification="
#: The announcement (``shared.infra.user_cache``) that users' verified domains changed.
WAKE: Final = "domains"
#: Domains one user may have (verified or not).
MAX_DOMAINS = 100
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
#: A quoted character-string's content, from after its opening quote: anything but a quote
#: or a backslash, or a backslash and the character it escapes (not a line break).
_QUOTED_CONTENT = re.compile(r'(?:[^"\\]|\\.)*')


class DomainError(ValueError):
    """The text is not a domain we can verify; the message says why."""


def normalize_domain(text: str) -> str:
    """A domain as stored: IDNA (punycode) ASCII, lower case, without a trailing dot.

    Raises:
        DomainError: not a registrable-looking host name (one label, an IP address, bad
            labels, too long).
    """
    name = text.strip().rstrip(".")
    try:
        name = name.encode("idna").decode("ascii").lower()
    except UnicodeError as exc:
        raise DomainError("is not a valid domain name") from exc
    labels = name.split(".")
    if len(name) > 253 or len(labels) < 2 or not all(_LABEL.match(label) for label in labels):
        raise DomainError("is not a valid domain name (like example.com)")
    if labels[-1].isdigit():
        raise DomainError("is an IP address, not a domain")
    return name


def domain_of(address: str) -> str:
    """The domain part of an address, lower case (addresses are validated before this)."""
    return address.rpartition("@")[2].lower()


def covers(verified: frozenset[str], domain: str) -> bool:
    """Whether mail from ``domain`` is authorised by one of the ``verified`` domains: the
    domain itself or a parent of it."""
    labels = domain.lower().split(".")
    return any(".".join(labels[i:]) in verified for i in range(len(labels) - 1))


def record_name(domain: str) -> str:
    return f"{RECORD_LABEL}.{domain}"


def record_value(token: str) -> str:
    return f"{RECORD_PREFIX}{token}"


def proven(values: list[str], token: str) -> bool:
    """Whether the TXT strings found hold the domain's verification value."""
    wanted = record_value(token)
    return any(v.strip() == wanted for v in values)


@dataclass(frozen=True, slots=True)
class SendingDomain:
    domain: str
    token: str
    created_at: datetime
    verified_at: datetime | None
    seen_at: datetime | None = None
    """The last check that found the record (verifying is one)."""
    checked_at: datetime | None = None
    """The last periodic check, whatever it found."""
    missing_since: datetime | None = None
    """The first check of the current run that did not find the record (verified domains)."""
    unverified_at: datetime | None = None
    """When it was unverified because its record stayed missing (until verified again)."""
    unverified_reason: str | None = None

    @property
    def verified(self) -> bool:
        return self.verified_at is not None


@dataclass(frozen=True, slots=True)
class Claim:
    """One account's claim on a domain."""

    user_id: uuid.UUID
    domain: SendingDomain


#: The columns a domain is read from.
_COLUMNS = (
    "domain, proof, created_at, verified_at, seen_at, checked_at, missing_since, "
    "unverified_at, unverified_reason"
)
#: The columns a check may write (``shared.accounts.domain_checks.Outcome.cells``).
_CHECKED = frozenset(
    {"checked_at", "seen_at", "verified_at", "missing_since", "unverified_at", "unverified_reason"}
)
#: Rows per page of a scan.
_PAGE = 500


class Domains(Protocol):
    """What callers use of :class:`DomainStore` (the store, or its in-memory twin)."""

    async def add(self, user_id: uuid.UUID, domain: str) -> SendingDomain: ...

    async def get(self, user_id: uuid.UUID, domain: str) -> SendingDomain | None: ...

    async def all(self, user_id: uuid.UUID) -> list[SendingDomain]: ...

    async def verified(self, user_id: uuid.UUID) -> frozenset[str]: ...

    async def mark_verified(self, user_id: uuid.UUID, domain: str) -> bool: ...

    async def record(
        self, user_id: uuid.UUID, read: SendingDomain, cells: Mapping[str, object]
    ) -> bool: ...

    async def remove(self, user_id: uuid.UUID, domain: str) -> bool: ...

    def every(self) -> AsyncIterator[tuple[uuid.UUID, SendingDomain]]: ...

    async def index(self, user_id: uuid.UUID, domain: str) -> None: ...

    async def claims(self, domain: str, limit: int = 200) -> list[Claim]: ...

    async def index_all(self) -> int: ...


class DomainStore:
    """The ``sending_domains`` table (a user's domains, each with its verification token and
    the state of its checks) and its index ``domain_claims`` (who claims which name).

    The index has one partition per zone (a domain's last two labels) and a row per claimed
    name, its labels reversed (``com.example.mail``) so that a domain's subdomains are one
    slice and its parents single rows. It may hold more than the table, never less: a claim
    is indexed before its row is written and unindexed after its row is deleted, and reads
    keep only the entries whose row exists. Every write to the table is a lightweight
    transaction, so that none resurrects a removed domain or lands on another token.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(self, user_id: uuid.UUID, domain: str) -> SendingDomain:
        """The domain, added once (adding it again returns it as it is)."""
        token = secrets.token_urlsafe(24)
        await self.index(user_id, domain)
        await self.db.one(
            "INSERT INTO sending_domains (user_id, domain, proof, created_at) "
            "VALUES (?, ?, ?, ?) IF NOT EXISTS",
            (user_id, domain, token, datetime.now(UTC)),
        )
        found = await self.get(user_id, domain)
        if found is None:  # pragma: no cover - just written at SERIAL
            raise DependencyUnavailable("cassandra", "the domain was not stored")
        return found

    async def get(self, user_id: uuid.UUID, domain: str) -> SendingDomain | None:
        row = await self.db.one(
            f"SELECT {_COLUMNS} FROM sending_domains WHERE user_id = ? AND domain = ?",  # noqa: S608 - fixed names
            (user_id, domain),
        )
        return _domain(row) if row else None

    async def all(self, user_id: uuid.UUID) -> list[SendingDomain]:
        rows = await self.db.rows(
            f"SELECT {_COLUMNS} FROM sending_domains WHERE user_id = ? LIMIT ?",  # noqa: S608 - fixed names
            (user_id, MAX_DOMAINS + 1),
        )
        return [_domain(r) for r in rows]

    async def verified(self, user_id: uuid.UUID) -> frozenset[str]:
        return frozenset(d.domain for d in await self.all(user_id) if d.verified)

    async def mark_verified(self, user_id: uuid.UUID, domain: str) -> bool:
        """Verified now (its record was just found); False when the domain is gone."""
        now = datetime.now(UTC)
        row = await self.db.one(
            "UPDATE sending_domains SET verified_at = ?, seen_at = ?, checked_at = ?, "
            "missing_since = null, unverified_at = null, unverified_reason = null "
            "WHERE user_id = ? AND domain = ? IF EXISTS",
            (now, now, now, user_id, domain),
        )
        return bool(row and row["[applied]"])

    async def record(
        self, user_id: uuid.UUID, read: SendingDomain, cells: Mapping[str, object]
    ) -> bool:
        """Write what a check of ``read`` decided (``Outcome.cells()``), only if the domain
        is still as it was read: not removed, added again, verified again or checked by
        another meanwhile. False when it was not."""
        unknown = set(cells) - _CHECKED
        if unknown:
            raise ValueError(f"not a column a check writes: {sorted(unknown)}")
        names = list(cells)
        row = await self.db.one(
            f"UPDATE sending_domains SET {', '.join(f'{n} = ?' for n in names)} "  # noqa: S608 - checked names
            "WHERE user_id = ? AND domain = ? "
            "IF proof = ? AND verified_at = ? AND missing_since = ?",
            (
                *(cells[n] for n in names),
                user_id,
                read.domain,
                read.token,
                read.verified_at,
                read.missing_since,
            ),
        )
        return bool(row and row["[applied]"])

    async def remove(self, user_id: uuid.UUID, domain: str) -> bool:
        row = await self.db.one(
            "DELETE FROM sending_domains WHERE user_id = ? AND domain = ? IF EXISTS",
            (user_id, domain),
        )
        if not (row and row["[applied]"]):
            return False
        await self.db.execute(
            "DELETE FROM domain_claims WHERE zone = ? AND name = ? AND user_id = ?",
            (_zone(domain), _key(domain), user_id),
            idempotent=True,
        )
        return True

    async def every(self) -> AsyncIterator[tuple[uuid.UUID, SendingDomain]]:
        """Every user's every domain (the periodic checks' scan, page by page)."""
        state: bytes | None = None
        while True:
            page = await self.db.execute(
                f"SELECT user_id, {_COLUMNS} FROM sending_domains",  # noqa: S608 - fixed names
                page_size=_PAGE,
                paging_state=state,
            )
            for row in page.rows:
                yield row["user_id"], _domain(row)
            if page.paging_state is None:
                return
            state = page.paging_state

    async def index(self, user_id: uuid.UUID, domain: str) -> None:
        """Index a claim (idempotent; ``add`` does it, and ``safedelivr migrate`` for the
        domains added before the index existed)."""
        await self.db.execute(
            "INSERT INTO domain_claims (zone, name, user_id) VALUES (?, ?, ?)",
            (_zone(domain), _key(domain), user_id),
            idempotent=True,
        )

    async def claims(self, domain: str, limit: int = 200) -> list[Claim]:
        """Every account's claim on ``domain``, on its parents and on its subdomains (at most
        ``limit`` of the subdomains'), each as its row has it."""
        zone, key = _zone(domain), _key(domain)
        entries = await self.db.rows(
            "SELECT name, user_id FROM domain_claims WHERE zone = ? AND name >= ? AND name < ? "
            "LIMIT ?",
            (zone, key, key + "/", limit),  # "/" follows "." : the subdomains, and a few more
        )
        above = [_key(p) for p in _parents(domain)]
        if above:
            entries += await self.db.rows(
                "SELECT name, user_id FROM domain_claims WHERE zone = ? AND name IN ?",
                (zone, above),
            )
        named = [(e["user_id"], _name(e["name"])) for e in entries]
        related = [(u, n) for u, n in named if n == domain or n.endswith("." + domain)]
        related += [(u, n) for u, n in named if domain.endswith("." + n)]
        rows = await asyncio.gather(*(self.get(u, n) for u, n in related))
        return [Claim(u, d) for (u, _), d in zip(related, rows, strict=True) if d is not None]

    async def index_all(self) -> int:
        """Index every domain of the table (idempotent); how many there are."""
        count = 0
        async for user_id, d in self.every():
            await self.index(user_id, d.domain)
            count += 1
        return count


def _zone(domain: str) -> str:
    """A domain's partition of ``domain_claims``: its last two labels."""
    return ".".join(domain.split(".")[-2:])


def _key(domain: str) -> str:
    """A domain's row in ``domain_claims``: its labels reversed."""
    return ".".join(reversed(domain.split(".")))


def _name(key: str) -> str:
    return ".".join(reversed(key.split(".")))


def _parents(domain: str) -> list[str]:
    """The parents of ``domain`` one could claim (two labels or more), nearest first."""
    labels = domain.split(".")
    return [".".join(labels[i:]) for i in range(1, len(labels) - 1)]


def _domain(row: Mapping[str, object]) -> SendingDomain:
    created = row["created_at"]
    assert isinstance(created, datetime)  # noqa: S101 - a timestamp column, always written
    return SendingDomain(
        domain=str(row["domain"]),
        token=str(row["proof"]),
        created_at=utc(created),
        verified_at=_time(row.get("verified_at")),
        seen_at=_time(row.get("seen_at")),
        checked_at=_time(row.get("checked_at")),
        missing_since=_time(row.get("missing_since")),
        unverified_at=_time(row.get("unverified_at")),
        unverified_reason=str(row["unverified_reason"]) if row.get("unverified_reason") else None,
    )


def _time(value: object) -> datetime | None:
    return utc(value) if isinstance(value, datetime) else None


class DohResolver:
    """TXT lookups through a DNS-over-HTTPS JSON API (``?name=&type=TXT``)."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self._http = http
        self._url = url

    async def txt(self, name: str) -> list[str]:
        """The TXT strings at ``name`` (none when it does not exist); DependencyUnavailable
        when the resolver cannot answer."""
        try:
            response = await self._http.get(
                self._url,
                params={"name": name, "type": "TXT"},
                headers={"Accept": "application/dns-json"},
            )
        except httpx.HTTPError as exc:
            raise DependencyUnavailable("dns", f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise DependencyUnavailable("dns", f"the resolver answered HTTP {response.status_code}")
        try:
            answer = response.json()
        except ValueError as exc:
            raise DependencyUnavailable("dns", "the resolver sent no JSON") from exc
        return txt_strings(answer)


def txt_strings(answer: object) -> list[str]:
    """The TXT strings of a DNS JSON API answer: each record's ``data``, its quoted
    character-strings joined (a long value comes split into 255-byte strings)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("Answer"), list):
        return []
    out = []
    for record in answer["Answer"]:
        if isinstance(record, dict) and record.get("type") == 16:
            data = record.get("data")
            if isinstance(data, str):
                out.append("".join(quoted_strings(data)) or data)
    return out


def quoted_strings(data: str) -> list[str]:
    """The contents of the quoted character-strings in a record's ``data``, in order: what
    ``"((?:[^"\\\\]|\\\\.)*)"`` finds, reading each character once.

    The data is the domain owner's to write (a resolver may pass it unquoted). That regular
    expression read on from every quote to where the content stops and, when no quote closed
    it there, tried again at the next quote, which is escaped (``\\"``) and stops at the same
    place: quadratic in a run of escaped quotes. Every quote before that place is such a one,
    so the scan goes on after it."""
    out = []
    at = data.find('"')
    while at >= 0:
        content = _QUOTED_CONTENT.match(data, at + 1)
        end = content.end() if content is not None else at + 1
        if data.startswith('"', end):
            out.append(data[at + 1 : end])
        at = data.find('"', end + 1)
    return out
