"""Per-user caps on what a user may create or run at once, decided (pure): contact lists,
templates, each template's versions, campaigns and CSV imports in progress.

A cap is counted in a *ledger*, one row per user and cap (``services.api.cap_store``): the
*holders*, one per thing counted (a list's id, a version's number, an import's list and id)
with when its place was claimed, and a version number. Every change of a ledger is written
whole by a lightweight transaction on the version it was decided from, so two changes never
both apply from one reading: of two creations at the cap's edge one claims the last place
and the other reads the ledger again and is refused.

Creating claims a place first and writes the thing second; deleting deletes the thing first
and gives its place back second. A process that dies between the two steps leaves a holder
without its thing. The ledger is therefore held to the things themselves (their *census*)
whenever it matters, that is when it was never written (the first claim counts what the user
already has) and when it is full: a holder whose thing is missing and whose place was taken
longer than a grace ago is released (younger ones may be creations still under way), and a
thing without a holder is adopted. So a leaked place costs at most the grace, never a user's
capacity for good, and a thing created before caps existed still counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

Cap = Literal["lists", "templates", "versions", "campaigns", "imports"]

#: What each cap counts, as a refusal names it.
COUNTED: Final[Mapping[Cap, str]] = {
    "lists": "contact lists",
    "templates": "templates",
    "versions": "versions of this template",
    "campaigns": "campaigns",
    "imports": "imports in progress",
}


@dataclass(frozen=True, slots=True)
class Holds:
    """A ledger as read."""

    version: int | None
    """Moved by every change; None while the ledger was never written."""
    holders: Mapping[str, datetime]
    """Each holder with when its place was claimed."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do about one claim (or one check for room)."""

    write: Mapping[str, datetime] | None
    """The ledger's holders to write (conditionally on the version read); None: nothing."""
    granted: bool
    """Whether the holder holds a place once ``write`` landed (a check: whether there is
    room for one more)."""
    held: int
    """How many places are held after ``write`` (what a refusal tells)."""


def needs_census(holds: Holds, limit: int) -> bool:
    """Whether the things themselves must be counted before deciding: the ledger was never
    written, or it is full (and may hold places of things that are gone)."""
    return holds.version is None or len(holds.holders) >= limit


def reconciled(
    holders: Mapping[str, datetime],
    present: Set[str],
    *,
    now: datetime,
    grace: timedelta,
) -> dict[str, datetime]:
    """``holders`` held to the things ``present``: a holder whose thing is missing is
    released once its place is older than ``grace``, and a thing without a holder is
    adopted (claimed ``now``)."""
    kept = {h: at for h, at in holders.items() if h in present or now - at < grace}
    kept.update({h: now for h in present if h not in holders})
    return kept


def plan_claim(
    holds: Holds,
    holder: str | None,
    *,
    limit: int,
    now: datetime,
    grace: timedelta,
    present: Set[str] | None,
) -> Plan:
    """Claim a place for ``holder`` (None: only check that there is room for one more),
    with ``present`` the census when :func:`needs_census` asked for one (else None)."""
    if holder is not None and holder in holds.holders:
        return Plan(None, True, len(holds.holders))  # a repeated claim: it holds one
    current = dict(holds.holders)
    if present is not None:
        current = reconciled(current, present, now=now, grace=grace)
    changed = current != holds.holders
    if len(current) >= limit:
        return Plan(current if changed else None, False, len(current))
    if holder is None:
        return Plan(current if changed else None, True, len(current))
    current[holder] = now
    return Plan(current, True, len(current))


def plan_release(holds: Holds, holders: Set[str]) -> Mapping[str, datetime] | None:
    """The ledger without ``holders``; None when it holds none of them (a repeated
    release)."""
    if not holders & holds.holders.keys():
        return None
    return {h: at for h, at in holds.holders.items() if h not in holders}
