"""Who else claims a sending domain, and what its owner may learn of them.

Any number of accounts may add the same domain, and each that publishes its own TXT record
verifies it: a domain that changed hands keeps its former owner's claim until their record
is gone (``shared.accounts.domain_checks``). The claims on a domain, on its parents (which cover it)
and on its subdomains (which it covers) are read through the ``domain_claims`` index of
:class:`shared.accounts.domains.DomainStore`.

What an owner is shown of the others, and why:

* only once their own claim is verified: adding a domain proves nothing, and showing
  claims to whoever adds a name would tell anyone which domains send through this
  Safedelivr, and through how many accounts;
* for each other claim: the name it is on and its state (``pending``, ``verified``,
  ``record_missing``, ``unverified``). A verified claim on your domain is an account that
  can send as it, the one fact you must act on (remove the ``_safedelivr`` TXT values that
  are not yours: that claim is unverified after the grace); a pending one is someone who
  tried. Both are facts about a name in your control;
* how many distinct accounts hold them: the count, never who.

Never the account (its id, login, name, e-mail), its token, when it claimed or verified, or
anything it sent: none of it helps the owner act, and all of it would describe another
customer to them. Operators see every claim in full (``GET /v1/domain-claims/{domain}``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from shared.accounts.domains import Claim, SendingDomain

#: Other claims listed to an owner (the count covers every one read).
MAX_SHOWN = 20


def related(domain: str, other: str) -> bool:
    """Whether a claim on ``other`` concerns ``domain``: the same, a parent or a subdomain."""
    return other == domain or domain.endswith("." + other) or other.endswith("." + domain)


def state_of(d: SendingDomain) -> str:
    """``pending`` (never verified), ``verified``, ``record_missing`` (verified; its record
    not found since ``missing_since``), ``unverified`` (its record stayed missing)."""
    if d.verified:
        return "record_missing" if d.missing_since is not None else "verified"
    return "unverified" if d.unverified_at is not None else "pending"


@dataclass(frozen=True, slots=True)
class OtherClaims:
    """What an owner is shown of the claims of other accounts."""

    accounts: int
    verified: int
    claims: tuple[tuple[str, str], ...]
    """(domain, state) of at most :data:`MAX_SHOWN` claims, verified ones first."""
    more: bool

    def view(self) -> dict[str, object]:
        return {
            "accounts": self.accounts,
            "verified": self.verified,
            "claims": [{"domain": d, "state": s} for d, s in self.claims],
            "more": self.more,
        }


def others(owner: uuid.UUID, mine: SendingDomain, found: Iterable[Claim]) -> OtherClaims | None:
    """What the owner of ``mine`` is shown of the claims ``found`` on names related to it
    (None while their own claim is not verified: see the module's docstring)."""
    if not mine.verified:
        return None
    theirs = [c for c in found if c.user_id != owner and related(mine.domain, c.domain.domain)]
    states = sorted(
        ((c.domain.domain, state_of(c.domain)) for c in theirs),
        key=lambda ds: (ds[1] not in ("verified", "record_missing"), ds[0], ds[1]),
    )
    return OtherClaims(
        accounts=len({c.user_id for c in theirs}),
        verified=sum(1 for c in theirs if c.domain.verified),
        claims=tuple(states[:MAX_SHOWN]),
        more=len(states) > MAX_SHOWN,
    )
