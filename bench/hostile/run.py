"""``make hostile``: every parser on hostile input at 1x and 10x, then every hostile input of
issue 33 (and those of ``make fuzz``) against a running stack, and each service's longest
event-loop stall and peak RSS afterwards.

Usage: ``python -m bench.hostile.run [--parsers-only | --stack-only] [--cases NAME,...]
[--timeout S] [--fuzz-examples N] [--no-schemathesis] [--list]``
(``make hostile HOSTILE_ARGS=--parsers-only``)

(a) Each parser of :mod:`bench.hostile.cases` runs in a child process, at 1x then 10x; a parse
that outlives ``--timeout`` is stopped and reported as a timeout. (b) The stack is
:class:`bench.stack.Stack`'s (a private keyspace and exchange, the sandbox providers, every
service as a real process: API, consumers, webhooks, tracking, hooks); the hostile inputs
(:mod:`bench.hostile.attack`) are sent at once, then the fuzzing cases
(:mod:`bench.hostile.fuzzed`); once the queues are empty (or ``--settle`` seconds passed) they
are purged and every service's ``/metrics`` is read, waiting up to ``--scrape-timeout`` for a
service whose loop is held. Then the stack is torn down as ``make bench`` does. Once the
stack's processes are started, the harness lowers its own scheduling priority (nice
:data:`HARNESS_NICE`, inherited by the fuzzers it starts): it builds and sends the attack,
10 MB bodies encoded in Python among them, on the same two cores as the services, and an
attacker's CPU is not the server's (the services, Cassandra and RabbitMQ keep theirs).

Prints a table and, last, one JSON line with the headline figures and ``violations``; writes
``bench/results/hostile/<run>.json`` and ``latest.json``. Exit status: 0 when everything ran,
whatever the figures say (a figure, not a gate); 1 on a harness error (a measuring process
died, the stack went away); 2 if the stack could not be set up; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import procfs
from bench.hostile import attack, cases, fuzzed, parsers, report, scrape, targets
from bench.run import Printer
from bench.sampler import ProcessSampler
from bench.stack import ROOT, Stack, run_names
from shared.core.keyring import ring_from
from tests.fuzz.tally import new_sender

RESULTS_DIR = ROOT / "bench" / "results" / "hostile"
#: Every process the stack runs: the sandbox (the providers) and the services measured.
STACK = ("sandbox", *targets.SERVICES)
#: Rounds in a row the stack must look idle before its figures are read.
QUIET_ROUNDS = 3


class HarnessError(RuntimeError):
    """The run could not measure what it set out to (not a figure over its target)."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hostile.run", description=__doc__.split("\n\n")[0]
    )
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--parsers-only", action="store_true", help="part (a) only: no stack")
    only.add_argument("--stack-only", action="store_true", help="part (b) only")
    parser.add_argument("--cases", help="comma-separated parser cases (default: all)")
    parser.add_argument("--list", action="store_true", help="list the parser cases and exit")
    parser.add_argument(
        "--timeout", type=float, default=20.0, help="CPU-bound seconds a parse may take (20)"
    )
    parser.add_argument(
        "--request-timeout", type=float, default=300.0, help="seconds a hostile request waits"
    )
    parser.add_argument(
        "--settle", type=float, default=180.0, help="longest wait for the work to be done"
    )
    parser.add_argument(
        "--scrape-timeout",
        type=float,
        default=150.0,
        help="seconds a service's /metrics is waited for (a held loop answers late)",
    )
    parser.add_argument("--fuzz-examples", type=int, default=10, help="per route (make fuzz: 30)")
    parser.add_argument("--fuzz-seed", type=int, default=20261125)
    parser.add_argument(
        "--no-schemathesis", action="store_true", help="skip the Schemathesis part of the fuzzing"
    )
    return parser.parse_args(argv)


def selected(names: str | None) -> list[cases.Case]:
    if not names:
        return list(cases.CASES)
    return [cases.by_name(name.strip()) for name in names.split(",") if name.strip()]


#: How far the harness lowers its priority once the stack runs (see the module docstring).
HARNESS_NICE = 10


async def against_stack(
    args: argparse.Namespace,
    *,
    printer: Printer,
    sampler: ProcessSampler,
    log_dir: Path,
) -> dict[str, Any]:
    """Part (b); raises HarnessError if the stack could not be set up."""
    stack = Stack(log_dir=log_dir, sampler=sampler, printer=printer)
    out: dict[str, Any] = {"keyspace": stack.keyspace, "exchange": stack.exchange}
    try:
        try:
            await stack.setup()
            await stack.ensure(set(STACK))
        except Exception as exc:
            raise HarnessError(
                f"the stack could not be set up: {type(exc).__name__}: {exc}"
            ) from exc
        assert stack.db is not None  # noqa: S101 - set up above
        # After the services started (they would inherit it): see the module docstring.
        out["harness_nice"] = os.nice(HARNESS_NICE)
        _, key = await new_sender(stack.db, "hostile")
        target = attack.Target(
            api=stack.url("api"),
            webhooks=stack.url("webhooks"),
            tracking=stack.url("tracking"),
            key=key,
            ring=ring_from(stack.settings.tracking.keys.get_secret_value()),
            sendgrid_private_key=stack.sendgrid_private_key,
            mailgun_signing_key=stack.mailgun_signing_key,
            timeout=args.request_timeout,
        )
        async with httpx.AsyncClient() as client:
            before = await _scrape_all(client, stack, sampler, timeout=30.0)
            printer("before: " + _figures_line(before))
            sent = await attack.run_all(attack.Attacker(target, client), printer)
            sent += await fuzzed.fuzz_all(
                stack.settings,
                target,
                examples=args.fuzz_examples,
                seed=args.fuzz_seed,
                schemathesis=not args.no_schemathesis,
                printer=printer,
            )
            out["settled_s"] = await _settle(stack, client, args.settle, printer)
            out["purged"] = await stack.purge(*_queues(stack))
            after = await _scrape_all(client, stack, sampler, timeout=args.scrape_timeout)
            printer("after: " + _figures_line(after))
        out["attacks"] = {name: a.summary() for name, a in sent}
        out["rss_limits_mb"] = targets.rss_limits(stack.settings)
        out["services"] = report.services(after, before, out["rss_limits_mb"])
    finally:
        out["not_cleaned_up"] = await stack.teardown()
    return out


async def _machine_busy(seconds: float = 2.0) -> float:
    """The share of all CPUs in use over ``seconds``."""
    busy0, total0 = procfs.read_system()
    await asyncio.sleep(seconds)
    busy1, total1 = procfs.read_system()
    return (busy1 - busy0) / max(total1 - total0, 1)


def _queues(stack: Stack) -> list[str]:
    return [stack.topology.batches_queue, *stack.work_queues()]


async def _settle(
    stack: Stack, client: httpx.AsyncClient, limit: float, printer: Callable[[str], None]
) -> float:
    """Wait until the work is done, or ``limit`` seconds: three rounds in a row, two seconds
    apart, with no message ready in any queue and every service answering its metrics
    within a second (a consumer busy with a hostile job holds its loop, or soon will)."""
    started = time.monotonic()
    quiet = 0
    while time.monotonic() - started < limit and quiet < QUIET_ROUNDS:
        await asyncio.sleep(2.0)
        depths = [await stack.depth(q) for q in _queues(stack)]
        answers = await asyncio.gather(
            *(scrape.scrape(client, stack.url(name), 1.0) for name in targets.SERVICES)
        )
        idle = not any(depths) and all(a.answered for a in answers)
        quiet = quiet + 1 if idle else 0
    waited = time.monotonic() - started
    state = "quiet" if quiet >= QUIET_ROUNDS else "still busy"
    printer(f"the stack was {state} after {waited:.0f}s")
    return round(waited, 1)


async def _scrape_all(
    client: httpx.AsyncClient, stack: Stack, sampler: ProcessSampler, *, timeout: float
) -> dict[str, dict[str, Any]]:
    """Every service's figures, scraped at once (a held service does not delay the others)."""
    found = await asyncio.gather(
        *(scrape.scrape(client, stack.url(name), timeout) for name in targets.SERVICES)
    )
    return {
        name: {**asdict(s), "sampled_hwm_mb": sampler.peak_hwm_mb(name)}
        for name, s in zip(targets.SERVICES, found, strict=True)
    }


def _figures_line(found: dict[str, dict[str, Any]]) -> str:
    parts = []
    for name, s in found.items():
        if not s["answered"]:
            parts.append(f"{name} {s['problem']}")
        else:
            stall = "-" if s["stall_s"] is None else f"{s['stall_s']:.3f}s"
            parts.append(f"{name} stall {stall} rss {s['rss_mb']} MB")
    return "; ".join(parts)


async def run(args: argparse.Namespace) -> int:
    task = asyncio.current_task()
    assert task is not None  # noqa: S101
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    stamp, _, _ = run_names()
    started = time.time()
    printer = Printer()
    log_dir = Path(tempfile.mkdtemp(prefix="safedelivr-hostile-"))
    printer(f"run hostile-{stamp}; logs in {log_dir}")
    sampler = ProcessSampler()
    sampler.start()
    busy = await _machine_busy()
    printer(f"machine {busy:.0%} busy before start")
    result: dict[str, Any] = {
        "run_id": f"hostile-{stamp}",
        "started_at": started,
        "machine": {
            "cpus": procfs.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "busy_before": round(busy, 3),
        },
        "config": vars(args),
        "targets": {
            "ratio": targets.RATIO_TARGET,
            "noise_floor_s": targets.NOISE_FLOOR,
            "stall_s": targets.STALL_TARGET,
            "rss_mb": "each service's memory_max_mb setting (stack.rss_limits_mb)",
        },
        "logs": str(log_dir),
    }
    errors: list[str] = []
    status = 0
    try:
        if not args.stack_only:
            printer.phase = "parsers"
            rows = await parsers.measure_all(
                selected(args.cases),
                timeout=args.timeout,
                env={"PYTHONPATH": str(ROOT)},
                log_dir=log_dir,
                sampler=sampler,
                printer=printer,
            )
            errors += [f"parser {r['name']}: {r['error']}" for r in rows if "error" in r]
            result["parsers"] = rows
        if not args.parsers_only:
            printer.phase = "stack"
            try:
                result["stack"] = await against_stack(
                    args, printer=printer, sampler=sampler, log_dir=log_dir
                )
            except HarnessError as exc:
                errors.append(str(exc))
                status = 2
            else:
                errors += [f"not cleaned up: {p}" for p in result["stack"]["not_cleaned_up"]]
    finally:
        printer.phase = "report"
        await sampler.stop()
    result["seconds"] = round(time.time() - started, 1)
    result["errors"] = errors
    result["violations"] = targets.violations(report.verdicts(result))
    path = report.write(result, RESULTS_DIR)
    print(report.table(result))
    print(orjson.dumps(report.summary(result, path)).decode())
    return status or (1 if errors else 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for case in cases.CASES:
            print(f"{case.name:<36} {case.parser:<56} {case.hostile}")
        return 0
    try:
        selected(args.cases)
    except KeyError as exc:
        print(f"no parser case {exc} (see --list)", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted (the teardown lines above say what was cleaned up)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
