"""The recipient state machine: what one normalised provider event does (pure).

Outcome events settle the summary state (``delivered`` → success; bounce, recipient-side drop
→ failed). Engagement (``opened``, ``clicked``) and after-delivery events (``complained``,
``unsubscribed``) are recorded and counted but never change the outcome. Provider-side
failures (a drop that is the provider's fault, a deferral past the deadline) re-send the one
recipient through another provider; recipient-side ones are final and suppress the address.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from shared.models import State
from shared.webhook_events import KIND_RANK, ProviderEvent


@dataclass(frozen=True, slots=True)
class Effects:
    event: str | None
    """The value to write into the log row's ``event`` column (None: timeline only)."""
    state: State | None
    metrics: tuple[str, ...] = ()
    suppress: bool = False
    resend: bool = False
    attempt_accepted: bool = False
    """Evidence that the provider accepted the chunk (settles an ambiguous attempt)."""


def effects(
    ev: ProviderEvent, *, deferred_since: datetime | None = None, deadline: int = 4 * 3600
) -> Effects:
    kind = ev.kind
    if kind == "sent":
        return Effects("sent", None, attempt_accepted=True)
    if kind == "delivered":
        return Effects("delivered", "success", ("success",), attempt_accepted=True)
    if kind == "deferred":
        overdue = deferred_since is not None and ev.occurred_at - deferred_since > timedelta(
            seconds=deadline
        )
        return Effects("deferred", None, resend=overdue, attempt_accepted=True)
    if kind == "bounced":
        return Effects("bounced", "failed", ("failed", "bounced"), suppress=True)
    if kind == "dropped":
        if ev.provider_side:
            return Effects("dropped", None, resend=True)
        return Effects("dropped", "failed", ("failed",), suppress=ev.suppress)
    if kind == "complained":
        return Effects("complained", None, ("complained",), suppress=True)
    if kind == "unsubscribed":
        return Effects(None, None, suppress=True)
    if kind in ("opened", "clicked"):
        return Effects(None, None, (kind,))
    return Effects(None, None)


def write_timestamp(ev: ProviderEvent) -> int:
    """Microseconds for ``USING TIMESTAMP``: event time, ties broken by how final the kind is.

    Providers stamp events in whole seconds, so ``processed`` and ``delivered`` often share
    one; adding the kind's rank makes the later stage win the last-write-wins merge even
    when events arrive out of order. A provider-side failure ranks lowest: it starts a
    re-send through another provider, whose events of the same second must win.
    """
    rank = 0 if ev.provider_side else KIND_RANK[ev.kind]
    return int(ev.occurred_at.timestamp()) * 1_000_000 + rank


def stage_timestamp(ev: ProviderEvent) -> int:
    """Like :func:`write_timestamp` but always by stage: for the provider's own map entries."""
    return int(ev.occurred_at.timestamp()) * 1_000_000 + KIND_RANK[ev.kind]
