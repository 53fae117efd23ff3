"""Accepting a batch durably, finishing an acceptance that stopped part-way, and settling a
cancelled batch.

The order is what makes a crash at any point safe:

1. a large batch's content (its message, every chunk's recipient list) on its partition, in
   statements Cassandra takes whatever the batch's size (``shared.delivery.batchstore``): nothing
   reads it until (2), so a crash here leaves nothing that exists;
2. the batch's header with its status, its outbox row (``shared.delivery.outbox``) and its indexes
   (the user's list, the batch's ``queued`` stat row), with a small batch's content (the
   common case: then this is the only write), in one logged batch: the batch exists, is
   listed and counted, and the relay will look after it, or none of that;
3. a confirmed publish of ``batch.<uuid>``, then the outbox row marked published (the marks
   of a moment written together: :meth:`Acceptance.published`).

A batch whose request has no ``Idempotency-Key`` is stored ``pending`` in (2) and committed
(:meth:`Acceptance.commit`: a lightweight transaction, ``pending`` to ``accepted`` or
``scheduled``) before its 202. Its client may send again after any error, so whether it goes
must be decided durably, once: the request that stored it is the only one that ever commits
it, a failed request cancels it (the same kind of transaction), and the relay cancels one
still pending past :attr:`Acceptance.decide_within` and publishes only committed batches. A
commit whose outcome is unknown is repeated (its transaction reads at SERIAL, so a repeat
tells what was decided) until the request's deadline. (Two may decide, the request and the
relay, so the decision is a transaction: plain writes ordered by timestamps would let a
commit that lands late, after a relay read it pending, be both cancelled and sent.) Its
indexes are written while it is pending, as a cancelled batch's are: a cancellation's
settling uncounts it.

:meth:`Acceptance.finish` redoes (3) for a stored batch, and its indexes (which an earlier
release wrote after (2)) from what (2) stored. The relay calls it for outbox rows left
behind; the API calls it when a retried request (same ``Idempotency-Key``) finds the batch
stored, and answers with the 202 stored in (2).

:meth:`Acceptance.settle` does what a cancellation owes: the batch counts nothing in the
stats and its recipients go back to the quota of its day. Both are idempotent (the refund is a
row per batch), so whoever finds a batch cancelled settles it again: the API that cancelled
it, a retried cancel, the relay, the scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol

from cassandra.query import Statement

from shared.core.batch_ids import accepted_at
from shared.core.errors import DependencyUnavailable, PublishError
from shared.core.models import BatchJob
from shared.delivery.batchstore import Batches, BatchHeader, Content, NewBatch
from shared.delivery.outbox import MARK_WINDOW, Marks, OutboxRows
from shared.infra.broker import Broker
from shared.infra.topology import batch_key

log = logging.getLogger(__name__)

#: Statuses of a batch whose acceptance was decided (committed, or stored so from the start).
ACCEPTED: Final = frozenset({"accepted", "scheduled", "dispatched"})
#: Seconds between two attempts of a commit whose outcome is unknown.
COMMIT_PAUSE: Final = 0.2
#: Seconds an attempt may take at least, even past the deadline (the first is always made).
MIN_ATTEMPT: Final = 1.0


def _now() -> datetime:
    return datetime.now(UTC)


class Refunds(Protocol):
    """Where a cancelled batch's recipients go back
    (``shared.accounts.ratelimit.RecipientQuota``)."""

    async def refund(self, user_id: uuid.UUID, batch_id: uuid.UUID, recipients: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """What committing a pending batch decided."""

    status: str | None
    """The status decided (``accepted``/``scheduled``, or ``cancelled``); None while unknown."""

    @property
    def accepted(self) -> bool:
        return self.status in ACCEPTED


@dataclass
class Acceptance:
    batches: Batches
    outbox: OutboxRows
    broker: Broker
    refunds: Refunds | None = None
    """The daily quota a cancelled batch's recipients go back to (None: none kept here)."""
    decide_within: timedelta = timedelta(seconds=60)
    """How long after its acceptance a pending batch's request may still commit it; the relay
    cancels one still pending after that."""
    clock: Callable[[], datetime] = field(default=_now)
    mark_window: float = MARK_WINDOW
    """Seconds the outbox marks of published batches are gathered
    (``shared.delivery.outbox.Marks``)."""

    marks: Marks = field(init=False)
    """The outbox marks this process gathers (:meth:`published`)."""

    def __post_init__(self) -> None:
        self.marks = Marks(self.outbox, self.mark_window)

    async def published(self, batch_id: uuid.UUID) -> None:
        """Step 3's mark, gathered with this process's others of the moment and written with
        them; returns once written (or its failure logged: the relay finishes the row)."""
        await self.marks.mark(batch_id)

    async def store(
        self,
        batch: NewBatch,
        *,
        also: Sequence[Statement] = (),
        content: Content | None = None,
    ) -> None:
        """Steps 1-2, with the writes ``also`` of other partitions in (2)'s request
        (``content``: the batch's, if the caller encoded it already). A scheduled batch
        stored as accepted has no outbox row: its schedule row (in ``also``) stands for it.
        Raises DependencyUnavailable if any fails (the batch may or may not be stored then:
        a retry with the same id and body writes the same rows), TooLargeToStore if
        Cassandra refused its content for its size (it is not stored)."""
        own = []
        if batch.pending or batch.send_at is None:
            own.append(await self.outbox.statement(batch.batch_id, batch.user_id))
        await self.batches.write(batch, also=[*own, *also], content=content, indexed=True)

    async def commit(self, batch: NewBatch, *, until: datetime) -> Decision:
        """The decision of a pending batch. The commit is repeated while its outcome is
        unknown, until ``until`` (at least once)."""
        return Decision(await self._decided(batch, until))

    async def _decided(self, batch: NewBatch, until: datetime) -> str | None:
        while True:
            left = (until - self.clock()).total_seconds()
            try:
                decided = await self.batches.commit(
                    batch.batch_id, batch.committed, timeout=max(MIN_ATTEMPT, left)
                )
            except DependencyUnavailable as exc:
                if self.clock() >= until:
                    log.warning("batch %s: commit outcome unknown (%s)", batch.batch_id, exc)
                    return None
                await asyncio.sleep(COMMIT_PAUSE)
                continue
            # None: nothing stored (it cannot have been committed, and never will be).
            return decided or "cancelled"

    async def publish(self, batch_id: uuid.UUID) -> bool:
        """Step 4's publish; False when the broker did not confirm (the relay will publish)."""
        try:
            await self.broker.publish(
                batch_key(batch_id), BatchJob(batch_id=batch_id).encode(), message_id=str(batch_id)
            )
        except PublishError as exc:
            log.warning("batch %s stored but not yet published (%s); the relay will", batch_id, exc)
            return False
        return True

    async def settle(self, user_id: uuid.UUID, batch_id: uuid.UUID, mailed: int) -> None:
        """What a cancelled batch owes: it counts nothing in the stats, and its ``mailed``
        recipients go back to the quota of its day. Safe to repeat (each is written once,
        however often it is asked); raises DependencyUnavailable when either failed."""
        writes = [self.batches.uncount(user_id, batch_id)]
        if self.refunds is not None:
            writes.append(self.refunds.refund(user_id, batch_id, mailed))
        await asyncio.gather(*writes)

    async def finish(self, batch_id: uuid.UUID) -> BatchHeader | None:
        """Finish a stored batch's acceptance; its header (whatever its status), or None if it
        is not stored, or is pending and its request may still decide it.

        A pending batch older than :attr:`decide_within` is cancelled (its request gave up or
        died: it never answered 202) and, like any cancelled batch, settled. Raises
        DependencyUnavailable (PublishError included) when it cannot finish now.
        """
        header = await self.batches.header(batch_id)
        if header is None:
            return None
        if header.status == "pending":
            if self.clock() - accepted_at(batch_id) < self.decide_within:
                return None
            header = replace(header, status=await self.batches.cancel(batch_id) or "cancelled")
        if header.status == "cancelled":
            await self.settle(header.user_id, batch_id, header.mailed)
        elif header.status == "scheduled":
            # The scheduler publishes it when its time comes; only the indexes may lack.
            await self.batches.index_stored(header)
        elif header.status == "accepted":
            # Not yet split by a consumer: the indexes may be missing and it may never have
            # been published. Both are harmless to repeat.
            await self.batches.index_stored(header)
            await self.broker.publish(
                batch_key(batch_id), BatchJob(batch_id=batch_id).encode(), message_id=str(batch_id)
            )
        elif header.status == "dispatched":
            # Published and split already (its request published it though its indexes
            # failed): the indexes may still be missing.
            await self.batches.index_stored(header)
        await self.outbox.done(batch_id)
        return header
