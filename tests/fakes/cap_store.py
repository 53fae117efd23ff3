"""In-memory twin of :class:`services.api.cap_store.CapStore` (held to it by
``tests/contracts/test_cap_store.py``): one ledger per user and name, read whole, rewritten
whole only while its version is the one the writer read (a missing ledger's is None), and
dropped likewise; claim times kept at Cassandra's millisecond precision. Each operation is one
round trip over its wire (``tests.fakes.wire``), so a simulator can fail it before or after
it applies."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime

from services.api.capping import CapLedger
from services.api.caps import Holds
from tests.fakes.wire import LOOPBACK, Wire, round_trip


def _ms(at: datetime) -> datetime:
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


class FakeCapStore(CapLedger):
    def __init__(self, wire: Wire = LOOPBACK) -> None:
        self.wire = wire
        """How each round trip travels (``tests.fakes.wire``)."""
        self.ledgers: dict[tuple[uuid.UUID, str], Holds] = {}

    @round_trip("caps.read", "read")
    async def read(self, user_id: uuid.UUID, ledger: str) -> Holds:
        return self.ledgers.get((user_id, ledger), Holds(None, {}))

    @round_trip("caps.write", "lwt")
    async def write(
        self,
        user_id: uuid.UUID,
        ledger: str,
        expected: int | None,
        holders: Mapping[str, datetime],
    ) -> bool:
        found = self.ledgers.get((user_id, ledger), Holds(None, {}))
        if found.version != expected:
            return False
        kept = {h: _ms(at) for h, at in holders.items()}
        self.ledgers[(user_id, ledger)] = Holds((expected or 0) + 1, kept)
        return True

    @round_trip("caps.drop", "lwt")
    async def drop(self, user_id: uuid.UUID, ledger: str, expected: int | None) -> bool:
        found = self.ledgers.get((user_id, ledger))
        if expected is None or found is None:
            return True  # read as never written, or gone: nothing to drop
        if found.version != expected:
            return False
        del self.ledgers[(user_id, ledger)]
        return True
