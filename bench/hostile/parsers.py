"""Part (a) of ``make hostile``: every case of :mod:`bench.hostile.cases` at 1x and 10x, each
case in a child process of its own (:mod:`bench.hostile.measure`), one at a time.

A parse that outlives ``timeout`` seconds is ended with its process and reported as
``timeout`` (a quadratic parser at 10x takes minutes: the run goes on without it); the 10x
of a case whose 1x timed out is not run. A child that dies otherwise is a harness error,
reported with its log's tail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import child
from bench.hostile import targets
from bench.hostile.cases import Case
from bench.sampler import ProcessSampler

#: The scales every case is measured at.
SCALES = (1, 10)
#: Seconds a child may take to start and build an input before it times a parse.
BUILD_TIMEOUT = 120.0
#: Address space of a measuring child: a memory bomb fails there, not on the machine.
ADDRESS_SPACE_MB = 4096


async def measure(
    case: Case,
    *,
    timeout: float,
    env: dict[str, str],
    log_dir: Path,
    sampler: ProcessSampler,
    printer: Callable[[str], None],
) -> dict[str, Any]:
    """One case's row of the table (see :func:`row`)."""
    spec = {"case": case.name, "scales": list(SCALES), "address_space_mb": ADDRESS_SPACE_MB}
    label = "parser-" + "".join(c if c.isalnum() else "-" for c in case.name.lower())
    proc = child.Child(
        label,
        "bench.hostile.measure",
        spec,
        env=env,
        log_dir=log_dir,
        sampler=sampler,
        printer=printer,
    )
    results: dict[int, dict[str, Any]] = {}
    sizes: dict[int, int] = {}
    missing = "not run"
    error = None
    await proc.start()
    try:
        for scale in SCALES:
            started = await proc.next_message("timing", BUILD_TIMEOUT)
            sizes[scale] = int(started["bytes"])
            try:
                results[scale] = await proc.next_message("result", timeout)
            except child.ChildError:
                if proc.proc is None or proc.proc.returncode is not None:
                    raise
                missing = "timeout"
                break
    except child.ChildError as exc:
        error = str(exc)
        missing = "error"
    finally:
        await proc.stop()
    return row(case, results, sizes, timeout=timeout, missing=missing, error=error)


def row(
    case: Case,
    results: dict[int, dict[str, Any]],
    sizes: dict[int, int],
    *,
    timeout: float,
    missing: str,
    error: str | None = None,
) -> dict[str, Any]:
    """The JSON row of a case: sizes, seconds and outcomes at 1x and 10x, the peak memory
    of the measuring process, and the verdict. ``missing`` says why a scale without a result
    has none (the first such one; the others were not run)."""
    timings = {}
    gap = missing
    for scale in SCALES:
        timings[scale] = targets.Timing.of(results.get(scale), gap)
        if scale not in results:
            gap = "not run"
    verdict = targets.judge_parser(timings[1], timings[10], timeout)
    last = results.get(SCALES[-1]) or results.get(SCALES[0]) or {}
    out: dict[str, Any] = {
        "name": case.name,
        "parser": case.parser,
        "input": case.hostile,
        "bytes": {f"{s}x": sizes.get(s) for s in SCALES},
        "seconds": {f"{s}x": timings[s].seconds for s in SCALES},
        "outcome": {f"{s}x": timings[s].outcome for s in SCALES},
        "peak_mb": last.get("peak_mb"),
        "timeout_s": timeout,
        **verdict,
    }
    if error is not None:
        out["error"] = error
    return out


async def measure_all(
    cases: Sequence[Case],
    *,
    timeout: float,
    env: dict[str, str],
    log_dir: Path,
    sampler: ProcessSampler,
    printer: Callable[[str], None],
) -> list[dict[str, Any]]:
    rows = []
    for case in cases:
        found = await measure(
            case, timeout=timeout, env=env, log_dir=log_dir, sampler=sampler, printer=printer
        )
        printer(line(found))
        rows.append(found)
    return rows


def line(found: dict[str, Any]) -> str:
    """One progress line: the case, both times and the verdict."""
    one, ten = found["seconds"]["1x"], found["seconds"]["10x"]
    first = "-" if one is None else f"{one:.3f}s"
    second = f"{found['outcome']['10x']}" if ten is None else f"{ten:.3f}s"
    verdict = {True: "ok", False: "OVER", None: "?"}[found["pass"]]
    return f"{found['name']}: 1x {first}, 10x {second} -> {verdict}"
