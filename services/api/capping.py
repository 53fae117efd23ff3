"""Holding the API's creations to the per-user caps: a place claimed before a thing is
created and given back once it is deleted, over the ledgers of ``services.api.cap_store`` with the
decisions of ``services.api.caps``; a refusal is a 409 naming the cap and its limit.

Each step reads the ledger, decides, and writes it back conditionally on the version read; a
write that lost to another change (a concurrent creation, a deletion) is decided again from
a new reading. When the ledger must be held to the things themselves (never written, or
full), the caller's *census* says which of them exist: for a list, a template, a version or
a campaign every one the user (or the template) has; for an import, which of the holders'
imports are still running.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from services.api.cap_store import ledger_name
from services.api.caps import COUNTED, Cap, Holds, needs_census, plan_claim, plan_release
from shared.core.errors import DependencyUnavailable
from shared.infra.config import CapSettings
from shared.infra.http import ApiError

log = logging.getLogger(__name__)

#: Decisions of one step before it gives up on a ledger that keeps changing (503).
TRIES = 20

#: Which of the holders asked about (and of the things not held) exist.
Census = Callable[[Collection[str]], Awaitable[Set[str]]]


class CapLedger(Protocol):
    """:class:`services.api.cap_store.CapStore`, or its twin."""

    def read(self, user_id: uuid.UUID, ledger: str) -> Awaitable[Holds]: ...

    def write(
        self,
        user_id: uuid.UUID,
        ledger: str,
        expected: int | None,
        holders: Mapping[str, datetime],
    ) -> Awaitable[bool]: ...

    def drop(self, user_id: uuid.UUID, ledger: str, expected: int | None) -> Awaitable[bool]: ...


def limit_reached(cap: Cap, limit: int, held: int) -> ApiError:
    """The 409 of a creation past ``cap``: its name and limit, in the message and in
    ``error.limit``."""
    then = "wait for one to end" if cap == "imports" else "delete one first"
    return ApiError(
        409,
        f"too_many_{cap}",
        f"the limit of {limit:,} {COUNTED[cap]} is reached ({held:,} held): {then}",
        limit=(cap, limit),
    )


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Caps:
    store: CapLedger
    settings: CapSettings
    clock: Callable[[], datetime] = field(default=_now)

    def limit(self, cap: Cap) -> int:
        found: int = getattr(self.settings, cap)
        return found

    async def claim(
        self,
        user_id: uuid.UUID,
        cap: Cap,
        holder: str,
        census: Census,
        *,
        scope: uuid.UUID | None = None,
        extra_grace: float = 0.0,
    ) -> None:
        """Take a place for ``holder``, or raise :func:`limit_reached`. ``extra_grace``:
        seconds its place is kept beyond the grace while its thing is not found yet (an
        import's upload)."""
        await self._decide(user_id, cap, holder, census, scope, extra_grace)

    async def check(
        self, user_id: uuid.UUID, cap: Cap, census: Census, *, scope: uuid.UUID | None = None
    ) -> None:
        """Raise :func:`limit_reached` unless there is room for one more (nothing is claimed:
        a version's number is taken before its place, and none is wasted at the cap)."""
        await self._decide(user_id, cap, None, census, scope, 0.0)

    async def release(
        self, user_id: uuid.UUID, cap: Cap, holder: str, *, scope: uuid.UUID | None = None
    ) -> None:
        """Give ``holder``'s place back (again: nothing happens)."""
        ledger = ledger_name(cap, scope)
        for attempt in range(TRIES):
            holds = await self.store.read(user_id, ledger)
            kept = plan_release(holds, {holder})
            if kept is None or await self.store.write(user_id, ledger, holds.version, kept):
                return
            await _pause(attempt)
        raise _busy()

    async def forget(self, user_id: uuid.UUID, cap: Cap, scope: uuid.UUID) -> None:
        """Drop ``scope``'s ledger of ``cap`` (its template is deleted)."""
        ledger = ledger_name(cap, scope)
        for attempt in range(TRIES):
            holds = await self.store.read(user_id, ledger)
            if await self.store.drop(user_id, ledger, holds.version):
                return
            await _pause(attempt)
        raise _busy()

    async def release_quietly(
        self, user_id: uuid.UUID, cap: Cap, holder: str, *, scope: uuid.UUID | None = None
    ) -> None:
        """:meth:`release`, an outage logged instead of raised: the thing is gone already,
        and a place not given back is healed at the cap once its grace has passed."""
        try:
            await self.release(user_id, cap, holder, scope=scope)
        except (DependencyUnavailable, ApiError) as exc:
            log.warning("%s place %s of user %s not given back: %s", cap, holder, user_id, exc)

    async def _decide(
        self,
        user_id: uuid.UUID,
        cap: Cap,
        holder: str | None,
        census: Census,
        scope: uuid.UUID | None,
        extra_grace: float,
    ) -> None:
        ledger, limit = ledger_name(cap, scope), self.limit(cap)
        grace = timedelta(seconds=self.settings.claim_grace + extra_grace)
        for attempt in range(TRIES):
            holds = await self.store.read(user_id, ledger)
            present = await census(holds.holders.keys()) if needs_census(holds, limit) else None
            plan = plan_claim(
                holds, holder, limit=limit, now=self.clock(), grace=grace, present=present
            )
            if plan.write is not None and not await self.store.write(
                user_id, ledger, holds.version, plan.write
            ):
                await _pause(attempt)
                continue  # another change landed first: decide again from it
            if not plan.granted:
                raise limit_reached(cap, limit, plan.held)
            return
        raise _busy()


async def _pause(attempt: int) -> None:
    """A short random wait before deciding again, longer each time: concurrent steps on one
    ledger spread out instead of colliding again."""
    await asyncio.sleep(random.uniform(0, 0.005 * (attempt + 1)))


def _busy() -> ApiError:
    return ApiError(
        503,
        "busy",
        "too many changes at once to your account's counts; retry shortly",
        headers={"Retry-After": "1"},
    )
