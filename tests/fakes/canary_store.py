"""In-memory twin of :class:`shared.templates.canary_store.CanaryStore`: the batches that carried
each rollout's canary, the namespace's rollouts waiting for a verdict, and each template's
verdicts.

It keeps what the judge and the API depend on: every round trip yields to the event loop;
a rollout is listed from the write of its first batch until it is judged or forgotten; a
verdict is keyed by its rollout's start (judging again overwrites it) and verdicts read back
newest rollout first; rows read back in Cassandra's order (``timeuuid`` order, then time) with
timestamps at Cassandra's precision (UTC, milliseconds) and counts as their JSON round-trips
them. ``tests/contracts/test_canary_store.py`` runs one suite over this twin and the real
store.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime

from shared.delivery.recipients import timeuuid_order
from shared.templates.canary import Counts
from shared.templates.canary_store import Canaries, Outcome, Rollout
from tests.fakes.schedule_store import ms
from tests.fakes.stores import Write
from tests.fakes.wire import LOOPBACK, Wire, round_trip

#: A rollout's key in ``canary_batches`` and ``canary_rollouts``: (template, since).
_Key = tuple[uuid.UUID, datetime]


@dataclass
class CanaryTables:
    """``canary_batches``, ``canary_rollouts`` and ``template_rollouts``, shared by the twins
    of one keyspace."""

    batches: dict[_Key, set[uuid.UUID]] = field(default_factory=dict)
    rollouts: dict[str, dict[_Key, Rollout]] = field(default_factory=dict)
    verdicts: dict[uuid.UUID, dict[datetime, Outcome]] = field(default_factory=dict)
    """template -> the rollout's start (exact: the row's key is a time UUID made of it)."""
    wire: Wire = LOOPBACK
    """How each round trip travels (``tests.fakes.wire``)."""


class FakeCanary(Canaries):
    """Twin of :class:`shared.templates.canary_store.CanaryStore` (every operation; ``statements``
    gives :data:`tests.fakes.stores.Write` s to apply with the batch's own write)."""

    def __init__(self, namespace: str, tables: CanaryTables | None = None) -> None:
        self.namespace = namespace
        self.tables = tables or CanaryTables()

    @property
    def wire(self) -> Wire:
        return self.tables.wire

    async def statements(self, rollout: Rollout, batch_id: uuid.UUID) -> list[Write]:
        key = (rollout.template_id, ms(rollout.since))

        def carried() -> None:
            self.tables.batches.setdefault(key, set()).add(batch_id)

        def listed() -> None:
            waiting = self.tables.rollouts.setdefault(self.namespace, {})
            waiting[key] = replace(rollout, since=key[1])

        return [carried, listed]

    @round_trip("canary.rollouts", "read")
    async def rollouts(self) -> list[Rollout]:
        waiting = self.tables.rollouts.get(self.namespace, {})
        return [waiting[k] for k in sorted(waiting, key=lambda k: (timeuuid_order(k[0]), k[1]))]

    @round_trip("canary.batches", "read")
    async def batches(self, rollout: Rollout) -> list[uuid.UUID]:
        found = self.tables.batches.get((rollout.template_id, ms(rollout.since)), set())
        return sorted(found, key=timeuuid_order)

    async def judged(self, rollout: Rollout, outcome: Outcome) -> None:
        trip = await self.wire.trip("canary.judged", "write")
        kept = replace(
            outcome,
            at=ms(outcome.at),
            canary=Counts(**_counts(outcome.canary)),
            live=Counts(**_counts(outcome.live)),
        )
        self.tables.verdicts.setdefault(rollout.template_id, {})[rollout.since] = kept
        trip.landed()
        await self.forget(rollout)

    @round_trip("canary.forget", "write")
    async def forget(self, rollout: Rollout) -> None:
        waiting = self.tables.rollouts.get(self.namespace, {})
        waiting.pop((rollout.template_id, ms(rollout.since)), None)

    @round_trip("canary.history", "read")
    async def history(self, template_id: uuid.UUID) -> list[Outcome]:
        verdicts = self.tables.verdicts.get(template_id, {})
        return [verdicts[s] for s in sorted(verdicts, reverse=True)]


def _counts(counts: Counts) -> dict[str, int]:
    """The counts as the audit row's JSON keeps them."""
    return {
        "sent": counts.sent,
        "provider_failures": counts.provider_failures,
        "hard_bounces": counts.hard_bounces,
        "complaints": counts.complaints,
    }
