"""A simulated run is a function of its schedule: not of the process's earlier runs, nor of
how long the machine really takes to run it (a loaded CI box, a garbage collection)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from jinja2.environment import Template

from simulation.faults import decode
from simulation.search import Outcome, run
from tests.fakes.audience import FakeCampaigns

# Two of the three swarm runs of 100,000 that violated in a worker and passed replayed alone.
CANARY = "canary@24289~:92=*59,96=*38,98=*0"
CAMPAIGN = "campaign@33442~:197=*53,198=*1,199=*54"

#: A real pause longer than a render's limit and than a campaign state's freshness (0.5 s).
PAUSE = 0.6


def _seen(outcome: Outcome) -> tuple[Any, ...]:
    return (outcome.ok, outcome.count, outcome.steps, outcome.verdict.violations)


def _paused_once(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` whose first call stalls the process for ``PAUSE`` real seconds."""
    calls = [0]

    def paused(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            time.sleep(PAUSE)
        return func(*args, **kwargs)

    return paused


def test_a_run_after_other_runs_in_the_process_meets_the_verdict_it_meets_alone() -> None:
    """A schedule run after another in one process takes the steps it takes alone."""
    alone = _seen(run(decode(CANARY)))

    run(decode(CAMPAIGN))
    again = _seen(run(decode(CANARY)))

    assert again == alone


def test_a_pause_mid_render_does_not_change_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A render stalled for real (not in virtual time) renders as it does unstalled."""
    alone = _seen(run(decode(CANARY)))

    # A render's output is generated once its time limit started: the stall is inside it.
    monkeypatch.setattr(Template, "generate", _paused_once(Template.generate))

    assert _seen(run(decode(CANARY))) == alone


def test_a_pause_while_a_campaign_is_held_does_not_change_a_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process stalled for real while reading its campaign's state takes the same steps."""
    alone = _seen(run(decode(CAMPAIGN)))

    state = FakeCampaigns.state

    async def stalled(self: FakeCampaigns, *args: Any) -> str | None:
        pause()
        return await state(self, *args)

    pause = _paused_once(lambda: None)
    monkeypatch.setattr(FakeCampaigns, "state", stalled)

    assert _seen(run(decode(CAMPAIGN))) == alone
