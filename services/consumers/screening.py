"""The send-time suppression check: the last look at the user's suppression list before a
provider is called.

The API leaves out the addresses already suppressed when it accepts a batch; this check
catches those suppressed since (a hard bounce or an unsubscribe in another batch, an address
added by hand): a scheduled batch, a campaign's slice, a failover hours later, a second batch
accepted just before the first one's bounce arrived. It runs in
:meth:`services.consumers.calls.Caller.call`, once per provider call, after the recipients
the call is for are final and before its request is built, so every way to a provider passes
it: a chunk's first attempt, a retry through the same or another provider (a bounce may have
arrived in between), a re-send of one recipient, the next attempt after an ambiguous call was
resolved.

It costs one read of the user's ``suppressions`` partition for every address the call would
mail (to, cc and bcc: at most :data:`shared.audience.suppressions.SEND_LOOKUP`, one request's most),
a second read of the list's own partition for mail that names a list, and writes only when
someone is dropped:

* a suppressed recipient ends ``dropped`` and ``failed`` on a row of its own with the reason
  ``suppressed: <why>``, counted ``failed`` once (``RecipientStore.suppressed``); the rest of
  the chunk goes as usual;
* a suppressed cc or bcc address is left out of the request, as the API leaves it out of a
  batch (it has no row of its own: a log line says so);
* nobody left: no call; the attempt is recorded as accepted for nobody and the chunk ends.

A read that fails (Cassandra down, a timeout) raises ``DependencyUnavailable`` before
anything is built: the delivery is retried in place and nothing goes out unchecked. The drop
is written before the call, and a rerun (a redelivery, or this delivery's retry) finds the
dropped recipients final and the same cells written, so nothing is counted twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from services.consumers import protocol
from services.consumers.faults import FaultPoints
from services.consumers.followup import FollowUps
from shared.audience.suppressions import SEND_LOOKUP, SuppressionChecks
from shared.core.addresses import address_key
from shared.core.models import Message
from shared.delivery.attempts import tag
from shared.delivery.batchstore import BatchHeader
from shared.delivery.recipients import Recipients
from shared.infra.db import Row
from shared.infra.metrics import DispatchMetrics
from shared.outbound.user_hooks import HookEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Screened:
    """A call's recipients and message once the suppressed are left out."""

    send: list[Row]
    dropped: dict[uuid.UUID, str]
    """Log id -> reason, of the recipients left out."""
    message: Message
    copies: tuple[str, ...]
    """The cc and bcc addresses left out."""


def addresses(rows: Sequence[Row], message: Message) -> list[str]:
    """Every address a call for ``rows`` would mail: the recipients, then cc and bcc."""
    return [*(str(r["email"]) for r in rows), *(a.email for a in (*message.cc, *message.bcc))]


def screen(rows: Sequence[Row], message: Message, listed: Mapping[str, str]) -> Screened:
    """``rows`` and ``message`` without the addresses ``listed`` (address key -> the
    suppression's reason) (pure)."""
    if not listed:
        return Screened(list(rows), {}, message, ())
    send: list[Row] = []
    dropped: dict[uuid.UUID, str] = {}
    for row in rows:
        why = listed.get(address_key(str(row["email"])))
        if why is None:
            send.append(row)
        else:
            dropped[row["log_id"]] = f"suppressed: {why}"
    copies = tuple(a.email for a in (*message.cc, *message.bcc) if address_key(a.email) in listed)
    if copies:
        message = message.model_copy(
            update={
                "cc": tuple(a for a in message.cc if address_key(a.email) not in listed),
                "bcc": tuple(a for a in message.bcc if address_key(a.email) not in listed),
            }
        )
    return Screened(send, dropped, message, copies)


def dropped_events(
    job: protocol.Job, rows: Sequence[Row], dropped: Mapping[uuid.UUID, str], at: datetime
) -> list[HookEvent]:
    """``recipient.dropped`` for each recipient left out (its source id names the recipient
    and the attempt, so a rerun's event is the same webhook message)."""
    attempt = tag(job.line, job.attempt)
    return [
        HookEvent(
            "recipient.dropped",
            source_id=f"{job.batch_id}:{attempt}:suppressed:{r['log_id']}",
            occurred_at=at,
            batch_id=job.batch_id,
            log_id=r["log_id"],
            email=str(r["email"]),
            outcome="dropped",
            reason=dropped[r["log_id"]],
            attempt_id=attempt,
        )
        for r in rows
        if r["log_id"] in dropped
    ]


@dataclass(kw_only=True)
class Screen:
    """The check, over the dispatcher's stores."""

    suppressions: SuppressionChecks
    recipients: Recipients
    follow: FollowUps
    """Tells the users' webhooks of the dropped."""
    metrics: DispatchMetrics
    fault_points: FaultPoints
    now: Callable[[], datetime]

    async def __call__(
        self, job: protocol.Job, header: BatchHeader, rows: list[Row], message: Message
    ) -> tuple[list[Row], Message]:
        """The recipients to send and the message to send them, once those on the user's
        suppression list (or the named list's) are left out and the dropped recorded."""
        engagement = message.engagement
        listed = await self.suppressions.suppressed(
            header.user_id,
            addresses(rows, message),
            engagement.list if engagement is not None else None,
            per_query=SEND_LOOKUP,
        )
        await self.fault_points("screened", job)
        if not listed:
            return rows, message
        out = screen(rows, message, listed)
        if out.dropped:
            at = self.now()
            # The events first (as every follow-up tells them): a rerun after a crash finds
            # the same recipients still queued and tells the same events again.
            await self.follow.tell(job.batch_id, lambda: dropped_events(job, rows, out.dropped, at))
            await self.recipients.suppressed(
                job.batch_id, header.user_id, job.chunk, out.dropped, when=at
            )
            self.metrics.recipients_suppressed.inc(len(out.dropped))
            await self.fault_points("dropped", job)
        if out.copies:
            log.info(
                "%s/%s attempt %d: %d suppressed cc/bcc address(es) left out",
                job.batch_id,
                job.line,
                job.attempt,
                len(out.copies),
            )
        return out.send, out.message
