"""The phase registry: every measurement of a run is a registered :class:`Phase`.

A phase is an async function ``run(ctx) -> dict`` registered with :func:`phase`, with its
group (``A`` raw limits first, ``B`` the pipeline, ``C`` the limit again), its order in the
group and the services it ``needs`` running (the runner starts those and stops the others,
so that, e.g., no consumer drains the queues while a raw loop measures). Later phases read
earlier results from ``ctx.results``. To add webhook-ingest phases, write a module with
``@phase("webhooks_batched", group="B", order=60, needs={"sandbox", "webhooks"})`` functions
(``ctx.stack.processes.restart("sandbox", env=...)`` points the sandbox at it)
and list it in :data:`MODULES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import gclog
from bench.child import Child
from bench.config import BenchConfig
from bench.cqlops import Snapshot
from bench.sampler import SYSTEM, ProcessSampler
from bench.stack import Stack

#: Modules whose import registers phases, in no particular order.
MODULES = (
    "bench.phases.baseline",
    "bench.phases.api",
    "bench.phases.dispatch",
    "bench.phases.webhooks",
    "bench.phases.statsread",
    "bench.phases.lanes",
    "bench.phases.ratelimit",
    "bench.phases.idle",
)
GROUPS = ("A", "B", "C")

Result = dict[str, Any]


@dataclass
class Context:
    """What a phase may use: the stack, the settings of the run and earlier results."""

    stack: Stack
    config: BenchConfig
    sampler: ProcessSampler
    log_dir: Path
    printer: Callable[[str], None]
    results: dict[str, Result] = field(default_factory=dict)

    def child(self, label: str, module: str, spec: dict[str, Any], **env: str) -> Child:
        """A child process pointed at this run (not started)."""
        return Child(
            label,
            module,
            spec,
            env={**self.stack.env(), **env},
            log_dir=self.log_dir,
            sampler=self.sampler,
            printer=self.printer,
        )

    def usage(self, start: float, end: float, units: float, unit: str = "recipient") -> Result:
        """CPU and memory of every process within ``[start, end]``, and CPU-µs per ``unit``."""
        window = self.sampler.window(start, end)
        tracked = sum(float(v["cpu_s"]) for k, v in window.items() if k != SYSTEM)
        for entry in window.values():
            if units:
                entry[f"cpu_us_per_{unit}"] = round(float(entry["cpu_s"]) * 1e6 / units, 2)
        system = window.get(SYSTEM)
        if system is not None:
            untracked = max(0.0, float(system["cpu_s"]) - tracked)
            system["untracked_cpu_s"] = round(untracked, 3)
            share = untracked / float(system["cpu_s"]) if system["cpu_s"] else 0.0
            system["untracked_pct_of_machine"] = round(
                share * float(system["cpu_pct_of_machine"]), 1
            )
        return window

    async def cassandra_ops(self, *, settled: bool = False) -> Snapshot | None:
        """The run keyspace's Cassandra counters now (:mod:`bench.cqlops`): one before a
        window, one ``settled`` after it (once the work trailing the window has stopped), and
        :func:`bench.cqlops.per_unit` of the two is the phase's ``cassandra_ops_per_batch``."""
        return await self.stack.cassandra_ops(settled=settled)

    def cassandra_gc(self, start: float, end: float) -> Result:
        """Cassandra's GC pauses within ``[start, end]``: count, total and longest (ms)."""
        return gclog.summary(gclog.pauses(self.stack.state_dir, start, end))


def untracked_share(result: Any) -> float:
    """The largest share of all CPUs (%) used outside the run in any window of ``result``."""
    if isinstance(result, dict):
        own = result.get("usage", {}).get(SYSTEM, {}).get("untracked_pct_of_machine", 0.0)
        nested = [untracked_share(v) for k, v in result.items() if k != "usage"]
        return max([float(own), *nested])
    if isinstance(result, list):
        return max((untracked_share(v) for v in result), default=0.0)
    return 0.0


Runner = Callable[[Context], Awaitable[Result]]


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    group: str
    order: int
    needs: frozenset[str]
    run: Runner
    description: str
    in_quick: bool = True
    """Whether ``--quick`` runs it (the headline figures do; extra views may not)."""


REGISTRY: dict[str, Phase] = {}


def phase(
    name: str,
    *,
    group: str,
    order: int,
    description: str,
    needs: Iterable[str] = (),
    in_quick: bool = True,
) -> Callable[[Runner], Runner]:
    """Register ``run`` as phase ``name``."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}")

    def register(run: Runner) -> Runner:
        if name in REGISTRY:
            raise ValueError(f"phase {name!r} registered twice")
        REGISTRY[name] = Phase(name, group, order, frozenset(needs), run, description, in_quick)
        return run

    return register


def load() -> dict[str, Phase]:
    for module in MODULES:
        importlib.import_module(module)
    return REGISTRY


def plan(
    registry: dict[str, Phase], only: Iterable[str] | None = None, *, quick: bool = False
) -> list[Phase]:
    """The phases to run, in group then order; ``only`` names them (else all, or all the
    quick ones)."""
    chosen = [p for p in registry.values() if p.in_quick or not quick]
    if only is not None:
        wanted = set(only)
        unknown = wanted - set(registry)
        if unknown:
            raise ValueError(f"unknown phase(s) {sorted(unknown)}; known: {sorted(registry)}")
        chosen = [p for p in registry.values() if p.name in wanted]
    return sorted(chosen, key=lambda p: (GROUPS.index(p.group), p.order, p.name))
