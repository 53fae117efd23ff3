"""Twins of the stores of :mod:`shared.audience`: the suppression list (:class:`FakeSuppressions`,
what the consumers and webhooks use, and :class:`FakeSuppressionStore`, all of it) and
campaigns.

In-memory twin of :class:`shared.audience.campaigns.CampaignStore`: each user's campaigns, the
namespace's list of campaigns a runner looks at, each campaign's staged slices and its
recorded slices.

It keeps what the API and the runner depend on: every round trip yields to the event loop;
a move applies only while the campaign is still in the state it was read in (``IF state =
?``), an advance only while its slice count is still the one read (``IF slices = ?``), and
neither applies to a campaign that does not exist; a slice is staged only if it is not
already (``IF NOT EXISTS``, answering the one staged first) and closed only if it exists
(``IF EXISTS``); a campaign is deleted only in a deletable state (``IF state IN``), then
its slices and its place on the runners' list; a move into an active state puts the
campaign on the runners' list first (even when the move then fails, as the real store's
separate write does); rows read back in Cassandra's order (campaigns newest first, runs in
``timeuuid`` order, slices by number) with timestamps at Cassandra's precision (UTC,
milliseconds) and ``sender``/``data`` as their JSON round-trips them.
``tests/contracts/test_campaign_store.py`` runs one suite over this twin and the real store.

Faults: :meth:`CampaignTables.fail` makes the next call of an operation raise before (or, with
``applied=True``, after) it takes effect: a write whose outcome is unknown, or a process
killed there.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import orjson
from cassandra import InvalidRequest

from shared.audience.campaigns import (
    ACTIVE,
    DELETABLE,
    Campaign,
    Slice,
    Staged,
    State,
    StoredCampaigns,
)
from shared.audience.suppressions import LOOKUP_CHUNK, SuppressionChecks, Suppressions
from shared.core.addresses import address_key
from shared.delivery.recipients import (
    timeuuid_order,
)
from tests.fakes.cassandra import FakeCassandra, as_stored, interleave, ms
from tests.fakes.wire import LOOPBACK, Kind, Trip, Wire


class FakeSuppressions(SuppressionChecks):
    """Twin of :class:`shared.audience.suppressions.SuppressionStore` (add and lookup). A row keeps
    its write time (``version``, the driver's client-side timestamp: above the row's last
    one) and its ``by_recipient`` mark's own, which a write without a mark leaves as it is."""

    def __init__(self, db: FakeCassandra) -> None:
        self.db = db

    async def add(
        self,
        user_id: uuid.UUID,
        email: str,
        *,
        reason: str,
        source: str,
        event_id: str | None = None,
        at: datetime | None = None,
        scope: str | None = None,
        by_recipient: str | None = None,
    ) -> None:
        failure = await self.db._before("suppressions.add")
        key: Any = (user_id, email.lower()) if scope is None else (user_id, scope, email.lower())
        table: dict[Any, dict[str, Any]] = (
            self.db.suppressions if scope is None else self.db.list_suppressions
        )
        earlier = table.get(key, {})
        version = max(self.db.stamp(), earlier.get("version", 0) + 1)
        row: dict[str, Any] = {"reason": reason, "source": source, "event_id": event_id or ""}
        row |= {"version": version, "by_recipient": earlier.get("by_recipient")}
        row["by_recipient_at"] = earlier.get("by_recipient_at", 0)
        if by_recipient is not None:
            row |= {"by_recipient": by_recipient, "by_recipient_at": version}
        table[key] = row
        self.db._after(failure)

    async def suppressed(
        self,
        user_id: uuid.UUID,
        emails: Iterable[str],
        scope: str | None = None,
        *,
        per_query: int = LOOKUP_CHUNK,
    ) -> dict[str, str]:
        """One round trip (fault point ``suppressions.suppressed``) per ``per_query``
        addresses and table, as the real store reads them."""
        wanted = sorted({e.lower() for e in emails})
        found: dict[str, str] = {}
        for i in range(0, len(wanted), per_query):
            part = wanted[i : i + per_query]
            failure = await self.db._before("suppressions.suppressed")
            for e in part:
                if (row := self.db.suppressions.get((user_id, e))) is not None:
                    found[e] = row["reason"]
            self.db._after(failure)
            if scope is None:
                continue
            failure = await self.db._before("suppressions.suppressed")
            for e in part:
                row = self.db.list_suppressions.get((user_id, scope, e))
                if e not in found and row is not None:
                    found[e] = f"{row['reason']} ({scope})"
            self.db._after(failure)
        return found

    async def listed(
        self, user_id: uuid.UUID, most: int, scope: str | None = None
    ) -> dict[str, str] | None:
        failure = await self.db._before("suppressions.listed")
        if scope is None:
            rows = [(k[1], r) for k, r in self.db.suppressions.items() if k[0] == user_id]
        else:
            rows = [
                (k[2], r) for k, r in self.db.list_suppressions.items() if k[:2] == (user_id, scope)
            ]
        self.db._after(failure)
        if len(rows) > most:
            return None
        return {email: row["reason"] for email, row in rows}


class FakeSuppressionStore(FakeSuppressions, Suppressions):
    """Twin of the whole :class:`shared.audience.suppressions.SuppressionStore`
    (:class:`FakeSuppressions` covers only what the consumers and webhooks use)."""

    def __init__(self, db: FakeCassandra | None = None) -> None:
        super().__init__(db or FakeCassandra())

    async def add(
        self,
        user_id: uuid.UUID,
        email: str,
        *,
        reason: str,
        source: str,
        event_id: str | None = None,
        at: datetime | None = None,
        scope: str | None = None,
        by_recipient: str | None = None,
    ) -> None:
        await super().add(
            user_id,
            email,
            reason=reason,
            source=source,
            event_id=event_id,
            at=at,
            scope=scope,
            by_recipient=by_recipient,
        )
        created = as_stored(at or self.db.now())
        self._table(scope)[self._key(user_id, email, scope)]["created_at"] = created

    async def entry(
        self, user_id: uuid.UUID, email: str, scope: str | None = None
    ) -> dict[str, Any] | None:
        await interleave()
        row = self._table(scope).get(self._key(user_id, email, scope))
        if row is None:
            return None
        return {**_suppression(address_key(email), row), "version": row["version"]}

    async def forget(
        self, user_id: uuid.UUID, email: str, scope: str | None = None, *, version: int
    ) -> None:
        """``DELETE ... USING TIMESTAMP version``: the cells written at or before it go; a
        row written since keeps its own (and its mark, if that too is newer)."""
        await interleave()
        table, key = self._table(scope), self._key(user_id, email, scope)
        row = table.get(key)
        if row is None:
            return
        if row["version"] <= version:
            del table[key]
        elif row["by_recipient_at"] <= version:
            row |= {"by_recipient": None, "by_recipient_at": 0}

    def _table(self, scope: str | None) -> dict[Any, dict[str, Any]]:
        return self.db.suppressions if scope is None else self.db.list_suppressions

    @staticmethod
    def _key(user_id: uuid.UUID, email: str, scope: str | None) -> tuple[Any, ...]:
        if scope is None:
            return (user_id, address_key(email))
        return (user_id, scope, address_key(email))

    async def remove(self, user_id: uuid.UUID, email: str, scope: str | None = None) -> bool:
        found = await self.entry(user_id, email, scope)
        if found is None:
            return False
        await self.forget(user_id, email, scope, version=found["version"])
        return True

    async def page(
        self, user_id: uuid.UUID, limit: int, after: str | None, scope: str | None = None
    ) -> list[dict[str, Any]]:
        await interleave()
        if limit <= 0:
            raise InvalidRequest("LIMIT must be strictly positive")
        table = self._table(scope)
        emails = sorted(
            key[-1]
            for key in table
            if key[0] == user_id
            and (scope is None or key[1] == scope)
            and (not after or key[-1] > after)
        )
        return [_suppression(e, table[self._key(user_id, e, scope)]) for e in emails[:limit]]


def _suppression(email: str, row: dict[str, Any]) -> dict[str, Any]:
    return {
        "email": email,
        "reason": row["reason"],
        "source": row["source"],
        "event_id": row["event_id"],
        "created_at": row.get("created_at"),
        "by_recipient": row.get("by_recipient"),
    }


#: What each operation's round trip is (``tests.fakes.wire.Kind``).
KINDS: dict[str, Kind] = {
    "create": "write",
    "get": "read",
    "campaigns": "read",
    "state": "read",
    "list": "write",
    "move": "lwt",
    "runs": "read",
    "retire": "write",
    "record": "write",
    "advance": "lwt",
    "staged": "read",
    "stage": "lwt",
    "close": "lwt",
    "slices": "read",
    "delete": "lwt",
    "delete_contents": "write",
}


@dataclass
class _Landing:
    trip: Trip
    error: BaseException | None

    def landed(self) -> None:
        self.trip.landed()
        if self.error is not None:
            raise self.error


def _json(value: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(orjson.dumps(value))
    return loaded


@dataclass
class CampaignTables:
    """``campaigns``, ``campaign_runs`` and ``campaign_batches``, shared by the twins of one
    keyspace."""

    campaigns: dict[tuple[uuid.UUID, uuid.UUID], Campaign] = field(default_factory=dict)
    runs: dict[str, dict[uuid.UUID, uuid.UUID]] = field(default_factory=dict)
    """namespace -> campaign -> user."""
    slices: dict[uuid.UUID, dict[int, Slice]] = field(default_factory=dict)
    staged: dict[uuid.UUID, dict[int, Staged]] = field(default_factory=dict)
    """``campaign_slices``: campaign -> slice number -> the slice staged."""
    failures: dict[str, list[tuple[BaseException, bool]]] = field(default_factory=dict)
    wire: Wire = LOOPBACK
    """How each round trip travels (``tests.fakes.wire``)."""

    def fail(self, operation: str, error: BaseException, *, applied: bool = False) -> None:
        """Make the next call of ``operation`` (a store method's name, e.g. ``"advance"``)
        raise ``error``, before it takes effect or (``applied``) after."""
        if not callable(getattr(FakeCampaigns, operation, None)) or operation.startswith("_"):
            raise ValueError(f"no operation {operation!r}")
        self.failures.setdefault(operation, []).append((error, applied))


class FakeCampaigns(StoredCampaigns):
    """Twin of :class:`shared.audience.campaigns.CampaignStore` (every operation)."""

    def __init__(self, namespace: str, tables: CampaignTables | None = None) -> None:
        self.namespace = namespace
        self.tables = tables or CampaignTables()

    async def _before(self, operation: str) -> _Landing:
        """One round trip, over the wire; what ends it once the operation took effect (the
        wire's landing, then the injected error, if any)."""
        trip = await self.tables.wire.trip(f"campaigns.{operation}", KINDS[operation])
        queue = self.tables.failures.get(operation)
        if not queue:
            return _Landing(trip, None)
        error, applied = queue.pop(0)
        if not applied:
            raise error
        return _Landing(trip, error)

    @staticmethod
    def _after(landing: _Landing) -> None:
        landing.landed()

    async def create(
        self,
        user_id: uuid.UUID,
        name: str,
        template_id: uuid.UUID,
        list_id: uuid.UUID,
        sender: dict[str, Any],
        data: dict[str, Any],
        rate: int,
        send_at: datetime | None,
        campaign_id: uuid.UUID | None = None,
    ) -> Campaign:
        now = datetime.now(UTC)
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)
        made = Campaign(
            user_id, campaign_id or uuid.uuid1(), name, template_id, list_id, sender, data, rate,
            send_at, "draft", None, now, now, 0, None, 0, 0, 0,
        )  # fmt: skip
        failure = await self._before("create")
        self.tables.campaigns[(user_id, made.campaign_id)] = replace(
            made,
            sender=_json(sender),
            data=_json(data),
            send_at=send_at and ms(send_at),
            created_at=ms(now),
            updated_at=ms(now),
        )
        self._after(failure)
        return made

    async def delete(self, campaign: Campaign) -> bool:
        failure = await self._before("delete")
        key = (campaign.user_id, campaign.campaign_id)
        stored = self.tables.campaigns.get(key)
        if stored is None or stored.state not in DELETABLE:
            self._after(failure)
            return False
        del self.tables.campaigns[key]
        self._after(failure)
        failure = await self._before("delete_contents")
        self.tables.staged.pop(campaign.campaign_id, None)
        self.tables.slices.pop(campaign.campaign_id, None)
        self._after(failure)
        await self.retire(campaign.campaign_id)
        return True

    async def get(self, user_id: uuid.UUID, campaign_id: uuid.UUID) -> Campaign | None:
        self._after(await self._before("get"))
        return self.tables.campaigns.get((user_id, campaign_id))

    async def campaigns(self, user_id: uuid.UUID) -> list[Campaign]:
        self._after(await self._before("campaigns"))
        mine = [c for (user, _), c in self.tables.campaigns.items() if user == user_id]
        return sorted(mine, key=lambda c: timeuuid_order(c.campaign_id), reverse=True)

    async def state(self, user_id: uuid.UUID, campaign_id: uuid.UUID) -> str | None:
        self._after(await self._before("state"))
        found = self.tables.campaigns.get((user_id, campaign_id))
        return found.state if found else None

    async def move(
        self,
        campaign: Campaign,
        to: State,
        *,
        reason: str | None = None,
        send_at: datetime | None = None,
    ) -> bool:
        if to in ACTIVE:
            # Its own write, before the conditional update (as the real store's).
            listed = await self.tables.wire.trip("campaigns.list", "write")
            runs = self.tables.runs.setdefault(self.namespace, {})
            runs[campaign.campaign_id] = campaign.user_id
            listed.landed()
        failure = await self._before("move")
        key = (campaign.user_id, campaign.campaign_id)
        stored = self.tables.campaigns.get(key)
        if stored is None or stored.state != campaign.state:
            self._after(failure)
            return False
        when = send_at or campaign.send_at
        self.tables.campaigns[key] = replace(
            stored,
            state=to,
            reason=reason,
            updated_at=ms(datetime.now(UTC)),
            send_at=when and ms(when),
        )
        self._after(failure)
        return True

    async def runs(self) -> list[tuple[uuid.UUID, uuid.UUID]]:
        self._after(await self._before("runs"))
        runs = self.tables.runs.get(self.namespace, {})
        return [(runs[c], c) for c in sorted(runs, key=timeuuid_order)]

    async def retire(self, campaign_id: uuid.UUID) -> None:
        failure = await self._before("retire")
        self.tables.runs.get(self.namespace, {}).pop(campaign_id, None)
        self._after(failure)

    async def record(self, campaign_id: uuid.UUID, part: Slice) -> None:
        failure = await self._before("record")
        self.tables.slices.setdefault(campaign_id, {})[part.slice] = part
        self._after(failure)

    async def advance(
        self, campaign: Campaign, bucket: int, after: str | None, released: int, skipped: int
    ) -> bool:
        failure = await self._before("advance")
        key = (campaign.user_id, campaign.campaign_id)
        stored = self.tables.campaigns.get(key)
        if stored is None or stored.slices != campaign.slices:
            self._after(failure)
            return False
        self.tables.campaigns[key] = replace(
            stored,
            cursor_bucket=bucket,
            cursor_after=after,
            slices=campaign.slices + 1,
            released=campaign.released + released,
            skipped=campaign.skipped + skipped,
            updated_at=ms(datetime.now(UTC)),
        )
        self._after(failure)
        return True

    async def staged(self, campaign_id: uuid.UUID, number: int) -> Staged | None:
        self._after(await self._before("staged"))
        return self.tables.staged.get(campaign_id, {}).get(number)

    async def stage(self, campaign_id: uuid.UUID, part: Staged) -> Staged:
        failure = await self._before("stage")
        mine = self.tables.staged.setdefault(campaign_id, {})
        if part.slice not in mine:  # IF NOT EXISTS
            mine[part.slice] = replace(part, body=None if part.body is None else _json(part.body))
            self._after(failure)
            return part
        self._after(failure)
        return mine[part.slice]

    async def close(self, campaign_id: uuid.UUID, number: int) -> None:
        failure = await self._before("close")
        mine = self.tables.staged.get(campaign_id, {})
        if number in mine:  # IF EXISTS
            mine[number] = replace(mine[number], body=None)
        self._after(failure)

    async def slices(self, campaign_id: uuid.UUID) -> list[Slice]:
        self._after(await self._before("slices"))
        found = self.tables.slices.get(campaign_id, {})
        return [found[n] for n in sorted(found)]
