"""Managing API keys and suppressions: the use cases under ``/v1/keys``, ``/v1/suppressions``
and the dashboard's pages for both. Plain data in; records out, or :class:`ApiError` 422
naming the field (each interface words it in its own way)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from services.api.keycache import Revocations
from shared.accounts import accounts, apikeys
from shared.accounts.accounts import ApiKeyRecord
from shared.audience.suppression_cache import Changes
from shared.audience.suppressions import (
    Suppressions,
    lift_refusal,
    made_by_recipient,
)
from shared.core.addresses import AddressError, address_key, normalize_email
from shared.infra.db import Database
from shared.infra.http import ApiError

MAX_KEY_NAME = 100
MAX_REASON = 200


@dataclass(frozen=True, slots=True)
class Suppressed:
    email: str
    """The address key."""
    reason: str


@dataclass(frozen=True, slots=True)
class NewKeyMade:
    plaintext: str
    """Shown once, never stored."""
    name: str
    scopes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Managing:
    db: Database
    suppressions: Suppressions
    max_keys: int = 50
    """Live (not revoked, not expired) keys one user may hold."""
    revocations: Revocations | None = None
    """Who tells every API process's key cache that a key was revoked (none: no cache)."""
    changes: Changes | None = None
    """Who tells every API process's suppression cache that a user's list changed (none: no
    cache)."""

    async def suppress(
        self, user_id: uuid.UUID, email: str, reason: str | None, *, source: str
    ) -> Suppressed:
        """Put an address on the user's list (again: the newest reason wins)."""
        fields: dict[str, str] = {}
        reason = (reason or "").strip() or "manual"
        normalized = ""
        try:
            normalized = normalize_email(email.strip()) if email.strip() else ""
        except AddressError as exc:
            fields["email"] = exc.reason
        if not email.strip():
            fields["email"] = "is required"
        if len(reason) > MAX_REASON:
            fields["reason"] = f"must be at most {MAX_REASON} characters"
        if fields:
            raise ApiError(422, "invalid_fields", "the suppression is not valid", fields=fields)
        earlier = await self.suppressions.entry(user_id, normalized)
        # The recipient's mark stays (a sender's own entry over theirs is not a way to lift
        # it); written out for an entry from before marks, which a new write would lose.
        mark = made_by_recipient(earlier) if earlier is not None else None
        await self.suppressions.add(
            user_id, normalized, reason=reason, source=source, by_recipient=mark
        )
        await self._changed(user_id)
        return Suppressed(address_key(normalized), reason)

    async def unsuppress(
        self, user_id: uuid.UUID, email: str, scope: str | None = None, *, operator: bool = False
    ) -> bool:
        """Take an address off the list (or off ``scope``'s); False when it was not on it.
        403 ``suppressed_by_recipient`` for an entry the recipient made, unless ``operator``
        (``shared.audience.suppressions``)."""
        email = email.strip()
        found = await self.suppressions.entry(user_id, email, scope) if email else None
        if found is None:
            return False
        refusal = lift_refusal(found, operator=operator)
        if refusal is not None:
            raise ApiError(403, "suppressed_by_recipient", refusal)
        await self.suppressions.forget(user_id, email, scope, version=int(found["version"]))
        await self._changed(user_id)
        return True

    async def _changed(self, user_id: uuid.UUID) -> None:
        """After a write of the user's list: this process's cache drops it at once, the
        others on the broadcast (lost: within their TTL)."""
        if self.changes is not None:
            await self.changes.announce([user_id])

    async def create_key(
        self,
        user_id: uuid.UUID,
        name: str | None,
        *,
        default: str,
        holder: frozenset[str],
        scopes: Iterable[str] | None = None,
        expires_at: datetime | None = None,
    ) -> NewKeyMade:
        """A new key named ``name`` (or ``default``): its plaintext (shown once), name and
        scopes.

        ``holder``: the scopes of whoever asks (a key's, or a dashboard user's); the new key
        gets ``scopes`` (default: the usual ones the holder has), never more than the holder.
        422 for a bad name, scope or expiry, 403 for a scope beyond the holder's, 409 when the
        user already has ``max_keys`` live keys.
        """
        name = (name or "").strip() or default
        wanted = sorted(set(scopes) if scopes is not None else apikeys.DEFAULT_SCOPES & holder)
        fields: dict[str, str] = {}
        if len(name) > MAX_KEY_NAME:
            fields["name"] = f"must be at most {MAX_KEY_NAME} characters"
        unknown = apikeys.scopes_problem(wanted)
        if unknown:
            fields["scopes"] = unknown
        if expires_at is not None and expires_at <= datetime.now(UTC):
            fields["expires_at"] = "must be in the future"
        if fields:
            raise ApiError(422, "invalid_fields", "the key is not valid", fields=fields)
        beyond = sorted(set(wanted) - holder)
        if beyond:
            raise ApiError(
                403,
                "forbidden",
                f"a key cannot be given scopes its creator lacks: {', '.join(beyond)}",
                fields={"scopes": f"{', '.join(beyond)} is beyond what you hold"},
            )
        now = datetime.now(UTC)
        live = [k for k in await accounts.list_keys(self.db, user_id) if k.live(now)]
        if len(live) >= self.max_keys:
            raise ApiError(
                409,
                "too_many_keys",
                f"you have {len(live)} live keys, the most allowed; revoke one first",
            )
        key = await accounts.create_key(
            self.db, user_id, name, scopes=wanted, expires_at=expires_at
        )
        return NewKeyMade(key, name, tuple(wanted))

    async def keys(self, user_id: uuid.UUID) -> list[ApiKeyRecord]:
        return await accounts.list_keys(self.db, user_id)

    async def revoke_key(self, user_id: uuid.UUID, key_id: str) -> bool:
        """Revoke the user's key in the store, then announce it to every process's cache
        (lost: each still refuses it within ``services.api.keycache.TTL``); False when the user
        has no such key."""
        if not await accounts.revoke_key(self.db, user_id, key_id):
            return False
        if self.revocations is not None:
            await self.revocations.announce([key_id])
        return True
