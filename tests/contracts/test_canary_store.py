"""The canary store's contract, asserted identically of the in-memory twin
(``tests/fakes/templates.py``) and of the real store on Cassandra: a rollout recorded with
its batches is on the judge's list until it is judged or forgotten, its batches are the ones
recorded with it, and a template's verdicts read back newest rollout first."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.infra.db import Database
from shared.templates.canary import Counts
from shared.templates.canary_store import CanaryStore, Outcome, Rollout
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.cassandra import ms
from tests.fakes.templates import FakeCanary


@dataclass
class Side:
    """The store under contract (its own namespace)."""

    store: Any
    db: Database | None

    async def carried(self, rollout: Rollout, *batches: uuid.UUID) -> None:
        """Record batches as carrying ``rollout``, each with its own write."""
        for batch in batches:
            writes = await self.store.statements(rollout, batch)
            if self.db is None:
                for write in writes:
                    write()
            else:
                await self.db.batch(writes)


@pytest.fixture(params=IMPLEMENTATIONS)
def side(request: pytest.FixtureRequest) -> Side:
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    if request.param == "fake":
        return Side(FakeCanary(namespace), None)
    db: Database = request.getfixturevalue("db")
    return Side(CanaryStore(db, namespace), db)


def rollout(template_id: uuid.UUID | None = None, *, ago: float = 0) -> Rollout:
    since = ms(datetime.now(UTC) - timedelta(seconds=ago))
    return Rollout(template_id or uuid.uuid1(), since, uuid.uuid4(), 2, 1)


def outcome(decision: str, sent: int) -> Outcome:
    return Outcome(
        datetime.now(UTC),
        2,
        1,
        decision,
        f"{decision} after {sent}",
        Counts(sent, 1, 2, 3),
        Counts(sent * 9, 0, 1, 0),
    )


async def test_a_rollout_is_listed_with_the_batches_that_carried_it(side: Side) -> None:
    first, second = rollout(), rollout()
    batches = [uuid.uuid1() for _ in range(3)]

    await side.carried(first, batches[0], batches[1])
    await side.carried(second, batches[2])

    assert sorted(await side.store.rollouts(), key=lambda r: r.template_id.time) == [
        first,
        second,
    ]
    assert await side.store.batches(first) == batches[:2]
    assert await side.store.batches(second) == [batches[2]]


async def test_a_rollout_is_listed_at_millisecond_precision(side: Side) -> None:
    """Its start reads back as Cassandra keeps it, and finds the rollout's batches."""
    exact = Rollout(uuid.uuid1(), datetime.now(UTC).replace(microsecond=123456), uuid.uuid4(), 2, 1)
    batch = uuid.uuid1()

    await side.carried(exact, batch)
    [listed] = await side.store.rollouts()

    assert listed.since == exact.since.replace(microsecond=123000)
    assert await side.store.batches(listed) == [batch]


async def test_a_judged_rollout_leaves_the_list_and_its_verdict_is_kept(side: Side) -> None:
    judged, waiting = rollout(), rollout()
    await side.carried(judged, uuid.uuid1())
    await side.carried(waiting, uuid.uuid1())
    verdict = outcome("rollback", 200)

    await side.store.judged(judged, verdict)

    assert await side.store.rollouts() == [waiting]
    [kept] = await side.store.history(judged.template_id)
    assert kept == Outcome(
        ms(verdict.at), 2, 1, "rollback", "rollback after 200", verdict.canary, verdict.live
    )
    assert await side.store.history(waiting.template_id) == []


async def test_a_templates_verdicts_come_newest_rollout_first(side: Side) -> None:
    template = uuid.uuid1()
    older, newer = rollout(template, ago=60), rollout(template)
    await side.carried(older, uuid.uuid1())
    await side.carried(newer, uuid.uuid1())

    await side.store.judged(newer, outcome("promote", 300))
    await side.store.judged(older, outcome("rollback", 100))

    assert [o.decision for o in await side.store.history(template)] == ["promote", "rollback"]
    assert await side.store.rollouts() == []


async def test_judging_a_rollout_again_keeps_one_verdict(side: Side) -> None:
    """A judge that died after the audit judges again: the row is the same one."""
    again = rollout()
    await side.carried(again, uuid.uuid1())

    await side.store.judged(again, outcome("promote", 100))
    await side.store.judged(again, outcome("promote", 120))

    assert [o.reason for o in await side.store.history(again.template_id)] == ["promote after 120"]


async def test_a_forgotten_rollout_leaves_the_list_without_a_verdict(side: Side) -> None:
    replaced = rollout()
    batch = uuid.uuid1()
    await side.carried(replaced, batch)

    await side.store.forget(replaced)

    assert await side.store.rollouts() == []
    assert await side.store.history(replaced.template_id) == []
    assert await side.store.batches(replaced) == [batch]
