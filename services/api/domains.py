"""``/v1/domains``: add a sending domain, show the TXT record that proves it is yours, verify
it, list and remove, and see its sending capacity today, the state of its periodic checks
(``shared.accounts.domain_checks``) and what may be said of other accounts' claims on it
(``services.api.domain_claims``); :class:`SendingDomains` holds the use cases the dashboard's
Domains page shares. ``/v1/domain-claims/{domain}`` (operator keys) lists every claim in full.
Batches are sent only from verified domains (``shared.accounts.domains``)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from services.api import domain_claims, schema
from services.api.auth import require_key
from services.api.domain_claims import OtherClaims, state_of
from services.api.operations import DOMAIN, operation
from services.api.schema import DomainIn, checked
from services.api.settings import settings_store
from shared.accounts import domains
from shared.accounts.accounts import get_user
from shared.accounts.domain_checks import CheckRules, unverified_after
from shared.accounts.domains import (
    Claim,
    DohResolver,
    DomainError,
    Domains,
    SendingDomain,
)
from shared.delivery.domain_capacity import DayVolume, DomainVolumes, capacity
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.infra.http import Answer, ApiError, read_json
from shared.infra.user_cache import UserChanges
from shared.ops.livesettings import resolve

SMALL_BODY = 4 * 1024
#: Claims an operator is shown of one domain.
OPERATOR_CLAIMS = 1000


def view(
    d: SendingDomain,
    capacity: dict[str, Any] | None = None,
    *,
    rules: CheckRules,
    others: OtherClaims | None = None,
) -> dict[str, Any]:
    """What users see of a domain: its state and the checks behind it, the record to publish,
    what they may know of other accounts' claims (``services.api.domain_claims``), and its sending
    capacity today (None while capacity is off)."""
    return {
        "capacity": capacity,
        "domain": d.domain,
        "state": state_of(d),
        "verified": d.verified,
        "verified_at": _iso(d.verified_at),
        "created_at": d.created_at.isoformat(),
        "record": {
            "type": "TXT",
            "name": domains.record_name(d.domain),
            "value": domains.record_value(d.token),
        },
        "checks": {
            "last_seen_at": _iso(d.seen_at),
            "last_checked_at": _iso(d.checked_at),
            "missing_since": _iso(d.missing_since),
            "unverified_after": _iso(unverified_after(d, rules)),
            "unverified_at": _iso(d.unverified_at),
            "reason": d.unverified_reason,
        },
        "other_claims": others.view() if others is not None else None,
    }


def claim_view(claim: Claim, login: str | None) -> dict[str, Any]:
    """What operators see of a claim: everything, the account included."""
    d = claim.domain
    return {
        "domain": d.domain,
        "user_id": str(claim.user_id),
        "login": login,
        "state": state_of(d),
        "created_at": d.created_at.isoformat(),
        "verified_at": _iso(d.verified_at),
        "last_seen_at": _iso(d.seen_at),
        "last_checked_at": _iso(d.checked_at),
        "missing_since": _iso(d.missing_since),
        "unverified_at": _iso(d.unverified_at),
        "reason": d.unverified_reason,
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


@dataclass(frozen=True, slots=True)
class SendingDomains:
    """The use cases behind ``/v1/domains`` and the dashboard's Domains page. Raw names in;
    records out, or :class:`ApiError` (422 naming the field, 404, 409)."""

    store: Domains
    resolver: DohResolver
    rules: CheckRules
    changes: UserChanges | None = None
    """Told of each change to a user's verified domains (every API process's cache)."""

    @classmethod
    def of(cls, request: Request) -> SendingDomains:
        state = request.app.state
        return cls(
            state.domains,
            state.resolver,
            CheckRules.of(state.settings.api),
            state.domain_changes,
        )

    async def _changed(self, user_id: uuid.UUID) -> None:
        if self.changes is not None:
            await self.changes.announce([user_id])

    async def add(self, user_id: uuid.UUID, raw: str) -> SendingDomain:
        """Add ``raw`` (again: the same record stays), up to :data:`domains.MAX_DOMAINS`."""
        try:
            name = domains.normalize_domain(raw)
        except DomainError as exc:
            raise ApiError(
                422, "invalid_fields", "the domain is not valid", fields={"domain": str(exc)}
            ) from None
        existing = await self.store.all(user_id)
        if len(existing) >= domains.MAX_DOMAINS and name not in {d.domain for d in existing}:
            raise ApiError(
                409, "too_many_domains", f"at most {domains.MAX_DOMAINS} domains per user"
            )
        return await self.store.add(user_id, name)

    async def owned(self, user_id: uuid.UUID, raw: str) -> SendingDomain:
        found = await self.store.get(user_id, _name_or_404(raw))
        if found is None:
            raise ApiError(404, "not_found", "no such domain")
        return found

    async def verify(self, user_id: uuid.UUID, raw: str) -> SendingDomain:
        """Look the TXT record up now: the verified domain, or 422 naming what to publish
        (503 via DependencyUnavailable when DNS cannot be asked). A domain verified and whose
        record was found at its last check is answered as it is."""
        found = await self.owned(user_id, raw)
        if found.verified and found.missing_since is None:
            return found
        name = domains.record_name(found.domain)
        if not domains.proven(await self.resolver.txt(name), found.token):
            raise ApiError(
                422,
                "not_verified",
                f"no TXT record {domains.record_value(found.token)!r} at {name} yet "
                "(DNS changes can take a while to be seen)",
                fields={"domain": "the TXT record was not found"},
            )
        if not await self.store.mark_verified(user_id, found.domain):
            raise ApiError(404, "not_found", "no such domain")
        await self._changed(user_id)
        return await self.owned(user_id, found.domain)

    async def remove(self, user_id: uuid.UUID, raw: str) -> None:
        if not await self.store.remove(user_id, _name_or_404(raw)):
            raise ApiError(404, "not_found", "no such domain")
        await self._changed(user_id)

    async def others(
        self, user_id: uuid.UUID, found: list[SendingDomain]
    ) -> dict[str, OtherClaims | None]:
        """What the user may know of other accounts' claims, for each of ``found``."""

        async def one(d: SendingDomain) -> OtherClaims | None:
            if not d.verified:
                return None  # unread: nothing is shown before the user proves control
            return domain_claims.others(user_id, d, await self.store.claims(d.domain))

        shown = await asyncio.gather(*(one(d) for d in found))
        return dict(zip((d.domain for d in found), shown, strict=True))

    async def views(
        self, user_id: uuid.UUID, found: list[SendingDomain], caps: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        others = await self.others(user_id, found)
        caps = caps or {}
        return [
            view(d, caps.get(d.domain), rules=self.rules, others=others[d.domain]) for d in found
        ]


def _name_or_404(raw: str) -> str:
    try:
        return domains.normalize_domain(raw)
    except DomainError:
        raise ApiError(404, "not_found", "no such domain") from None


async def capacities(request: Request, names: list[str]) -> dict[str, dict[str, Any] | None]:
    """Each domain's capacity today (``shared.delivery.domain_capacity``) for mail from exactly that
    domain; all None while the live setting ``capacity.enabled`` is off."""
    settings: Settings = request.app.state.settings
    rules = resolve(await settings_store(request).stored(), settings.providers).capacity
    if not rules.enabled:
        return dict.fromkeys(names)
    volumes = DomainVolumes(request.app.state.resources.db)
    today = datetime.now(UTC).date()

    async def one(name: str) -> dict[str, Any]:
        history = await volumes.history(name, today)
        cap = capacity(history, today, rules)
        sent = history.get(today, DayVolume()).sent
        return {"limit_today": cap.limit, "sent_today": sent, "state": cap.state, "why": cap.why}

    found = await asyncio.gather(*(one(n) for n in names))
    return dict(zip(names, found, strict=True))


@operation(
    "list_domains",
    "Your sending domains and their verification records",
    schema.DomainList,
)
async def list_domains(request: Request) -> Response:
    key = await require_key(request, "read")
    use = SendingDomains.of(request)
    owned = await use.store.all(key.user_id)
    caps = await capacities(request, [d.domain for d in owned])
    return Answer(
        schema.DomainList.model_validate({"data": await use.views(key.user_id, owned, caps)})
    )


@operation(
    "add_domain",
    "Add a sending domain (then publish its TXT record and verify it)",
    schema.DomainView,
    status=201,
    body=schema.DomainIn,
    errors=(400, 409, 413, 415, 422),
    description="Batches are accepted only `from` a verified domain or a subdomain of "
    "one. Adding a domain again returns it as it is.",
)
async def add_domain(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, SMALL_BODY)
    wanted = checked(DomainIn, body)
    use = SendingDomains.of(request)
    added = await use.add(key.user_id, wanted.domain)
    return Answer(
        schema.DomainView.model_validate((await use.views(key.user_id, [added]))[0]),
        status_code=201,
    )


@operation(
    "get_domain",
    "One sending domain",
    schema.DomainView,
    params=(DOMAIN,),
    errors=(404,),
)
async def get_domain(request: Request) -> Response:
    key = await require_key(request, "read")
    use = SendingDomains.of(request)
    found = await use.owned(key.user_id, request.path_params["domain"])
    caps = await capacities(request, [found.domain])
    return Answer(
        schema.DomainView.model_validate((await use.views(key.user_id, [found], caps))[0])
    )


@operation(
    "verify_domain",
    "Look up the domain's TXT record now and verify it",
    schema.DomainView,
    params=(DOMAIN,),
    errors=(404, 422),
    description="422 `not_verified` while the record cannot be found; 503 when DNS "
    "cannot be asked.",
)
async def verify_domain(request: Request) -> Response:
    """200 when the TXT record holds the token (the domain is verified), 422 naming what to
    publish when it does not, 503 when DNS cannot be asked."""
    key = await require_key(request, "send")
    use = SendingDomains.of(request)
    found = await use.verify(key.user_id, request.path_params["domain"])
    return Answer(schema.DomainView.model_validate((await use.views(key.user_id, [found]))[0]))


@operation(
    "delete_domain",
    "Remove a sending domain",
    None,
    status=204,
    params=(DOMAIN,),
    errors=(404,),
)
async def delete_domain(request: Request) -> Response:
    key = await require_key(request, "send")
    await SendingDomains.of(request).remove(key.user_id, request.path_params["domain"])
    return Response(status_code=204)


async def operator_claims(store: Domains, db: Database, domain: str) -> list[dict[str, Any]]:
    """Every account's claim on ``domain``, its parents and subdomains, in full (the
    operators' view, for the API and the Operations page)."""
    found = await store.claims(domain, limit=OPERATOR_CLAIMS)
    users = {c.user_id for c in found}
    profiles = dict(
        zip(users, await asyncio.gather(*(get_user(db, u) for u in users)), strict=True)
    )
    return [
        claim_view(c, p.login if (p := profiles[c.user_id]) is not None else None)
        for c in sorted(found, key=lambda c: (c.domain.domain, str(c.user_id)))
    ]


@operation(
    "list_domain_claims",
    "Every account's claim on a domain, its parents and subdomains (operator keys)",
    schema.DomainClaimList,
    params=(DOMAIN,),
    errors=(404,),
)
async def list_claims(request: Request) -> Response:
    """``GET /v1/domain-claims/{domain}`` (operator keys): who claims the domain."""
    await require_key(request, "operator")
    name = _name_or_404(request.path_params["domain"])
    store: Domains = request.app.state.domains
    claims = await operator_claims(store, request.app.state.resources.db, name)
    return Answer(schema.DomainClaimList.model_validate({"domain": name, "data": claims}))
