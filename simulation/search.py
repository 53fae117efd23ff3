"""Running schedules: one run, every single fault at every step, seeded swarms of faults,
and the shrinking of a failing schedule to the smallest that still fails.

A run is a pure function of its schedule (``simulation.runtime``): the same schedule takes
the same steps and meets the same verdict, so a violation found by a swarm run shrinks by
re-running it with faults left out, and its smallest schedule replays anywhere.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from simulation.faults import (
    DISCONNECT,
    FAULTS,
    GENERAL,
    Fault,
    Schedule,
    Skew,
    StepKind,
    kinds_for,
)
from simulation.invariants import Verdict, judge
from simulation.processes import StepRecord, skew_now, task_factory
from simulation.runtime import Deadlock, simulate
from simulation.scenarios import SCENARIOS
from simulation.world import World

#: Clock skews tried once per scenario in the single-fault pass (seconds; Cassandra's clock
#: or one process's).
SKEWS = (
    Skew("cassandra", -90.0),
    Skew("cassandra", 90.0),
    Skew("api", 90.0),
    Skew("consumers-a", -90.0),
    Skew("webhooks", 120.0),
)


@dataclass
class Outcome:
    schedule: Schedule
    steps: list[StepRecord]
    count: int
    verdict: Verdict
    elapsed: float = 0.0
    """Virtual seconds the run lasted."""

    @property
    def ok(self) -> bool:
        return self.verdict.ok


class _Errors(logging.Handler):
    """Collects what the services log at ERROR: an unexpected exception is a violation."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if (
            record.name.startswith(("services", "shared"))
            and "dead-lettering" not in record.getMessage()
        ):
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
            self.seen.append(f"{record.name}: {text}")


def run(schedule: Schedule, *, record: bool = False) -> Outcome:
    """Run one schedule and judge it."""
    scenario = SCENARIOS[schedule.scenario]
    errors = _Errors()
    root = logging.getLogger()
    root.addHandler(errors)
    previous = root.level
    root.setLevel(logging.ERROR)
    worlds: list[World] = []

    async def main(clock: object) -> Outcome:
        world = World(schedule, scenario.config, clock, record=record)  # type: ignore[arg-type]
        worlds.append(world)
        await world.boot()
        requests = await scenario.script(world)
        quiet = await world.quiesce()
        world.errors.extend(errors.seen)
        verdict = await judge(world, requests, quiet=quiet)
        return Outcome(schedule, world.gate.steps, world.gate.count, verdict, clock.elapsed)  # type: ignore[attr-defined]

    try:
        return simulate(main, seed=schedule.seed, task_factory=task_factory, skew=skew_now)
    except Deadlock as exc:
        verdict = Verdict()
        verdict.add("deadlock", str(exc))
        world = worlds[0] if worlds else None
        steps = world.gate.steps if world else []
        count = world.gate.count if world else 0
        return Outcome(schedule, steps, count, verdict)
    finally:
        root.removeHandler(errors)
        root.setLevel(previous)


def single_faults(scenario: str, base: Outcome) -> Iterator[Schedule]:
    """Every single fault at every step of ``base`` (a fault-free run), then each skew."""
    for step in base.steps:
        for kind in kinds_for(step.kind):
            if kind == DISCONNECT and step.process == "api":
                continue  # it consumes nothing: nothing to deliver twice
            yield Schedule(scenario, (Fault(step.index, kind),), seed=base.schedule.seed)
    for skew in SKEWS:
        yield Schedule(scenario, (), (skew,), seed=base.schedule.seed)


def swarm(scenario: str, seed: int, steps: int) -> Schedule:
    """A seeded schedule of two to four faults somewhere in a run of about ``steps`` steps,
    sometimes with a skew, with jitter (so concurrent work interleaves in other orders).

    Faults come in clusters more often than not (each next one a few steps after the one
    before), as real ones do: one Cassandra pause times out a write and the cancel meant to
    undo it; a broker restart loses a publish and the ack after it.
    """
    rng = random.Random(seed)
    n = rng.randint(2, 4)
    span = max(1, int(steps * 1.3))
    at = rng.randrange(span)
    faults = {at: f"*{rng.randrange(64)}"}
    while len(faults) < n:
        if rng.random() < 0.6:
            at += 1
            while rng.random() < 0.5:
                at += 1
        else:
            at = rng.randrange(span)
        faults.setdefault(at, f"*{rng.randrange(64)}")
    skews = (rng.choice(SKEWS),) if rng.random() < 0.2 else ()
    return Schedule(
        scenario,
        tuple(Fault(i, k) for i, k in sorted(faults.items())),
        skews,
        seed=seed,
        jitter=True,
    )


def resolved(outcome: Outcome) -> Schedule:
    """A swarm schedule with each fault as the step it hit turned out (``*n`` resolved), and
    the faults that hit no step (the run was shorter) left out."""
    faults = tuple(Fault(s.index, s.fault) for s in outcome.steps if s.fault is not None)
    s = outcome.schedule
    return Schedule(s.scenario, faults, s.skews, s.seed, s.jitter)


def stable(outcome: Outcome) -> Schedule:
    """The same faults named by what each step is (its process and point, and how many such
    steps came before) rather than by number: what regression tests keep."""
    counts: dict[str, int] = {}
    faults = []
    for s in outcome.steps:
        where = f"{s.process}/{s.point}"
        counts[where] = counts.get(where, 0) + 1
        if s.fault is not None:
            faults.append(Fault(counts[where], s.fault, where))
    sch = outcome.schedule
    return Schedule(sch.scenario, tuple(faults), sch.skews, sch.seed, sch.jitter)


def shrink(failing: Outcome, *, budget: int = 60) -> Outcome:
    """The smallest schedule found that still fails: faults and skews left out one at a
    time while it keeps failing, then (once none can go) jitter off if it still fails."""
    best = failing
    best_schedule = resolved(failing)
    changed = True
    while changed and budget > 0:
        changed = False
        parts: list[Fault | Skew] = [*best_schedule.faults, *best_schedule.skews]
        for part in parts:
            if budget <= 0:
                break
            budget -= 1
            trial = run(best_schedule.without(part), record=True)
            if not trial.ok:
                best, best_schedule, changed = trial, resolved(trial), True
                break
    if best_schedule.jitter and budget > 0:
        calm = Schedule(
            best_schedule.scenario, best_schedule.faults, best_schedule.skews, best_schedule.seed
        )
        trial = run(calm, record=True)
        if not trial.ok:
            best = trial
    return best


def describe(outcome: Outcome) -> list[str]:
    """A failing run: its faults as the steps they hit, and what broke."""
    lines = [f"schedule {_encode(outcome.schedule)}"]
    for s in outcome.steps:
        if s.fault is not None:
            why = FAULTS.get(s.kind, {}).get(s.fault) or GENERAL.get(s.fault, s.fault)
            lines.append(f"  step {s.index} ({s.process}) {s.point}: {s.fault} ({why})")
    for skew in outcome.schedule.skews:
        lines.append(f"  skew: {skew.target}'s clock {skew.seconds:+g} s")
    lines += [f"  violation: {v}" for v in outcome.verdict.violations[:8]]
    return lines


def _encode(schedule: Schedule) -> str:
    from simulation.faults import encode

    return encode(schedule)


@dataclass
class Tally:
    runs: int = 0
    violations: int = 0
    at_least_once: dict[str, int] = field(default_factory=dict)
    failures: list[Outcome] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.runs += 1
        for reason, n in outcome.verdict.at_least_once.items():
            self.at_least_once[reason] = self.at_least_once.get(reason, 0) + n
        if not outcome.ok:
            self.violations += 1
            self.failures.append(outcome)


def kinds(steps: Iterable[StepRecord]) -> dict[StepKind, int]:
    out: dict[StepKind, int] = {}
    for s in steps:
        out[s.kind] = out.get(s.kind, 0) + 1
    return out
