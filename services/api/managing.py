"""Managing API keys and suppressions: the use cases under ``/v1/keys``, ``/v1/suppressions``
and the dashboard's pages for both. Plain data in; records out, or :class:`ApiError` 422
naming the field (each interface words it in its own way)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from shared import accounts
from shared.accounts import ApiKeyRecord
from shared.addresses import AddressError, address_key, normalize_email
from shared.db import Database
from shared.http import ApiError
from shared.suppressions import SuppressionStore

MAX_KEY_NAME = 100
MAX_REASON = 200


@dataclass(frozen=True, slots=True)
class Suppressed:
    email: str
    """The address key."""
    reason: str


@dataclass(frozen=True, slots=True)
class Managing:
    db: Database
    suppressions: SuppressionStore

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
        await self.suppressions.add(user_id, normalized, reason=reason, source=source)
        return Suppressed(address_key(normalized), reason)

    async def unsuppress(self, user_id: uuid.UUID, email: str) -> bool:
        """Take an address off the list; False when it was not on it."""
        return bool(email.strip()) and await self.suppressions.remove(user_id, email.strip())

    async def create_key(
        self, user_id: uuid.UUID, name: str | None, *, default: str
    ) -> tuple[str, str]:
        """A new key named ``name`` (or ``default``): its plaintext, shown once, and name."""
        name = (name or "").strip() or default
        if len(name) > MAX_KEY_NAME:
            raise ApiError(
                422,
                "invalid_fields",
                "the key's name is too long",
                fields={"name": f"must be at most {MAX_KEY_NAME} characters"},
            )
        return await accounts.create_key(self.db, user_id, name), name

    async def keys(self, user_id: uuid.UUID) -> list[ApiKeyRecord]:
        return await accounts.list_keys(self.db, user_id)

    async def revoke_key(self, user_id: uuid.UUID, key_id: str) -> bool:
        return await accounts.revoke_key(self.db, user_id, key_id)
