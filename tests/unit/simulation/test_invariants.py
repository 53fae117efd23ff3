"""The invariants catch what they are for: each check fails a run built to break it."""

from __future__ import annotations

import pytest

from simulation.clients import Request, send
from simulation.config import Config
from simulation.faults import Schedule
from simulation.scenarios import SCENARIOS, Scenario, body, user
from simulation.search import run
from simulation.world import World


def _with(monkeypatch: pytest.MonkeyPatch, scenario: Scenario) -> None:
    monkeypatch.setitem(SCENARIOS, scenario.name, scenario)


async def _sent_twice(world: World) -> list[Request]:
    """One request, sent under two keys: the providers accept each recipient twice."""
    first = Request("order", user(), body("ann@example.org"), key="k-1")
    again = Request("order", user(), body("ann@example.org"), key="k-2")
    return [await send(world, first), await send(world, again)]


async def _deferred_for_ever(world: World) -> list[Request]:
    """Every provider defers her and says nothing more; the deadline is a year away."""
    return [await send(world, Request("order", user(), body("defer.ann@example.org"), "k"))]


def test_a_recipient_accepted_twice_for_one_request_is_a_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _with(monkeypatch, Scenario("sent_twice", "", _sent_twice))

    outcome = run(Schedule("sent_twice"))

    assert any(
        v.startswith("once: order: ann@example.org accepted 2") for v in outcome.verdict.violations
    )


def test_a_recipient_never_final_is_a_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    _with(monkeypatch, Scenario("stuck", "", _deferred_for_ever, Config(deferred_deadline=10**8)))

    outcome = run(Schedule("stuck"))

    assert any(
        v.startswith("final:") and "defer.ann@example.org" in v for v in outcome.verdict.violations
    )


def test_every_scenario_runs_clean_without_faults() -> None:
    """The baseline the single-fault pass varies: nothing is violated with no fault."""
    for name in SCENARIOS:
        outcome = run(Schedule(name), record=True)
        assert outcome.ok, (name, outcome.verdict.violations)
        assert outcome.count == len(outcome.steps) > 0
