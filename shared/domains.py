"""Sending domains: which domains a user has proven they control, so ``from`` cannot be any
address on the internet (an open relay).

A user adds a domain and gets a TXT record to publish at ``_safedelivr.<domain>``; verifying
looks the record up and, when the token is there, marks the domain verified. A verified domain
covers its subdomains (``news.example.com`` under ``example.com``), as SES and Mailgun do.
The pure rules are functions here; :class:`DomainStore` owns ``sending_domains``, and
:class:`DohResolver` asks a DNS-over-HTTPS resolver (its JSON API, which Cloudflare and Google
serve and the sandbox imitates) for TXT records.
"""

from __future__ import annotations

import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from shared.db import Database, utc
from shared.errors import DependencyUnavailable

#: Where the verification record lives, under the domain.
RECORD_LABEL = "_safedelivr"
#: What the record's value starts with; the token follows.
RECORD_PREFIX = "safedelivr-verification="
#: Domains one user may have (verified or not).
MAX_DOMAINS = 100
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


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

    @property
    def verified(self) -> bool:
        return self.verified_at is not None


class DomainStore:
    """The ``sending_domains`` table: a user's domains, each with its verification token."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(self, user_id: uuid.UUID, domain: str) -> SendingDomain:
        """The domain, added once (adding it again returns it as it is)."""
        token = secrets.token_urlsafe(24)
        now = datetime.now(UTC)
        await self.db.one(
            "INSERT INTO sending_domains (user_id, domain, proof, created_at) "
            "VALUES (?, ?, ?, ?) IF NOT EXISTS",
            (user_id, domain, token, now),
        )
        found = await self.get(user_id, domain)
        if found is None:  # pragma: no cover - just written at SERIAL
            raise DependencyUnavailable("cassandra", "the domain was not stored")
        return found

    async def get(self, user_id: uuid.UUID, domain: str) -> SendingDomain | None:
        row = await self.db.one(
            "SELECT domain, proof, created_at, verified_at FROM sending_domains "
            "WHERE user_id = ? AND domain = ?",
            (user_id, domain),
        )
        return _domain(row) if row else None

    async def all(self, user_id: uuid.UUID) -> list[SendingDomain]:
        rows = await self.db.rows(
            "SELECT domain, proof, created_at, verified_at FROM sending_domains "
            "WHERE user_id = ? LIMIT ?",
            (user_id, MAX_DOMAINS + 1),
        )
        return [_domain(r) for r in rows]

    async def verified(self, user_id: uuid.UUID) -> frozenset[str]:
        return frozenset(d.domain for d in await self.all(user_id) if d.verified)

    async def mark_verified(self, user_id: uuid.UUID, domain: str) -> None:
        await self.db.execute(
            "UPDATE sending_domains SET verified_at = ? WHERE user_id = ? AND domain = ?",
            (datetime.now(UTC), user_id, domain),
            idempotent=True,
        )

    async def remove(self, user_id: uuid.UUID, domain: str) -> bool:
        if await self.get(user_id, domain) is None:
            return False
        await self.db.execute(
            "DELETE FROM sending_domains WHERE user_id = ? AND domain = ?",
            (user_id, domain),
            idempotent=True,
        )
        return True


def _domain(row: dict[str, object]) -> SendingDomain:
    created, verified = row["created_at"], row["verified_at"]
    assert isinstance(created, datetime)  # noqa: S101 - a timestamp column, always written
    return SendingDomain(
        domain=str(row["domain"]),
        token=str(row["proof"]),
        created_at=utc(created),
        verified_at=utc(verified) if isinstance(verified, datetime) else None,
    )


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
                out.append("".join(re.findall(r'"((?:[^"\\]|\\.)*)"', data)) or data)
    return out
