"""StoredCampaigns: a template sent to a contact list, now or at ``send_at``. The lifecycle (pure)
and the one writer of ``campaigns``, ``campaign_runs``, ``campaign_slices`` and
``campaign_batches``.

``draft → scheduled → sending ⇄ paused → sent | cancelled``. Users schedule, pause, resume
and cancel (:func:`next_state`); the runner (``services.api.campaign_runner``) starts a
scheduled campaign when its time comes and ends it ``sent`` once the list is exhausted.
Every move is a conditional update on the state the mover saw, so a pause racing the runner
either lands before the runner's next move or makes it fail, never both.

A campaign goes out in slices, each one batch: the runner reads the next slice from the
campaign's cursor and *stages* it (``campaign_slices``: the batch id it will get, the exact
batch request, the cursor after it; ``IF NOT EXISTS``, so of two runners both use the first),
has it accepted under an Idempotency-Key of (campaign, slice), records the batch, then moves
the cursor and the slice count together, conditionally on the count it read, and closes the
staged slice (drops its body). A runner that dies anywhere in between finds the slice staged
and sends the same request again (the key answers the first 202), or finds its batch stored
and records it without accepting anything; it never reads the slice from the list again, so
a contact or template changed meanwhile changes nothing. Two runners never both move the
cursor.

While a campaign is paused the consumers hold its batches' chunks (``services.consumers``
asks :meth:`CampaignStore.state` through a short cache), so a pause stops dispatch within
about a second (writing nothing while they wait: ``services.consumers.campaign_hold``), and
a resume lets the held work go within two minutes with nothing sent twice.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol

import orjson

from shared.infra.db import Database, Row, utc

State = Literal["draft", "scheduled", "sending", "paused", "sent", "cancelled"]
Action = Literal["schedule", "pause", "resume", "cancel"]
#: States a runner looks at.
ACTIVE: Final[frozenset[str]] = frozenset({"scheduled", "sending", "paused"})
#: States a campaign may be deleted in (nothing of it runs).
DELETABLE: Final[tuple[str, ...]] = ("draft", "sent", "cancelled")
#: The metadata key naming a campaign's batches (echoed in webhooks; the consumers' hold).
METADATA_KEY: Final = "campaign_id"


class LifecycleError(ValueError):
    """An action the campaign's state does not allow; the message says why."""


def next_state(current: str, action: Action, *, started: bool) -> State:
    """The state ``action`` moves a campaign in ``current`` to (``started``: it has sent
    a slice already, so a resume continues sending rather than waiting for its time)."""
    if current in ("sent", "cancelled"):
        raise LifecycleError(f"the campaign is {current}: nothing can change it")
    if action == "schedule":
        if current != "draft":
            raise LifecycleError(f"the campaign is {current}: only a draft can be scheduled")
        return "scheduled"
    if action == "pause":
        if current not in ("scheduled", "sending"):
            raise LifecycleError(f"the campaign is {current}: only a running one can be paused")
        return "paused"
    if action == "resume":
        if current != "paused":
            raise LifecycleError(f"the campaign is {current}: only a paused one can be resumed")
        return "sending" if started else "scheduled"
    return "cancelled"


@dataclass(frozen=True, slots=True)
class Campaign:
    user_id: uuid.UUID
    campaign_id: uuid.UUID
    name: str
    template_id: uuid.UUID
    list_id: uuid.UUID
    sender: dict[str, Any]
    data: dict[str, Any]
    rate: int
    send_at: datetime | None
    state: str
    reason: str | None
    created_at: datetime
    updated_at: datetime | None
    cursor_bucket: int
    cursor_after: str | None
    slices: int
    released: int
    skipped: int


@dataclass(frozen=True, slots=True)
class Slice:
    slice: int
    batch_id: uuid.UUID
    recipients: int


@dataclass(frozen=True, slots=True)
class Staged:
    """A slice stored before its batch is accepted: what every retry of it sends, unchanged."""

    slice: int
    batch_id: uuid.UUID
    """The id its batch gets (unless its key already named another)."""
    body: dict[str, Any] | None
    """The batch request, exactly as first built; None once closed (the cursor moved past)."""
    contacts: int
    """How many contacts of the list it covers (those left out are counted skipped)."""
    end_bucket: int
    end_after: str | None
    """The cursor after it."""

    @property
    def closed(self) -> bool:
        return self.body is None


_STAGED_COLUMNS = "slice, batch_id, body, contacts, end_bucket, end_after"

_COLUMNS = (
    "user_id, campaign_id, name, template_id, list_id, sender, data, rate, send_at, state, "
    "reason, created_at, updated_at, cursor_bucket, cursor_after, slices, released, skipped"
)


class StoredCampaigns(Protocol):
    """What callers use of :class:`CampaignStore` (the store, or its in-memory twin)."""

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
    ) -> Campaign: ...

    async def delete(self, campaign: Campaign) -> bool: ...

    async def get(self, user_id: uuid.UUID, campaign_id: uuid.UUID) -> Campaign | None: ...

    async def campaigns(self, user_id: uuid.UUID) -> list[Campaign]: ...

    async def state(self, user_id: uuid.UUID, campaign_id: uuid.UUID) -> str | None: ...

    async def move(
        self,
        campaign: Campaign,
        to: State,
        *,
        reason: str | None = None,
        send_at: datetime | None = None,
    ) -> bool: ...

    async def runs(self) -> list[tuple[uuid.UUID, uuid.UUID]]: ...

    async def retire(self, campaign_id: uuid.UUID) -> None: ...

    async def record(self, campaign_id: uuid.UUID, part: Slice) -> None: ...

    async def advance(
        self, campaign: Campaign, bucket: int, after: str | None, released: int, skipped: int
    ) -> bool: ...

    async def staged(self, campaign_id: uuid.UUID, number: int) -> Staged | None: ...

    async def stage(self, campaign_id: uuid.UUID, part: Staged) -> Staged: ...

    async def close(self, campaign_id: uuid.UUID, number: int) -> None: ...

    async def slices(self, campaign_id: uuid.UUID) -> list[Slice]: ...


class CampaignStore:
    def __init__(self, db: Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace

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
        """A new draft (``campaign_id``: the id its place under the cap was claimed for)."""
        now = datetime.now(UTC)
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)  # as Cassandra keeps it
        made = Campaign(
            user_id, campaign_id or uuid.uuid1(), name, template_id, list_id, sender, data, rate,
            send_at, "draft", None, now, now, 0, None, 0, 0, 0,
        )  # fmt: skip
        # A lightweight transaction like every later write of the row: those are stamped by
        # Cassandra's Paxos ballot, at millisecond precision, and a plain insert stamped by
        # this client's clock later in the same millisecond outlived the first advance (a
        # contract test: the cursor moved, its counts were the insert's).
        await self.db.one(
            "INSERT INTO campaigns (user_id, campaign_id, name, template_id, list_id, sender, "
            "data, rate, send_at, state, created_at, updated_at, cursor_bucket, slices, "
            "released, skipped) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'draft', ?, ?, 0, 0, 0, 0) "
            "IF NOT EXISTS",
            (
                user_id,
                made.campaign_id,
                name,
                template_id,
                list_id,
                orjson.dumps(sender).decode(),
                orjson.dumps(data).decode(),
                rate,
                send_at,
                now,
                now,
            ),
        )
        return made

    async def delete(self, campaign: Campaign) -> bool:
        """Delete ``campaign`` if it is in a state of :data:`DELETABLE` (a conditional
        delete, so a schedule racing it cannot start what is being deleted), then its staged
        and recorded slices and its place on the runners' list; False, deleting nothing,
        when it is in another state or gone."""
        row = await self.db.one(
            "DELETE FROM campaigns WHERE user_id = ? AND campaign_id = ? IF state IN ?",
            (campaign.user_id, campaign.campaign_id, list(DELETABLE)),
        )
        if not (row and row["[applied]"]):
            return False
        for table in ("campaign_slices", "campaign_batches"):
            await self.db.execute(
                f"DELETE FROM {table} WHERE campaign_id = ?",  # noqa: S608 - fixed names
                (campaign.campaign_id,),
                idempotent=True,
            )
        await self.retire(campaign.campaign_id)
        return True

    async def get(self, user_id: uuid.UUID, campaign_id: uuid.UUID) -> Campaign | None:
        row = await self.db.one(
            f"SELECT {_COLUMNS} FROM campaigns WHERE user_id = ? AND campaign_id = ?",  # noqa: S608 - fixed names
            (user_id, campaign_id),
        )
        return _campaign(row) if row else None

    async def campaigns(self, user_id: uuid.UUID) -> list[Campaign]:
        """Newest first."""
        rows = await self.db.all_pages(
            f"SELECT {_COLUMNS} FROM campaigns WHERE user_id = ?",  # noqa: S608 - fixed names
            (user_id,),
        )
        return [_campaign(r) for r in rows]

    async def state(self, user_id: uuid.UUID, campaign_id: uuid.UUID) -> str | None:
        row = await self.db.one(
            "SELECT state FROM campaigns WHERE user_id = ? AND campaign_id = ?",
            (user_id, campaign_id),
        )
        return row["state"] if row else None

    async def move(
        self,
        campaign: Campaign,
        to: State,
        *,
        reason: str | None = None,
        send_at: datetime | None = None,
    ) -> bool:
        """Move ``campaign`` from the state it was read in to ``to`` (and set its
        ``send_at`` when given); False, changing nothing, when its state moved meanwhile.
        A campaign moving into an active state is put on the runners' list first."""
        if to in ACTIVE:
            await self.db.execute(
                "INSERT INTO campaign_runs (namespace, campaign_id, user_id) VALUES (?, ?, ?)",
                (self.namespace, campaign.campaign_id, campaign.user_id),
                idempotent=True,
            )
        row = await self.db.one(
            "UPDATE campaigns SET state = ?, reason = ?, updated_at = ?, send_at = ? "
            "WHERE user_id = ? AND campaign_id = ? IF state = ?",
            (
                to,
                reason,
                datetime.now(UTC),
                send_at or campaign.send_at,
                campaign.user_id,
                campaign.campaign_id,
                campaign.state,
            ),
        )
        return bool(row and row["[applied]"])

    async def runs(self) -> list[tuple[uuid.UUID, uuid.UUID]]:
        """(user, campaign) of every campaign a runner has to look at."""
        rows = await self.db.all_pages(
            "SELECT user_id, campaign_id FROM campaign_runs WHERE namespace = ?",
            (self.namespace,),
        )
        return [(r["user_id"], r["campaign_id"]) for r in rows]

    async def retire(self, campaign_id: uuid.UUID) -> None:
        """Take a campaign that ended (sent, cancelled) off the runners' list."""
        await self.db.execute(
            "DELETE FROM campaign_runs WHERE namespace = ? AND campaign_id = ?",
            (self.namespace, campaign_id),
            idempotent=True,
        )

    async def record(self, campaign_id: uuid.UUID, part: Slice) -> None:
        await self.db.execute(
            "INSERT INTO campaign_batches (campaign_id, slice, batch_id, recipients) "
            "VALUES (?, ?, ?, ?)",
            (campaign_id, part.slice, part.batch_id, part.recipients),
            idempotent=True,
        )

    async def advance(
        self, campaign: Campaign, bucket: int, after: str | None, released: int, skipped: int
    ) -> bool:
        """Move the cursor past the slice just accepted (one slice on from what
        ``campaign`` was read with); False when another runner moved it first."""
        row = await self.db.one(
            "UPDATE campaigns SET cursor_bucket = ?, cursor_after = ?, slices = ?, "
            "released = ?, skipped = ?, updated_at = ? WHERE user_id = ? AND campaign_id = ? "
            "IF slices = ?",
            (
                bucket,
                after,
                campaign.slices + 1,
                campaign.released + released,
                campaign.skipped + skipped,
                datetime.now(UTC),
                campaign.user_id,
                campaign.campaign_id,
                campaign.slices,
            ),
        )
        return bool(row and row["[applied]"])

    async def staged(self, campaign_id: uuid.UUID, number: int) -> Staged | None:
        """Slice ``number`` as staged (read at SERIAL: a staging in progress is settled)."""
        row = await self.db.one(
            f"SELECT {_STAGED_COLUMNS} FROM campaign_slices WHERE campaign_id = ? AND slice = ?",  # noqa: S608 - fixed names
            (campaign_id, number),
            serial=True,
        )
        return _staged(row) if row else None

    async def stage(self, campaign_id: uuid.UUID, part: Staged) -> Staged:
        """Store ``part`` unless its slice is staged already; the slice as staged (``part``,
        or the one staged first, which every runner then sends)."""
        row = await self.db.one(
            f"INSERT INTO campaign_slices (campaign_id, {_STAGED_COLUMNS}) "  # noqa: S608 - fixed names
            "VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
            (
                campaign_id,
                part.slice,
                part.batch_id,
                None if part.body is None else orjson.dumps(part.body).decode(),
                part.contacts,
                part.end_bucket,
                part.end_after,
            ),
        )
        if row is None or row["[applied]"]:
            return part
        return _staged(row)

    async def close(self, campaign_id: uuid.UUID, number: int) -> None:
        """Drop a staged slice's body once the cursor moved past it (the row stays: a runner
        that read the campaign before the move finds the slice closed and stops)."""
        await self.db.execute(
            "UPDATE campaign_slices SET body = null WHERE campaign_id = ? AND slice = ? IF EXISTS",
            (campaign_id, number),
        )

    async def slices(self, campaign_id: uuid.UUID) -> list[Slice]:
        rows = await self.db.all_pages(
            "SELECT slice, batch_id, recipients FROM campaign_batches WHERE campaign_id = ?",
            (campaign_id,),
        )
        return [Slice(r["slice"], r["batch_id"], r["recipients"]) for r in rows]


def _campaign(row: Row) -> Campaign:
    return Campaign(
        user_id=row["user_id"],
        campaign_id=row["campaign_id"],
        name=row["name"],
        template_id=row["template_id"],
        list_id=row["list_id"],
        sender=orjson.loads(row["sender"] or "{}"),
        data=orjson.loads(row["data"] or "{}"),
        rate=row["rate"] or 0,
        send_at=utc(row["send_at"]),
        state=row["state"],
        reason=row["reason"],
        created_at=utc(row["created_at"]) or datetime.now(UTC),
        updated_at=utc(row["updated_at"]),
        cursor_bucket=row["cursor_bucket"] or 0,
        cursor_after=row["cursor_after"],
        slices=row["slices"] or 0,
        released=row["released"] or 0,
        skipped=row["skipped"] or 0,
    )


def _staged(row: Row) -> Staged:
    return Staged(
        slice=row["slice"],
        batch_id=row["batch_id"],
        body=orjson.loads(row["body"]) if row["body"] is not None else None,
        contacts=row["contacts"] or 0,
        end_bucket=row["end_bucket"] or 0,
        end_after=row["end_after"],
    )
