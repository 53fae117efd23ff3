"""``make bench``: run every registered phase against a private keyspace and exchange.

Usage: ``python -m bench.run [--quick] [--phases l_accept,api_max,...] [--list]
[--experiment NAME] [--lanes-bulk N]`` (``make bench BENCH_ARGS=--quick``)

The run migrates a fresh keyspace, declares a private topology and creates an API key; starts
the sandbox (webhooks scheduled an hour out, so they cost nothing during the run); runs the
phases of groups A (raw limits), B (the pipeline) and C (the raw acceptance limit again),
printing one line per step with its running figures; then drops the keyspace, deletes the
topology, writes ``bench/results/<UTC timestamp>.json`` and prints a summary table.
Service and child logs go to a temporary directory, named at the start.

Every headline figure is printed beside its raw baseline from the same run; a pipeline figure
its baseline makes impossible (faster than it, or acceptance cheaper in CPU) is printed as
INVALID with the reason (:mod:`bench.headline`). ``bench/results/latest.json`` takes this
run's headline only when no figure was refused and every headline figure and raw baseline
was measured; the summary says why it was kept otherwise.

Exit status: 0 when every phase ran (whatever the targets say), 1 if a phase failed, 2 if
the setup failed, 3 when a figure was refused as impossible (whether or not a phase failed:
the run measured something that cannot be, and that comes first), 130 when interrupted
(Ctrl-C or SIGTERM; the run still cleans up). What an interrupted or crashed run leaves
behind, ``python -m bench.cleanup`` removes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import headline, phases, procfs, report
from bench.config import BenchConfig
from bench.experiments import NAMES as KNOWN_EXPERIMENTS
from bench.phases import Context
from bench.sampler import ProcessSampler
from bench.stack import CAPACITY_LIMITS, ROOT, Stack

RESULTS_DIR = ROOT / "bench" / "results"
#: Machine CPU share (of all cores) above which the machine counts as busy before a run.
BUSY_BEFORE = 0.2
#: Percent of all CPUs used by processes outside the run above which a phase is noisy.
NOISY = 15.0
#: Share of all CPUs below which the machine counts as quiet between phases.
QUIET = 0.15
#: Longest wait for the machine to become quiet before a phase (seconds).
QUIET_WAIT = 45.0
#: Exit status of a run that refused a figure as impossible (see the module docstring).
REFUSED = 3


def exit_status(*, failed: bool, refused: bool) -> int:
    """The status of a run that got past its setup: a refused figure outranks a failed phase,
    which outranks missed targets (0)."""
    if refused:
        return REFUSED
    return 1 if failed else 0


class Printer:
    """Progress lines: elapsed time, the current phase, the text."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.phase = "setup"

    def __call__(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {self.phase:<13} {text}", flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~2-minute smoke run")
    parser.add_argument("--phases", help="comma-separated phase names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the phases and exit")
    parser.add_argument(
        "--lanes-bulk",
        type=int,
        metavar="N",
        help="recipients of the lanes phase's bulk corpus (default 1,000,000; --quick 200,000)",
    )
    parser.add_argument(
        "--experiment",
        action="append",
        default=[],
        choices=sorted(KNOWN_EXPERIMENTS),
        help="apply a what-if patch to every process (see bench/experiments); repeatable",
    )
    return parser.parse_args(argv)


async def _machine_busy(seconds: float = 2.0) -> float:
    busy0, total0 = procfs.read_system()
    await asyncio.sleep(seconds)
    busy1, total1 = procfs.read_system()
    return (busy1 - busy0) / max(total1 - total0, 1)


async def _settle(printer: Printer, limit: float = QUIET_WAIT) -> None:
    """Wait (up to ``limit`` s) until the machine is quiet, so a phase does not pay for the
    previous one's tail: Cassandra flushing and compacting what it wrote, queue deletions."""
    t0 = time.monotonic()
    busy = await _machine_busy(1.0)
    while busy > QUIET and time.monotonic() - t0 < limit:
        busy = await _machine_busy(1.0)
    waited = time.monotonic() - t0
    if waited > 1.5:
        state = "quiet" if busy <= QUIET else f"still {busy:.0%} busy"
        printer(f"waited {waited:.0f}s for the machine to settle ({state})")


async def run(config: BenchConfig, only: list[str] | None, experiments: Sequence[str]) -> int:
    # SIGTERM cleans up like Ctrl-C does: the task is cancelled and the finally blocks run.
    task = asyncio.current_task()
    assert task is not None  # noqa: S101
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    plan = phases.plan(phases.load(), only, quick=config.quick)
    started = time.time()
    printer = Printer()
    log_dir = Path(tempfile.mkdtemp(prefix="safedelivr-bench-"))
    sampler = ProcessSampler()
    sampler.start()
    stack = Stack(log_dir=log_dir, sampler=sampler, printer=printer, experiments=experiments)
    ctx = Context(stack=stack, config=config, sampler=sampler, log_dir=log_dir, printer=printer)
    busy = await _machine_busy()
    printer(
        f"run {stack.run_id}: {len(plan)} phases ({', '.join(p.name for p in plan)}); "
        f"machine {busy:.0%} busy before start; logs in {log_dir}"
    )
    if experiments:
        printer(f"EXPERIMENTS active (not the project as it is): {', '.join(experiments)}")
    if busy > BUSY_BEFORE:
        printer(f"WARNING: something else uses {busy:.0%} of the CPUs; figures will be low")
    failed = False
    leftovers: list[str] = []
    try:
        try:
            await stack.setup()
        except Exception as exc:  # noqa: BLE001 - reported, then cleaned up
            printer(f"setup failed: {type(exc).__name__}: {exc}")
            return 2
        for p in plan:
            printer.phase = p.name
            printer(f"-- {p.group}: {p.description}")
            t0 = time.monotonic()
            try:
                await stack.wait_until_available()
                await stack.ensure(set(p.needs))
                await _settle(printer)
                ctx.results[p.name] = result = await p.run(ctx)
                untracked = phases.untracked_share(result)
                result["untracked_pct_of_machine"] = untracked
                result["noisy"] = untracked > NOISY
                if result["noisy"]:
                    printer(f"WARNING: {untracked:.0f}% of the CPUs went to other processes")
            except Exception as exc:  # noqa: BLE001 - one failed phase must not lose the rest
                failed = True
                ctx.results[p.name] = {"error": f"{type(exc).__name__}: {exc}"}
                printer(f"FAILED: {type(exc).__name__}: {exc}")
                traceback.print_exc(file=sys.stderr)
            printer(f"done in {time.monotonic() - t0:.1f}s")
    finally:
        printer.phase = "teardown"
        leftovers = await stack.teardown()
        for problem in leftovers:
            printer(f"NOT CLEANED UP (remove by hand): {problem}")
        await sampler.stop()
    result = report.build(
        run_id=stack.run_id,
        config=dataclasses.asdict(config),
        stack_info={**_stack_info(stack, log_dir, busy), "not_cleaned_up": leftovers},
        results=ctx.results,
        sampler=sampler,
        started=started,
        finished=time.time(),
    )
    path = report.write(result, RESULTS_DIR)
    print(report.table(result))
    print(f"\nJSON: {path}")
    kept = headline.kept(result)
    print(f"latest.json: {'this run' if kept is None else 'kept, ' + kept}")
    if result["refused"]:
        refused = ", ".join(sorted(result["refused"]))
        print(f"INVALID RUN (exit status {REFUSED}): refused {refused}; see Headline above")
    return exit_status(failed=failed, refused=bool(result["refused"]))


def _stack_info(stack: Stack, log_dir: Path, busy: float) -> dict[str, Any]:
    return {
        "keyspace": stack.keyspace,
        "exchange": stack.exchange,
        "ports": stack.ports,
        "logs": str(log_dir),
        "machine_busy_before": round(busy, 3),
        "chain": stack.settings.providers.chain,
        "consumer_prefetch": stack.settings.consumers.prefetch,
        "experiments": list(stack.experiments),
        "api_limits": CAPACITY_LIMITS,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    registry = phases.load()
    if args.list:
        for p in phases.plan(registry):
            needs = ",".join(sorted(p.needs)) or "-"
            quick = "quick" if p.in_quick else "     "
            print(f"{p.group} {p.name:<14} {quick} needs {needs:<18} {p.description}")
        return 0
    config = BenchConfig()
    if args.quick:
        config = config.quick_version()
    if args.lanes_bulk is not None:
        config = dataclasses.replace(config, lanes_bulk_recipients=args.lanes_bulk)
    only = [n.strip() for n in args.phases.split(",") if n.strip()] if args.phases else None
    try:
        return asyncio.run(run(config, only, args.experiment))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted (the teardown lines above say what was cleaned up)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
