"""Schedules as text, and which faults each kind of step allows."""

from __future__ import annotations

import pytest

from simulation.faults import FAULTS, KILL, Fault, Schedule, Skew, decode, encode, kinds_for


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule("plain"),
        Schedule("plain", (Fault(3, "lands"), Fault(40, KILL)), seed=9),
        Schedule("keyless", (Fault(1, "lost", "consumers-b/publish:sg.*"),), jitter=True),
        Schedule("plain", (Fault(2, "*17"),), (Skew("cassandra", -90.0),), seed=3),
    ],
)
def test_a_schedule_reads_back_as_it_was_written(schedule: Schedule) -> None:
    assert decode(encode(schedule)) == schedule


@pytest.mark.parametrize("text", ["", "plain@x:1=kill", "plain:1", "plain:1=kill;tilt:api=3"])
def test_a_malformed_schedule_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        decode(text)


def test_every_step_can_end_its_process_and_has_faults_of_its_own() -> None:
    for kind in FAULTS:
        assert kinds_for(kind)[-2:] == (KILL, "disconnect")
        assert len(kinds_for(kind)) > 2


def test_a_swarm_fault_resolves_to_a_fault_the_step_allows() -> None:
    """``*n`` picks among the step's own faults, whatever n is."""
    for n in range(50):
        assert Fault(0, f"*{n}").resolve("publish") in kinds_for("publish")
    assert Fault(0, "lands").resolve("write") == "lands"
