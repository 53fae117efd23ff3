"""Handing one recipient over to another provider after a provider-side failure.

A webhook reports that a provider dropped a recipient for reasons of its own, or a deferral
outlived its deadline: the attempt that provider accepted (its *cause* tag, ``c.<n>`` or
``r.<n>``) is superseded by a new attempt of the recipient's own re-send line, planned with a
lightweight transaction that records the cause. Replays of the same report find the planned
attempt by its cause and only repeat the idempotent rest (marking the cause superseded,
publishing the job), so a recipient is handed over once per failure however often the
provider repeats itself. When no provider is left, the recipient ends ``failed`` instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from shared.core.catalog import name_of
from shared.core.models import LogJob
from shared.delivery.attempts import Attempt, Attempts, recipient_line
from shared.delivery.precedence import visible
from shared.delivery.recipients import Recipients, Selection
from shared.infra.broker import Broker
from shared.infra.config import ProviderSettings
from shared.infra.db import Row
from shared.infra.topology import log_key

#: Providers-map values that mean "this provider failed this recipient on its side".
PROVIDER_SIDE = ("dropped", "deferred too long")
#: Tries at planning the next attempt when concurrent hand-offs race for the same number.
_PLAN_TRIES = 3


def excluded_providers(row: Row) -> frozenset[str]:
    """Providers that already failed this recipient on their side (never handed it back)."""
    providers = row.get("providers") or {}
    return frozenset(p for p, v in providers.items() if str(v).startswith(PROVIDER_SIDE))


def next_provider(chain: Sequence[str], excluded: frozenset[str], failed: str) -> str | None:
    """The first provider of the chain after ``failed`` that is not excluded."""
    start = chain.index(failed) + 1 if failed in chain else 0
    for code in (*chain[start:], *chain[:start]):
        if code != failed and code not in excluded:
            return code
    return None


class Route(Protocol):
    """What a hand-off needs of the settings in force: where to go next, and how far."""

    @property
    def chain(self) -> tuple[str, ...]: ...

    @property
    def max_attempts(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Routing:
    """A :class:`Route` of its own (the webhooks process's: the running chain, the live
    settings' max attempts)."""

    chain: tuple[str, ...]
    max_attempts: int

    @classmethod
    def start(cls, settings: ProviderSettings) -> Routing:
        """The env's chain and max attempts, in force until live settings are loaded."""
        return cls(settings.chain_codes, settings.max_attempts)


@dataclass
class HandOff:
    attempts: Attempts
    recipients: Recipients
    broker: Broker
    route: Callable[[], Route]
    """The chain and max attempts in force, read once per planning try (live settings
    replace them whole: ``shared.infra.current``)."""
    backoff: Sequence[int] = ()
    """Seconds before a provider is asked again for a recipient it refused for now, by the
    re-send's attempt number (the env's backoff tiers; empty: never the same provider)."""

    async def __call__(
        self,
        *,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chunk: int,
        log_id: uuid.UUID,
        cause: str,
        failed: str,
        why: str,
        pinned: str | None = None,
        later: bool = False,
    ) -> None:
        """Hand the recipient over (idempotent: at most one new attempt per ``cause``); with no
        other provider to hand over to (a batch that ``pinned`` one, a chain with no other
        left) it is given up, unless the provider said to try ``later`` (it refused the
        recipient for now: an SMTP 4xx, a throttled call), when it is asked again after a
        backoff, as a whole call's transient error would be."""
        line_key = recipient_line(log_id)
        serial = False
        for _ in range(_PLAN_TRIES):
            line = await self.attempts.line(batch_id, line_key, serial=serial)
            planned = next((a for a in line if a.cause == cause), None)
            if planned is not None:
                await self._complete(batch_id, chunk, log_id, planned, failed=failed, why=why)
                return
            row = await self.recipients.one(batch_id, chunk, log_id)
            if row is None or visible(row).state != "queued":
                return  # final meanwhile: nothing to hand over
            if cause in (row.get("superseded") or ()):
                return  # handed over already, to nobody: it was given up
            number = 1 + max((a.attempt for a in line), default=-1)
            route = self.route()
            excluded = excluded_providers(row)
            chain = (pinned,) if pinned else route.chain
            target = next_provider(chain, excluded | {failed}, failed)
            if target is None and later and self.backoff and failed not in excluded:
                # Refused for now, and no other provider may take it (the batch pins this one,
                # or the chain has no other left): the same provider again, after a backoff.
                target = failed
            if target is None or number >= route.max_attempts:
                left = (
                    f"the batch pins {name_of(pinned)}: no other provider may try"
                    if pinned
                    else "no other provider is left to try"
                )
                await self._give_up(batch_id, user_id, chunk, log_id, cause, failed, why, left)
                return
            await self.attempts.create(
                batch_id,
                line_key,
                number,
                chunk=chunk,
                provider=target,
                state="planned",
                cause=cause,
                reason=why[:500],
            )
            serial = True  # read back what is there now: ours, or a racer's
        # Lost every race: the winners publish their own attempts.

    async def finish(
        self,
        *,
        batch_id: uuid.UUID,
        chunk: int,
        log_id: uuid.UUID,
        cause: str,
        failed: str,
        why: str,
    ) -> None:
        """Complete a hand-off of ``cause`` that stopped before marking the cause handed over
        (its publish failed, or its confirm was lost after the broker took the job), now that
        the failure's event or deadline check came back and found the recipient moved on.
        Does nothing when ``cause`` was never handed over: the recipient's own fate decides.
        """
        line = await self.attempts.line(batch_id, recipient_line(log_id))
        planned = next((a for a in line if a.cause == cause), None)
        if planned is not None:
            await self._complete(batch_id, chunk, log_id, planned, failed=failed, why=why)

    async def _complete(
        self,
        batch_id: uuid.UUID,
        chunk: int,
        log_id: uuid.UUID,
        planned: Attempt,
        *,
        failed: str,
        why: str,
    ) -> None:
        """Send the planned attempt's job while the recipient is still queued, then mark its
        cause handed over. Publish before marking: a replay of the report skips superseded
        causes, so the mark must mean "the job is out" (a crash in between only publishes the
        job again, which its consumers tell apart). A recipient final meanwhile needs no job,
        only the mark."""
        assert planned.cause is not None  # noqa: S101 - planned attempts name their cause
        row = await self.recipients.one(batch_id, chunk, log_id)
        if row is not None and visible(row).state == "queued":
            await self._publish(batch_id, chunk, log_id, planned, failed)
        await self.recipients.supersede(
            batch_id,
            chunk,
            log_id,
            tag=planned.cause,
            provider=failed,
            result=why,
            when=planned.created_at,
        )

    async def _publish(
        self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID, planned: Attempt, failed: str
    ) -> None:
        await self.broker.publish(
            log_key(planned.provider, log_id, planned.attempt),
            LogJob(batch_id=batch_id, chunk=chunk, log_id=log_id, attempt=planned.attempt).encode(),
            delay=self._wait(planned, failed),
            message_id=f"{log_id}:{planned.attempt}",
        )

    def _wait(self, planned: Attempt, failed: str) -> int | None:
        """The delay tier of a re-send that asks the provider that refused it for now again
        (None: another provider, at once)."""
        if not self.backoff or planned.provider != failed:
            return None
        seconds = self.backoff[min(planned.attempt, len(self.backoff) - 1)]
        return self.broker.topology.delay_tier_for(seconds)

    async def _give_up(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        chunk: int,
        log_id: uuid.UUID,
        cause: str,
        failed: str,
        why: str,
        left: str = "no other provider is left to try",
    ) -> None:
        now = datetime.now(UTC)
        # Give up first, for the same reason as above: "superseded" must mean "done".
        await self.recipients.give_up(
            batch_id,
            user_id,
            Selection.one(chunk, log_id),
            reason=f"{why}; {left}",
            when=now,
        )
        await self.recipients.supersede(
            batch_id, chunk, log_id, tag=cause, provider=failed, result=why, when=now
        )
