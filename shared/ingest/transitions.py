"""The recipient state machine: what one normalised provider event does (pure).

Outcome events settle the summary state (``delivered`` → success; bounce, recipient-side drop
→ failed). Engagement (``opened``, ``clicked``) and after-delivery events (``complained``,
``unsubscribed``) are recorded and counted but never change the outcome. Provider-side
failures (a drop that is the provider's fault; a deferral, once its deadline passes) hand the
one recipient over to another provider; recipient-side ones are final and suppress the
address. A failure reported on an attempt that was already handed over (superseded) is
recorded in the timeline only: the attempt that replaced it decides the recipient's fate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from shared.core.models import State
from shared.core.webhook_events import KIND_RANK, ProviderEvent
from shared.delivery.precedence import visible


@dataclass(frozen=True, slots=True)
class Effects:
    event: str | None
    """The value to write into the log row's ``event`` column (None: timeline only)."""
    state: State | None
    """The outcome it settles (mirrored by the stats' success/failed marks)."""
    metrics: tuple[str, ...] = ()
    """Other stats marks it earns: bounced, complained, opened, clicked."""
    suppress: bool = False
    hand_off: bool = False
    """A provider-side failure: hand the recipient over to another provider."""
    deadline: bool = False
    """A deferral: check again once the deferral deadline has passed."""
    finish_hand_off: bool = False
    """A provider-side failure of a recipient already final: hand nothing over, but if this
    failure was handed over before (its hand-off stopped before marking it), mark it now."""

    @property
    def counted(self) -> bool:
        """Whether the event counts at all (in state or stats)."""
        return self.state is not None or bool(self.metrics)

    @property
    def needs_row(self) -> bool:
        """Whether applying it depends on the recipient's row (was its attempt handed over?)."""
        return self.state == "failed" or self.hand_off or self.deadline


def effects(ev: ProviderEvent) -> Effects:
    kind = ev.kind
    if kind == "sent":
        return Effects("sent", None)
    if kind == "delivered":
        return Effects("delivered", "success")
    if kind == "deferred":
        return Effects("deferred", None, deadline=True)
    if kind == "bounced":
        return Effects("bounced", "failed", ("bounced",), suppress=True)
    if kind == "dropped":
        if ev.provider_side:
            return Effects("dropped", None, hand_off=True)
        return Effects("dropped", "failed", suppress=ev.suppress)
    if kind == "complained":
        return Effects("complained", None, ("complained",), suppress=True)
    if kind == "unsubscribed":
        return Effects(None, None, suppress=True)
    if kind in ("opened", "clicked"):
        return Effects(None, None, (kind,))
    return Effects(None, None)


def superseded(eff: Effects) -> Effects:
    """The effects of an event on an attempt that was handed over: a failure, a hand-off or a
    deferral of that attempt no longer concerns the recipient (a delivery, a complaint or an
    open still do: they happened)."""
    if eff.state == "failed":
        return Effects(None, None)
    if eff.hand_off or eff.deadline:
        return replace(eff, event=None, hand_off=False, deadline=False)
    return eff


def given_row(eff: Effects, ev: ProviderEvent, row: Mapping[str, Any] | None) -> Effects:
    """The effects of ``ev`` on the recipient as its row stands (``eff.needs_row``).

    A failure, hand-off or deferral of an attempt that was handed over decides nothing
    (``superseded``); one that arrives after the recipient is final (or for a row that does not
    exist) changes only the timeline, the provider's own entry and the stats it earns — and a
    provider-side failure then completes the marks of a hand-off it started earlier.
    """
    if ev.attempt is not None and row and ev.attempt in (row.get("superseded") or ()):
        return superseded(eff)
    if row is None:
        return Effects(eff.event, eff.state, eff.metrics, eff.suppress)
    if visible(row).state != "queued":
        return Effects(
            eff.event, eff.state, eff.metrics, eff.suppress, finish_hand_off=eff.hand_off
        )
    return eff


def domain_outcome(eff: Effects) -> str | None:
    """What an applied event counts for its sending domain's capacity: ``delivered``,
    ``bounced`` (hard), ``complained``, or nothing (a superseded failure counts nothing)."""
    if "complained" in eff.metrics:
        return "complained"
    if "bounced" in eff.metrics:
        return "bounced"
    if eff.state == "success":
        return "delivered"
    return None


def rank(ev: ProviderEvent) -> int:
    """The rank that orders the recipient-wide columns of events of the same second.

    Providers stamp events in whole seconds, so ``processed`` and ``delivered`` often share
    one; the kind's rank makes the later stage win the last-write-wins merge even when events
    arrive out of order. A provider-side failure ranks lowest: it hands the recipient over to
    another provider, whose events of the same second must win.
    """
    return 0 if ev.provider_side else KIND_RANK[ev.kind]


def stage_rank(ev: ProviderEvent) -> int:
    """Like :func:`rank` but always by stage: for the provider's own map entries."""
    return KIND_RANK[ev.kind]
