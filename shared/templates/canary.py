"""Canary rollout of a template version (pure): which recipients get the canary, and what
the comparison of the two versions decides.

A recipient is in the canary when a stable hash of (template, address) falls under the
canary's share: the same recipient gets the same version in every batch of the rollout, and
two templates' canaries pick independent recipients. After the window the two versions are
compared on the rates that harm a sender: failures on the provider's side, hard bounces and
complaints. The canary is rolled back when any of its rates is worse than the live
version's by more than that rate's margin (percentage points), and promoted otherwise. Each
side needs ``min_sent`` recipients, so that one bounce among a handful decides nothing: with
too few the window is extended until enough have gone out, or the rollout reaches its
deadline. There, a canary with enough recipients of its own is still compared with what the
live version has (a large share leaves the live side short, and a canary bouncing badly must
not be promoted for that); only a canary itself too small to judge is promoted (nothing says
it is worse).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Final, Literal

from shared.core.addresses import address_key
from shared.infra.config import ConsumerSettings

#: Buckets a share is counted in (a share of 0.01 % is one bucket).
BUCKETS: Final = 10_000


def in_canary(template_id: uuid.UUID, email: str, percent: float) -> bool:
    """Whether ``email`` gets the canary of ``template_id`` at ``percent`` (0-100)."""
    if percent <= 0:
        return False
    digest = hashlib.sha256(f"{template_id}:{address_key(email)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS < percent * BUCKETS / 100


@dataclass(frozen=True, slots=True)
class Counts:
    """What one version's recipients came to during the window."""

    sent: int = 0
    provider_failures: int = 0
    hard_bounces: int = 0
    complaints: int = 0

    def rate(self, metric: str) -> float:
        value: int = getattr(self, metric)
        return value / self.sent if self.sent else 0.0


@dataclass(frozen=True, slots=True)
class Margins:
    """How much worse than the live version the canary may be (fractions: 0.02 = 2 points)."""

    provider_failures: float = 0.05
    hard_bounces: float = 0.02
    complaints: float = 0.002
    min_sent: int = 100
    """Recipients each side needs before the rates say anything."""

    @classmethod
    def of(cls, settings: ConsumerSettings) -> Margins:
        """The margins the consumers' settings give."""
        return cls(
            provider_failures=settings.canary_margin_failures,
            hard_bounces=settings.canary_margin_bounces,
            complaints=settings.canary_margin_complaints,
            min_sent=settings.canary_min_sent,
        )


METRICS: Final = ("provider_failures", "hard_bounces", "complaints")

Decision = Literal["wait", "promote", "rollback"]


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    reason: str


def decide(canary: Counts, live: Counts, margins: Margins, *, deadline_passed: bool) -> Verdict:
    """What the comparison says once the window has passed (``deadline_passed``: the
    rollout may wait no longer for recipients)."""
    if min(canary.sent, live.sent) < margins.min_sent:
        if deadline_passed and canary.sent < margins.min_sent:
            return Verdict(
                "promote",
                f"too few recipients to compare ({canary.sent} canary, {live.sent} live) "
                "by the deadline: nothing says the canary is worse",
            )
        if not deadline_passed:
            return Verdict("wait", f"{canary.sent} canary and {live.sent} live recipients so far")
    for metric in METRICS:
        worse = canary.rate(metric) - live.rate(metric)
        allowed: float = getattr(margins, metric)
        if worse > allowed:
            name = metric.replace("_", " ")
            return Verdict(
                "rollback",
                f"{name}: {canary.rate(metric):.2%} of the canary's {canary.sent} against "
                f"{live.rate(metric):.2%} of the live version's {live.sent} "
                f"(more than {allowed:.2%} worse)",
            )
    return Verdict("promote", "no rate of the canary is worse than its margin")
