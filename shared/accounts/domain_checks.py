"""When a verified sending domain's TXT record is looked up again, and what each look-up
decides: the pure half of the periodic checks (``services.consumers.domain_checks`` runs
them, :class:`shared.accounts.domains.DomainStore` records them).

A domain stays verified only while the record that proved it stays published: a domain
expires or changes hands, and its former owner must stop sending as it. A verified domain is
looked up every ``every`` (its ``checked_at``). A look-up that finds the record keeps it
verified (``seen_at``: the last successful check). The first that does not starts a grace
period (``missing_since``), during which the domain stays verified and its owner sees the
record missing; the first look-up at least ``grace`` after that still not finding it marks
the domain unverified, with the reason and the last successful check for its owner to read
(sending from it is then refused, as from a domain never verified), and verifying it again
is the way back. A record back within the grace ends the grace.

However short the grace, two look-ups that did not find the record are needed before a
domain is unverified: one stray answer never is enough. A look-up that could not be made
(the resolver down or unreachable) decides nothing: an outage of ours must not unverify
every domain at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from shared.accounts import domains
from shared.accounts.domains import SendingDomain

if TYPE_CHECKING:
    from shared.infra.config import ApiSettings

Kind = Literal["seen", "missing", "unverified"]


@dataclass(frozen=True, slots=True)
class CheckRules:
    every: timedelta
    """Time between two look-ups of one verified domain."""
    grace: timedelta
    """How long a verified domain's record may be missing before it is unverified."""

    @classmethod
    def of(cls, api: ApiSettings) -> CheckRules:
        """``SAFEDELIVR_API_DOMAIN_RECHECK_EVERY`` and ``_DOMAIN_GRACE``."""
        return cls(timedelta(seconds=api.domain_recheck_every), timedelta(seconds=api.domain_grace))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one look-up decided."""

    kind: Kind
    at: datetime
    missing_since: datetime | None = None
    reason: str | None = None

    def cells(self) -> dict[str, object]:
        """The columns of ``sending_domains`` to write, by name."""
        if self.kind == "seen":
            return {"checked_at": self.at, "seen_at": self.at, "missing_since": None}
        if self.kind == "missing":
            return {"checked_at": self.at, "missing_since": self.missing_since}
        return {
            "checked_at": self.at,
            "verified_at": None,
            "missing_since": None,
            "unverified_at": self.at,
            "unverified_reason": self.reason,
        }


def due(domain: SendingDomain, now: datetime, rules: CheckRules) -> bool:
    """Whether ``domain`` is to be looked up at ``now``: verified, and not looked up for
    ``every`` (a domain never looked up, such as one verified before checks began, at once)."""
    if not domain.verified:
        return False
    return domain.checked_at is None or now - domain.checked_at >= rules.every


def judge(domain: SendingDomain, found: bool, now: datetime, rules: CheckRules) -> Outcome:
    """What a look-up at ``now`` that did (``found``) or did not find the record decides."""
    if found:
        return Outcome("seen", now)
    since = domain.missing_since
    if since is None:
        return Outcome("missing", now, missing_since=now)
    if now - since < rules.grace:
        return Outcome("missing", now, missing_since=since)
    return Outcome("unverified", now, reason=lapse_reason(domain, since))


def lapse_reason(domain: SendingDomain, since: datetime) -> str:
    """Why a domain was unverified, in words its owner acts on."""
    return (
        f"its TXT record {domains.record_value(domain.token)!r} at "
        f"{domains.record_name(domain.domain)} was not found by any check since "
        f"{since:%Y-%m-%d %H:%M} UTC: publish it again, then verify the domain"
    )


def unverified_after(domain: SendingDomain, rules: CheckRules) -> datetime | None:
    """When a verified domain whose record is missing is unverified at the latest check
    after (None: its record was found at the last check, or it is not verified)."""
    if not domain.verified or domain.missing_since is None:
        return None
    return domain.missing_since + rules.grace
