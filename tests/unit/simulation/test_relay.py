"""The simulated relay (``simulation.providers.relay_answer``) plays each per-recipient answer
as the scenario ``relay`` says, fault-free: the run judges clean, and the ledger and the
suppression list show what each answer did."""

from __future__ import annotations

from collections import defaultdict

import pytest

from simulation.clients import Request
from simulation.faults import Schedule
from simulation.scenarios import SCENARIOS, Scenario
from simulation.search import run
from simulation.world import World


def test_each_answer_of_a_relay_settles_its_recipient(monkeypatch: pytest.MonkeyPatch) -> None:
    relay = SCENARIOS["relay"]
    worlds: list[World] = []

    async def script(world: World) -> list[Request]:
        worlds.append(world)
        return await relay.script(world)

    monkeypatch.setitem(SCENARIOS, "relay", Scenario("relay", "", script, relay.config))

    outcome = run(Schedule("relay"))

    assert outcome.ok, outcome.verdict.violations
    (world,) = worlds
    taken: dict[str, list[str]] = defaultdict(list)
    for a in world.ledger.accepted:
        taken[a.email.split("@")[0]].append(f"{a.provider} {a.tag}")
    assert dict(taken) == {
        "ann": ["sg c.0"],  # taken: delivered, by the relay's word alone
        "rcpt4xx.bob": ["mg r.0"],  # refused for now: handed over to Mailgun
        "rcptlost.dan": ["sg c.0", "mg c.1"],  # no evidence within the window: resent
    }
    assert {email for (_, email) in world.db.suppressions} == {"rcpt5xx.cat@example.org"}
