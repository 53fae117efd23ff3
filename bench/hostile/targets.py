"""What ``make hostile`` judges its figures by, in one place (pure).

* A parser's time may grow at most :data:`RATIO_TARGET` times for ten times the input
  (issue 33: linear time, "a figure with its ratio, not a timed test"). A parse that takes
  under :data:`NOISE_FLOOR` seconds at 10x passes whatever its ratio (a refusal in
  microseconds has no meaningful ratio, and cannot stall anything); one that outlives its
  timeout fails with a ratio of at least timeout / its 1x time.
* No service's event loop may stall longer than :data:`STALL_TARGET` seconds.
* No service's peak RSS may pass its memory limit: the one its settings give it
  (``SAFEDELIVR_<SERVICE>_MEMORY_MAX_MB``, which the process enforces:
  ``shared.infra.memory_guard``), read by :func:`rss_limits` from the settings the stack runs with.
  ``make bench``'s 100 MB is the steady-state goal of a process at ordinary load, not this.

Every verdict is ``{"value", "target", "pass"}``; ``pass`` is None when there is no figure
to judge (the harness failed), never a pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from shared.infra.config import Settings

#: 10x the input may take at most this many times as long (issue 33, "Deliver" 1).
RATIO_TARGET: Final = 15.0
#: CPU seconds at 10x under which a parser passes whatever its ratio.
NOISE_FLOOR: Final = 0.05
#: The longest event-loop stall allowed (issue 33, "Deliver" 3).
STALL_TARGET: Final = 0.1
#: The service processes measured against a running stack (the sandbox is a test double).
SERVICES: Final = ("api", "consumers", "webhooks", "tracking", "hooks")


def rss_limits(settings: Settings) -> dict[str, float]:
    """Each service's memory limit in MB, as its settings configure it."""
    return {
        "api": settings.api.memory_max_mb,
        "consumers": settings.consumers.memory_max_mb,
        "webhooks": settings.webhooks.memory_max_mb,
        "tracking": settings.tracking.memory_max_mb,
        "hooks": settings.hooks.memory_max_mb,
    }


@dataclass(frozen=True, slots=True)
class Timing:
    """One parse as the child reported it, or why there is no figure."""

    seconds: float | None
    outcome: str
    """``ok``, ``refused (...)``, ``timeout``, ``not run`` or ``error: ...``."""

    @classmethod
    def of(cls, message: Mapping[str, Any] | None, fallback: str) -> Timing:
        if message is None:
            return cls(None, fallback)
        return cls(float(message["seconds"]), str(message["outcome"]))


def judge_parser(one: Timing, ten: Timing, timeout: float) -> dict[str, Any]:
    """The ratio of ten to one and whether it passes (see the module docstring)."""
    if one.seconds is None:
        return {
            "ratio": None,
            "ratio_at_least": False,
            "target": RATIO_TARGET,
            "pass": _failed(one),
        }
    if ten.seconds is None:
        if ten.outcome != "timeout":
            return {"ratio": None, "ratio_at_least": False, "target": RATIO_TARGET, "pass": None}
        bound = timeout / max(one.seconds, 1e-6)
        return {"ratio": bound, "ratio_at_least": True, "target": RATIO_TARGET, "pass": False}
    ratio = ten.seconds / max(one.seconds, 1e-6)
    passed = ten.seconds <= NOISE_FLOOR or ratio <= RATIO_TARGET
    return {"ratio": ratio, "ratio_at_least": False, "target": RATIO_TARGET, "pass": passed}


def _failed(timing: Timing) -> bool | None:
    """A 1x that timed out failed; one that has no figure for another reason is not judged."""
    return False if timing.outcome == "timeout" else None


def judge_service(
    stall: float | None, rss_mb: float | None, *, answered: bool, limit: float | None
) -> dict[str, dict[str, Any]]:
    """The stall and memory verdicts of one service (``limit``: its memory limit in MB). A
    service that did not answer its metrics within the scrape's timeout was stalled (or
    gone) at least that long: a failed stall, with no figure."""
    stalled: bool | None
    if not answered:
        stalled = False
    elif stall is None:
        stalled = None
    else:
        stalled = stall <= STALL_TARGET
    return {
        "stall_s": {"value": stall, "target": STALL_TARGET, "pass": stalled},
        "rss_mb": {
            "value": rss_mb,
            "target": limit,
            "pass": None if rss_mb is None or limit is None else rss_mb <= limit,
        },
    }


def violations(verdicts: Iterable[Mapping[str, Any]]) -> int:
    """How many verdicts failed (those without a figure are not counted either way)."""
    return sum(1 for v in verdicts if v.get("pass") is False)
