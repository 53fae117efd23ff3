"""The run's figures, goals and summary table, and the JSON written to ``bench/results/``."""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench import cqlops, headline, procfs, targets
from bench.sampler import SYSTEM, ProcessSampler
from bench.targets import PYTHON_SERVICES

#: Processes shown in the CPU columns of the table, in this order (others are in the JSON).
CPU_COLUMNS = ("client", "api", "consumers", "sandbox", "rabbitmq", "cassandra")
#: Labels of child processes that drive a phase: the "client" column.
CLIENT_PREFIXES = ("raw-", "loadgen", "feeder")

Results = Mapping[str, Mapping[str, Any]]


def _get(results: Results, *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


#: The processes whose CPU is the work of each path (the load generators and the sandbox,
#: which stands in for the providers, are not).
ACCEPT_PROCESSES = ("api", "cassandra", "rabbitmq")
E2E_PROCESSES = ("consumers", "cassandra", "rabbitmq")
WEBHOOK_PROCESSES = ("webhooks", "cassandra", "rabbitmq")
#: The shared rate limiter's processes: the consumers take the slots, Cassandra counts them.
LIMITER_PROCESSES = ("consumers", "consumers-b", "consumers-c", "cassandra")
#: The same work done by the raw loops (phases ``l_accept``/``l_accept_end``, ``l_e2e``,
#: ``l_webhook``): the loop's own process in place of the service's.
RAW_ACCEPT_PROCESSES = ("raw-accept", "cassandra", "rabbitmq")
RAW_ACCEPT_END_PROCESSES = ("raw-accept-end", "cassandra", "rabbitmq")
RAW_E2E_PROCESSES = ("raw-e2e", "cassandra", "rabbitmq")
RAW_WEBHOOK_PROCESSES = ("L_webhook", "cassandra", "rabbitmq")

#: Webhook events per delivered recipient: each provider posts two (SendGrid processed and
#: delivered, Mailgun accepted and delivered), as the sandbox does.
EVENTS_PER_RECIPIENT = 2


def work_per_unit(
    usage: Mapping[str, Mapping[str, Any]] | None, processes: Sequence[str], unit: str
) -> float | None:
    """CPU-µs per ``unit`` (recipient, event) of ``processes`` together, from a phase's usage;
    None when the phase did not run or one of the processes was not sampled."""
    if not usage:
        return None
    values = [usage.get(name, {}).get(f"cpu_us_per_{unit}") for name in processes]
    if any(v is None for v in values):
        return None
    return round(float(sum(v for v in values if v is not None)), 2)


def pipeline_per_recipient(
    accept: float | None, dispatch: float | None, webhook: float | None
) -> float | None:
    """Machine CPU-µs per recipient of the whole pipeline: accepting it, dispatching it and
    ingesting its webhook events; None when a part was not measured."""
    if accept is None or dispatch is None or webhook is None:
        return None
    return round(accept + dispatch + EVENTS_PER_RECIPIENT * webhook, 2)


def best_level(results: Results) -> Mapping[str, Any] | None:
    """The closed-loop level of ``api_max`` that reached the maximum."""
    levels = _get(results, "api_max", "levels") or []
    best = _get(results, "api_max", "best_concurrency")
    return next((lv for lv in levels if lv.get("concurrency") == best), None)


def figures(results: Results, sampler: ProcessSampler) -> dict[str, float | None]:
    """The headline numbers the goals are judged on."""
    l_accept = targets.reference(
        _get(results, "l_accept", "batches_per_s"), _get(results, "l_accept_end", "batches_per_s")
    )
    out: dict[str, float | None] = {
        "l_accept_batches_per_s": l_accept,
        "l_accept_rcpt_per_s": targets.reference(
            _get(results, "l_accept", "recipients_per_s"),
            _get(results, "l_accept_end", "recipients_per_s"),
        ),
        "api_max_batches_per_s": _get(results, "api_max", "batches_per_s"),
        "l_e2e_recipients_per_s": _get(results, "l_e2e", "recipients_per_s"),
        "e2e_recipients_per_s": _get(results, "e2e", "recipients_per_s"),
        "l_e2e_1000_recipients_per_s": _get(results, "l_e2e_1000", "recipients_per_s"),
        "e2e_1000_recipients_per_s": _get(results, "e2e_1000", "recipients_per_s"),
        "p99_ms_at_50pct": _get(results, "api_open", "steps", "50%", "latency_ms", "p99"),
        "p99_ms_at_80pct": _get(results, "api_open", "steps", "80%", "latency_ms", "p99"),
    }
    out["e2e_ratio"] = targets.ratio(out["e2e_recipients_per_s"], out["l_e2e_recipients_per_s"])
    out["e2e_1000_ratio"] = targets.ratio(
        out["e2e_1000_recipients_per_s"], out["l_e2e_1000_recipients_per_s"]
    )
    out["l_webhook_events_per_s"] = _get(results, "l_webhook", "events_per_s")
    out["webhooks_batched_events_per_s"] = _get(results, "webhooks_batched", "events_per_s")
    out["webhooks_single_events_per_s"] = _get(results, "webhooks_single", "events_per_s")
    out["webhooks_batched_ratio"] = targets.ratio(
        out["webhooks_batched_events_per_s"], out["l_webhook_events_per_s"]
    )
    out["webhooks_single_ratio"] = targets.ratio(
        out["webhooks_single_events_per_s"], out["l_webhook_events_per_s"]
    )
    for name in PYTHON_SERVICES:
        out[f"rss_mb_{name}"] = sampler.peak_hwm_mb(name)
    level = best_level(results)
    out["accept_cpu_us_per_rcpt"] = work_per_unit(
        level.get("usage") if level else None, ACCEPT_PROCESSES, "recipient"
    )
    out["api_max_rcpt_per_s"] = _get(results, "api_max", "recipients_per_s")
    # Recipients the API's answers accepted, not requests times N (issue 34).
    out["acceptance_ratio"] = targets.ratio(out["api_max_rcpt_per_s"], out["l_accept_rcpt_per_s"])
    out["e2e_cpu_us_per_rcpt"] = work_per_unit(
        _get(results, "e2e", "usage"), E2E_PROCESSES, "recipient"
    )
    out["webhook_cpu_us_per_event"] = work_per_unit(
        _get(results, "webhooks_batched", "usage"), WEBHOOK_PROCESSES, "event"
    )
    out["webhook_single_cpu_us_per_event"] = work_per_unit(
        _get(results, "webhooks_single", "usage"), WEBHOOK_PROCESSES, "event"
    )
    out.update(raw_work(results))
    out["accept_cpu_ratio"] = targets.ratio(
        out["accept_cpu_us_per_rcpt"], out["l_accept_cpu_us_per_rcpt"]
    )
    out["e2e_cpu_ratio"] = targets.ratio(out["e2e_cpu_us_per_rcpt"], out["l_e2e_cpu_us_per_rcpt"])
    out["webhook_cpu_ratio"] = targets.ratio(
        out["webhook_cpu_us_per_event"], out["l_webhook_cpu_us_per_event"]
    )
    out["pipeline_cpu_us_per_rcpt"] = pipeline_per_recipient(
        out["accept_cpu_us_per_rcpt"], out["e2e_cpu_us_per_rcpt"], out["webhook_cpu_us_per_event"]
    )
    out["l_pipeline_cpu_us_per_rcpt"] = pipeline_per_recipient(
        out["l_accept_cpu_us_per_rcpt"],
        out["l_e2e_cpu_us_per_rcpt"],
        out["l_webhook_cpu_us_per_event"],
    )
    out["pipeline_cpu_ratio"] = targets.ratio(
        out["pipeline_cpu_us_per_rcpt"], out["l_pipeline_cpu_us_per_rcpt"]
    )
    out["stats_read_ms_10m"] = _get(results, "stats_read", "ms_10m")
    out["stats_read_cold_ms_10m"] = _get(results, "stats_read", "cold_ms_10m")
    out["idle_cores"] = _get(results, "idle", "idle_cores")
    out["lanes_tx_p99_s"] = _get(results, "lanes", "time_to_provider_s", "p99")
    out["rate_limit_busiest_ratio"] = _get(results, "rate_limit", "busiest_ratio")
    out["rate_limit_steady_ratio"] = _get(results, "rate_limit", "steady_ratio")
    out["rate_limit_cpu_us_per_call"] = work_per_unit(
        _get(results, "rate_limit", "usage"), LIMITER_PROCESSES, "call"
    )
    out["rate_limit_unlimited_cpu_us_per_call"] = work_per_unit(
        _get(results, "rate_limit", "unlimited", "usage"), LIMITER_PROCESSES, "call"
    )
    return out


def raw_work(results: Results) -> dict[str, float | None]:
    """CPU-µs per recipient (event) of the raw loops, the baselines of the pipeline's work:
    L_accept's is the mean of phases A and C, as its rate is."""
    return {
        "l_accept_cpu_us_per_rcpt": targets.reference(
            work_per_unit(_get(results, "l_accept", "usage"), RAW_ACCEPT_PROCESSES, "recipient"),
            work_per_unit(
                _get(results, "l_accept_end", "usage"), RAW_ACCEPT_END_PROCESSES, "recipient"
            ),
        ),
        "l_e2e_cpu_us_per_rcpt": work_per_unit(
            _get(results, "l_e2e", "usage"), RAW_E2E_PROCESSES, "recipient"
        ),
        "l_webhook_cpu_us_per_event": work_per_unit(
            _get(results, "l_webhook", "usage"), RAW_WEBHOOK_PROCESSES, "event"
        ),
    }


def build(
    *,
    run_id: str,
    config: Mapping[str, Any],
    stack_info: Mapping[str, Any],
    results: Results,
    sampler: ProcessSampler,
    started: float,
    finished: float,
) -> dict[str, Any]:
    figs = figures(results, sampler)
    refused = headline.refusals(figs)
    judged = targets.evaluate(figs, refused)
    stability = _get(results, "l_accept_end", "stability")
    return {
        "run_id": run_id,
        "started_at": started,
        "seconds": round(finished - started, 1),
        "machine": {
            "cpus": procfs.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "config": dict(config),
        "stack": dict(stack_info),
        "stable": None if stability is None else stability["stable"],
        "figures": figs,
        "refused": refused,
        "targets": judged,
        "all_targets_pass": targets.all_passed(judged),
        "peak_hwm_mb": {label: sampler.peak_hwm_mb(label) for label in sampler.labels()},
        "phases": dict(results),
    }


def write(report: Mapping[str, Any], directory: Path) -> Path:
    """The full report as ``<run_id>.json``, and its headline as ``latest.json`` unless
    :func:`bench.headline.kept` says why the last valid full run's stays."""
    directory.mkdir(parents=True, exist_ok=True)
    options = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
    path = directory / f"{report['run_id']}.json"
    path.write_bytes(orjson.dumps(report, option=options))
    if headline.kept(report) is None:
        latest = headline.latest(report)
        (directory / "latest.json").write_bytes(orjson.dumps(latest, option=options))
    return path


def cpu_cells(usage: Mapping[str, Mapping[str, Any]] | None) -> list[str]:
    """CPU-µs per recipient per column, then untracked ("other") and the whole machine."""
    if not usage:
        return ["-"] * (len(CPU_COLUMNS) + 3)
    cells = []
    for column in CPU_COLUMNS:
        value = sum(
            float(v.get("cpu_us_per_recipient", 0.0))
            for label, v in usage.items()
            if label == column or (column == "client" and label.startswith(CLIENT_PREFIXES))
        )
        cells.append(f"{value:,.0f}" if value else "-")
    system = usage.get(SYSTEM, {})
    machine = system.get("cpu_us_per_recipient")
    untracked = float(system.get("untracked_cpu_s", 0.0))
    per = (float(machine) / float(system["cpu_s"])) if machine and system.get("cpu_s") else 0.0
    cells.append(f"{untracked * per:,.0f}" if machine else "-")
    cells.append(f"{machine:,.0f}" if machine is not None else "-")
    cells.append(f"{system.get('cpu_pct_of_machine', 0):.0f}%" if system else "-")
    return cells


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def round_trips_cell(result: Mapping[str, Any]) -> str:
    """Cassandra round trips per batch (or post) of a phase or step, ``-`` when unknown."""
    ops = result.get("cassandra_ops_per_batch")
    value = ops.get("round_trips") if isinstance(ops, Mapping) else None
    return "-" if value is None else f"{value:,.1f}"


def _row(name: str, result: Mapping[str, Any], **cols: Any) -> list[str]:
    width = 7 + len(CPU_COLUMNS) + 3
    if "error" in result:
        first_line = str(result["error"]).splitlines()[0][:70]
        return [name, f"FAILED: {first_line}", *[""] * (width - 1)]
    return [
        name,
        _fmt(cols.get("batches"), ",.1f"),
        _fmt(cols.get("recipients"), ",.0f"),
        _fmt(cols.get("ratio"), ".2f"),
        _fmt(cols.get("p50"), ".1f"),
        _fmt(cols.get("p99"), ".1f"),
        _fmt(cols.get("p999"), ".1f"),
        round_trips_cell(result),
        *cpu_cells(result.get("usage")),
    ]


def _latency_row(name: str, r: Mapping[str, Any], ratio: float | None = None) -> list[str]:
    lat = r["latency_ms"]
    return _row(
        name,
        r,
        batches=r["ok_per_s"],
        recipients=r["recipients_per_s"],
        ratio=ratio,
        p50=lat["p50"],
        p99=lat["p99"],
        p999=lat["p999"],
    )


def rows(report: Mapping[str, Any]) -> list[list[str]]:
    """The table's rows, header first."""
    p: Mapping[str, Any] = report["phases"]
    f: Mapping[str, Any] = report["figures"]
    out = [
        [
            "phase",
            "batches/s",
            "recipients/s",
            "ratio",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "C* rt/b",
            *(f"{c} µs/r" for c in CPU_COLUMNS),
            "other µs/r",
            "machine µs/r",
            "busy",
        ]
    ]
    for key, name in (("l_accept", "L_accept (A)"), ("l_accept_end", "L_accept (C)")):
        r = p.get(key)
        if r is None:
            continue
        out.append(
            _row(
                name,
                r,
                batches=_get(p, key, "batches_per_s"),
                recipients=_get(p, key, "recipients_per_s") or _get(p, key, "events_per_s"),
            )
        )
    api = p.get("api_max")
    if api is not None and "levels" in api:
        for level in api["levels"]:
            ratio = targets.ratio(level["recipients_per_s"], f["l_accept_rcpt_per_s"])
            out.append(_latency_row(f"API closed c={level['concurrency']}", level, ratio))
    elif api is not None:
        out.append(_row("API closed", api))
    open_phase = p.get("api_open")
    if open_phase is not None and "steps" in open_phase:
        for step, r in open_phase["steps"].items():
            out.append(_latency_row(f"API open {step} ({r['rate']:,.0f}/s)", r))
    elif open_phase is not None:
        out.append(_row("API open", open_phase))
    for key, name, ratio_key in (
        ("l_e2e", "L_e2e N=100", None),
        ("l_e2e_wide", "L_e2e N=100 prefetch 64", None),
        ("e2e", "e2e N=100", "e2e_ratio"),
        ("l_e2e_1000", "L_e2e N=1000", None),
        ("e2e_1000", "e2e N=1000", "e2e_1000_ratio"),
        ("l_webhook", "L_webhook (events)", None),
        ("webhooks_batched", "webhooks batched (events)", "webhooks_batched_ratio"),
        ("webhooks_single", "webhooks single (events)", "webhooks_single_ratio"),
    ):
        if key not in p:
            continue
        out.append(
            _row(
                name,
                p[key],
                recipients=_get(p, key, "recipients_per_s") or _get(p, key, "events_per_s"),
                ratio=f.get(ratio_key) if ratio_key else None,
            )
        )
    return out


def _align(table_rows: list[list[str]]) -> list[str]:
    widths = [
        max(len(row[i]) for row in table_rows if len(row) > i) for i in range(len(table_rows[0]))
    ]
    lines = []
    for row in table_rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=False)]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "-" * max(len(line) for line in lines))
    return lines


def _drift(phases: Mapping[str, Any]) -> str:
    """How each process's CPU per recipient moved between L_accept A and C."""
    first = _get(phases, "l_accept", "usage")
    last = _get(phases, "l_accept_end", "usage")
    if not first or not last:
        return ""
    parts = []
    for label in ("raw-accept", "cassandra", "rabbitmq", SYSTEM):
        a = _get(first, label, "cpu_us_per_recipient")
        c = _get(last, "raw-accept-end" if label == "raw-accept" else label, "cpu_us_per_recipient")
        if a is not None and c is not None:
            name = {"raw-accept": "client", SYSTEM: "machine"}.get(label, label)
            parts.append(f"{name} {a:,.0f} -> {c:,.0f}")
    return ", ".join(parts)


def rate_limit_lines(phases: Mapping[str, Any], figures: Mapping[str, Any]) -> list[str]:
    """The ``rate_limit`` phase's summary, and a loud line when the limiter let more calls
    through than its limit allows."""
    r = phases.get("rate_limit")
    if not isinstance(r, Mapping) or "busiest_ratio" not in r:
        return []
    steady = r.get("sendgrid_steady_per_s")
    offered = _get(r, "unlimited", "offered_per_s")
    lines = [
        f"Rate limit (SendGrid at {r['limit_per_s']:g} calls/s, three consumer processes, "
        f"the flood offering {_fmt(offered, ',.1f')}/s unlimited): busiest second "
        f"{r['sendgrid_busiest_second']} ({_fmt(r['busiest_ratio'], '.2f')} x the limit), "
        f"steady {_fmt(steady, '.1f')}/s ({_fmt(r.get('steady_ratio'), '.2f')} x), "
        f"{_fmt(r.get('spilled_share'), '.0%')} of the calls spilled to Mailgun; consumers + "
        f"Cassandra {_fmt(figures.get('rate_limit_cpu_us_per_call'), ',.0f')} CPU-µs per "
        f"call (unlimited {_fmt(figures.get('rate_limit_unlimited_cpu_us_per_call'), ',.0f')})"
    ]
    if r.get("defect"):
        lines.append(
            "LIMITER DEFECT: SendGrid got more calls than its limit allows (above 1.1 x): "
            "see services/consumers/provider_rates.py"
        )
    return lines


def ops_lines(phases: Mapping[str, Any]) -> list[str]:
    """Each phase's (and step's) Cassandra operations per batch, from ``system_views``."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    for name, r in phases.items():
        if not isinstance(r, Mapping):
            continue
        for key in ("cassandra_ops_per_batch", "cassandra_ops_per_s"):
            if isinstance(r.get(key), Mapping):
                found.append((name, r[key]))
        for level in r.get("levels") or []:
            if isinstance(level, Mapping) and "cassandra_ops_per_batch" in level:
                found.append(
                    (f"{name} c={level.get('concurrency')}", level["cassandra_ops_per_batch"])
                )
        for step, sr in (r.get("steps") or {}).items():
            if isinstance(sr, Mapping) and "cassandra_ops_per_batch" in sr:
                found.append((f"{name} {step}", sr["cassandra_ops_per_batch"]))
    if not found:
        return []
    width = max(len(name) for name, _ in found)
    return [
        "Cassandra operations per batch (system_views, the run's keyspace; webhooks per post, "
        "idle per second):",
        *(f"  {name:<{width}}  {cqlops.summary(ops)}" for name, ops in found),
    ]


def table(report: Mapping[str, Any]) -> str:
    """The summary printed at the end of a run."""
    out = [
        "",
        "Summary: C* rt/b = Cassandra round trips per batch (webhooks: per post); µs/r = "
        "CPU-µs per recipient by process; other = CPU of processes outside the run; busy = "
        "share of all CPUs in use",
        *_align(rows(report)),
        "",
    ]
    best = report["phases"].get("api_max")
    if best and "batches_per_s" in best:
        out.append(
            f"API maximum: {best['batches_per_s']:,.1f} batches/s, "
            f"{best['recipients_per_s']:,.0f} recipients accepted/s at "
            f"c={best['best_concurrency']}"
        )
    out.extend(headline.lines(report["figures"]))
    out.extend(ops_lines(report["phases"]))
    steps = _get(report["phases"], "api_open", "steps") or {}
    for step, r in steps.items():
        gc = r.get("cassandra_gc")
        if gc:
            out.append(
                f"Cassandra GC during API open {step}: {gc['pauses']} pauses, "
                f"{gc['total_ms']:,.0f} ms stopped, longest {gc['max_ms']:,.0f} ms "
                f"(see the per-second timeline in the JSON)"
            )
    out.extend(rate_limit_lines(report["phases"], report["figures"]))
    out.append("Targets:")
    for name, t in report["targets"].items():
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[t["pass"]]
        verdict = "INVALID" if t.get("invalid") else verdict
        value = "-" if t["value"] is None else f"{t['value']:,.3g}"
        out.append(f"  {verdict:<7}  {name:<24} {value:>9} (target {t['target']:g}): {t['rule']}")
    stable = report.get("stable")
    verdict = (
        "not measured"
        if stable is None
        else "stable"
        if stable
        else "UNSTABLE (A and C differ by more than 10%); ratios use their mean"
    )
    out.append(f"Run stability (L_accept A vs C): {verdict}")
    drift = _drift(report["phases"])
    if drift:
        out.append(f"  L_accept CPU-µs per recipient, A -> C: {drift}")
    incomplete = [
        name
        for name, r in report["phases"].items()
        if isinstance(r, Mapping) and (r.get("complete") is False or r.get("stalled"))
    ]
    if incomplete:
        out.append(
            "Incomplete phases (figure from the part done; stalled or timed out): "
            + ", ".join(incomplete)
        )
    noisy = [
        name for name, r in report["phases"].items() if isinstance(r, Mapping) and r.get("noisy")
    ]
    if noisy:
        out.append(f"Noisy phases (>15% of the CPUs used outside the run): {', '.join(noisy)}")
    return "\n".join(out)
