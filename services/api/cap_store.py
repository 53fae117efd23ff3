"""The caps' ledgers (``services.api.caps``): the one writer of ``cap_holds``
(deploy/cql/0035_caps.cql).

A ledger is one row per user and ledger name (:func:`ledger_name`): its holders, as one
frozen map, and a version. It is read at SERIAL (a change in progress is completed first,
and a change whose outcome was unknown is settled by reading it) and rewritten whole by a
lightweight transaction on the version read, which every write moves by one: no write
applies from a stale reading, whatever happened in between.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

from services.api.caps import Cap, Holds
from shared.infra.db import Database, utc


def ledger_name(cap: Cap, scope: uuid.UUID | None = None) -> str:
    """The ledger of ``cap`` (of ``scope``, the template whose versions are counted)."""
    return cap if scope is None else f"{cap}:{scope}"


class CapStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def read(self, user_id: uuid.UUID, ledger: str) -> Holds:
        row = await self.db.one(
            "SELECT holders, version FROM cap_holds WHERE user_id = ? AND cap = ?",
            (user_id, ledger),
            serial=True,
        )
        if row is None:
            return Holds(None, {})
        holders = {h: utc(at) or datetime.now(UTC) for h, at in (row["holders"] or {}).items()}
        return Holds(row["version"], holders)

    async def write(
        self,
        user_id: uuid.UUID,
        ledger: str,
        expected: int | None,
        holders: Mapping[str, datetime],
    ) -> bool:
        """Make ``holders`` the ledger's, if its version is still ``expected`` (None: it was
        never written); False, writing nothing, otherwise."""
        row = await self.db.one(
            "UPDATE cap_holds SET holders = ?, version = ? WHERE user_id = ? AND cap = ? "
            "IF version = ?",
            (dict(holders), (expected or 0) + 1, user_id, ledger, expected),
        )
        return bool(row and row["[applied]"])

    async def drop(self, user_id: uuid.UUID, ledger: str, expected: int | None) -> bool:
        """Delete the ledger (its things are all gone: a deleted template's versions), if
        its version is still ``expected``; True when it is gone."""
        if expected is None:
            return True
        row = await self.db.one(
            "DELETE FROM cap_holds WHERE user_id = ? AND cap = ? IF version = ?",
            (user_id, ledger, expected),
        )
        # Not applied on a ledger already gone answers no version: gone is what was wanted.
        return bool(row and (row["[applied]"] or row.get("version") is None))
