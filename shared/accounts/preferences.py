"""Each user's sending preferences: what their batches get when the request does not say
(open and click tracking, the one-click unsubscribe header) and their cooldown (the least
time between two mails to one address). The one writer of ``user_preferences``.

Tracking and unsubscribe are off by default: a password reset should not carry a pixel or an
unsubscribe link unless its sender asks. Cooldown is off (0) by default.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from shared.infra.db import Database

#: Longest cooldown a user may set (a week): rows of recent mail live this long at most.
MAX_COOLDOWN: Final = 7 * 86_400
#: Seconds a process keeps a user's preferences before reading them again.
CACHE_SECONDS: Final = 5.0
#: Users whose preferences a process keeps.
CACHE_SIZE: Final = 10_000


@dataclass(frozen=True, slots=True)
class Preferences:
    track_opens: bool = False
    track_clicks: bool = False
    unsubscribe: bool = False
    cooldown_seconds: int = 0
    cooldown_per_category: bool = False
    """Whether the cooldown applies per category (a receipt does not wait for a newsletter)."""

    def view(self) -> dict[str, Any]:
        return {
            "tracking": {"opens": self.track_opens, "clicks": self.track_clicks},
            "unsubscribe": self.unsubscribe,
            "cooldown": {
                "seconds": self.cooldown_seconds,
                "per_category": self.cooldown_per_category,
            },
        }


def patched(current: Preferences, patch: dict[str, Any]) -> Preferences:
    """``current`` with the fields of a validated ``PATCH /v1/preferences`` body (pure)."""
    changes: dict[str, Any] = {}
    tracking = patch.get("tracking") or {}
    if tracking.get("opens") is not None:
        changes["track_opens"] = tracking["opens"]
    if tracking.get("clicks") is not None:
        changes["track_clicks"] = tracking["clicks"]
    if patch.get("unsubscribe") is not None:
        changes["unsubscribe"] = patch["unsubscribe"]
    cooldown = patch.get("cooldown") or {}
    if cooldown.get("seconds") is not None:
        changes["cooldown_seconds"] = cooldown["seconds"]
    if cooldown.get("per_category") is not None:
        changes["cooldown_per_category"] = cooldown["per_category"]
    return replace(current, **changes)


class PreferenceRows(Protocol):
    """What callers use of :class:`PreferenceStore` (the store, or its in-memory twin)."""

    async def get(self, user_id: uuid.UUID, *, fresh: bool = False) -> Preferences: ...

    async def put(self, user_id: uuid.UUID, prefs: Preferences) -> None: ...


class PreferenceStore:
    """Read through a short per-process cache (a change applies within CACHE_SECONDS)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._cache: OrderedDict[uuid.UUID, tuple[float, Preferences]] = OrderedDict()

    async def get(self, user_id: uuid.UUID, *, fresh: bool = False) -> Preferences:
        now = time.monotonic()
        cached = self._cache.get(user_id)
        if cached is not None and not fresh and now - cached[0] < CACHE_SECONDS:
            return cached[1]
        row = await self.db.one(
            "SELECT track_opens, track_clicks, unsubscribe, cooldown_seconds, "
            "cooldown_per_category FROM user_preferences WHERE user_id = ?",
            (user_id,),
        )
        prefs = Preferences() if row is None else _from_row(row)
        self._remember(user_id, now, prefs)
        return prefs

    async def put(self, user_id: uuid.UUID, prefs: Preferences) -> None:
        await self.db.execute(
            "INSERT INTO user_preferences (user_id, track_opens, track_clicks, unsubscribe, "
            "cooldown_seconds, cooldown_per_category, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                user_id,
                prefs.track_opens,
                prefs.track_clicks,
                prefs.unsubscribe,
                prefs.cooldown_seconds,
                prefs.cooldown_per_category,
                datetime.now(UTC),
            ),
            idempotent=True,
        )
        self._remember(user_id, time.monotonic(), prefs)

    def _remember(self, user_id: uuid.UUID, at: float, prefs: Preferences) -> None:
        self._cache[user_id] = (at, prefs)
        self._cache.move_to_end(user_id)
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)


def _from_row(row: Any) -> Preferences:
    return Preferences(
        track_opens=bool(row["track_opens"]),
        track_clicks=bool(row["track_clicks"]),
        unsubscribe=bool(row["unsubscribe"]),
        cooldown_seconds=int(row["cooldown_seconds"] or 0),
        cooldown_per_category=bool(row["cooldown_per_category"]),
    )
