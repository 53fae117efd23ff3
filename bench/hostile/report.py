"""The report of ``make hostile``: its JSON, the table it prints and the one-line summary
(pure, but for :func:`write`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.hostile import targets

#: Share of all CPUs in use before the run above which its stalls are flagged as inflated.
BUSY = 0.2


def services(
    scraped: Mapping[str, Mapping[str, Any]],
    baseline: Mapping[str, Mapping[str, Any]],
    limits: Mapping[str, float],
) -> dict[str, dict[str, Any]]:
    """Each service's verdicts from its scrape after the attacks (``stall_s``, ``rss_mb``,
    ``answered``, ``problem``; ``sampled_hwm_mb`` from /proc stands in for a missing RSS),
    judged against its memory limit in ``limits``, with the figures it had before them."""
    out: dict[str, dict[str, Any]] = {}
    for name, found in scraped.items():
        rss = found.get("rss_mb")
        if rss is None:
            rss = found.get("sampled_hwm_mb")
        judged = targets.judge_service(
            found.get("stall_s"),
            rss,
            answered=bool(found.get("answered")),
            limit=limits.get(name),
        )
        out[name] = {
            **judged,
            "answered": bool(found.get("answered")),
            "stall_cpu_wait_s": found.get("stall_cpu_wait_s"),
            "problem": found.get("problem"),
            "before_attacks": dict(baseline.get(name, {})),
        }
    return out


def verdicts(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every judged figure of a report: each parser's ratio, each service's stall and RSS."""
    found: list[Mapping[str, Any]] = list(report.get("parsers", []))
    for service in (report.get("stack") or {}).get("services", {}).values():
        found += [service["stall_s"], service["rss_mb"]]
    return found


def _judged(parser: Mapping[str, Any]) -> bool:
    ten = (parser.get("seconds") or {}).get("10x")
    return bool(parser.get("ratio_at_least")) or ten is None or ten > targets.NOISE_FLOOR


def summary(report: Mapping[str, Any], path: Path | None) -> dict[str, Any]:
    """The last line: the headline figures, the violations and where the JSON is. The worst
    ratio is of the parsers judged by theirs: one that took under the noise floor at 10x
    (microseconds, where a cache's size sways the ratio) passes whatever it reads."""
    parsers = report.get("parsers", [])
    ratios = [p["ratio"] for p in parsers if p.get("ratio") is not None and _judged(p)]
    stack = report.get("stack") or {}
    return {
        "parsers": len(parsers),
        "parsers_over_ratio": sum(1 for p in parsers if p.get("pass") is False),
        "worst_ratio": round(max(ratios), 1) if ratios else None,
        "max_stall_s": {
            name: s["stall_s"]["value"] for name, s in stack.get("services", {}).items()
        },
        "peak_rss_mb": {
            name: s["rss_mb"]["value"] for name, s in stack.get("services", {}).items()
        },
        "violations": report.get("violations"),
        "harness_errors": len(report.get("errors", [])),
        "results": None if path is None else str(path),
    }


def write(report: Mapping[str, Any], directory: Path) -> Path:
    """The report as ``<run_id>.json`` and as ``latest.json`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    data = orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    path = directory / f"{report['run_id']}.json"
    path.write_bytes(data)
    (directory / "latest.json").write_bytes(data)
    return path


# -- the table ------------------------------------------------------------------------------


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    if value >= 1024 * 1024:
        return f"{value / 1024 / 1024:.1f} MB"
    return f"{value / 1024:.0f} KB" if value >= 1024 else f"{value} B"


def _seconds(value: float | None, outcome: str, timeout: float) -> str:
    if value is not None:
        return f"{value:.3f}"
    if outcome == "timeout":
        return f"timeout (> {timeout:.0f} s)"
    return outcome


def _verdict(passed: bool | None) -> str:
    return {True: "pass", False: "FAIL", None: "-"}[passed]


def _ratio(row: Mapping[str, Any]) -> str:
    ratio = row.get("ratio")
    if ratio is None:
        return "-"
    return f"> {ratio:.0f}" if row.get("ratio_at_least") else f"{ratio:.1f}"


def _grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(r)).rstrip()
        for r in [header, *rows]
    ]


def parser_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    header = ["parser", "1x input", "1x CPU s", "10x input", "10x CPU s", "ratio", "target"]
    header += ["verdict", "peak MB"]
    cells = [
        [
            r["name"],
            _size(r["bytes"]["1x"]),
            _seconds(r["seconds"]["1x"], r["outcome"]["1x"], r["timeout_s"]),
            _size(r["bytes"]["10x"]),
            _seconds(r["seconds"]["10x"], r["outcome"]["10x"], r["timeout_s"]),
            _ratio(r),
            f"<= {targets.RATIO_TARGET:.0f}",
            _verdict(r["pass"]),
            "-" if r.get("peak_mb") is None else f"{r['peak_mb']:.0f}",
        ]
        for r in rows
    ]
    return _grid(header, cells)


def service_lines(found: Mapping[str, Mapping[str, Any]]) -> list[str]:
    header = ["service", "stall s before", "max stall s", "of it CPU wait", "target"]
    header += ["peak RSS MB", "limit"]
    header += ["verdict", "note"]
    cells = []
    for name, s in found.items():
        stall, rss = s["stall_s"], s["rss_mb"]
        before = s.get("before_attacks", {}).get("stall_s")
        waited = s.get("stall_cpu_wait_s")
        failed = [what for what, v in (("stall", stall), ("RSS", rss)) if v["pass"] is False]
        unjudged = stall["pass"] is None or rss["pass"] is None
        verdict = "FAIL: " + ", ".join(failed) if failed else ("-" if unjudged else "pass")
        cells.append(
            [
                name,
                "-" if before is None else f"{before:.3f}",
                "-" if stall["value"] is None else f"{stall['value']:.3f}",
                "-" if waited is None else f"{waited:.3f}",
                f"<= {stall['target']}",
                "-" if rss["value"] is None else f"{rss['value']:.0f}",
                "-" if rss["target"] is None else f"<= {rss['target']:.0f}",
                verdict,
                s.get("problem") or "",
            ]
        )
    return _grid(header, cells)


def attack_lines(attacks: Mapping[str, Mapping[str, Any]]) -> list[str]:
    header = ["hostile input", "requests", "answers", "slowest s", "no answer"]
    cells = [
        [
            name,
            str(a["requests"]),
            " ".join(f"{k}:{v}" for k, v in a["statuses"].items()) or "-",
            f"{a['slowest_s']:.1f}",
            str(len(a["errors"])) if a["errors"] else "",
        ]
        for name, a in attacks.items()
    ]
    return _grid(header, cells)


def table(report: Mapping[str, Any]) -> str:
    """The printed summary: the parser table, the services' figures, the hostile requests."""
    lines = []
    if report.get("parsers"):
        lines += [
            f"== parsers: 1x and 10x in one run (CPU seconds; a 10x under "
            f"{targets.NOISE_FLOOR} s passes whatever its ratio; peak MB: the measuring "
            "process) ==",
            *parser_lines(report["parsers"]),
        ]
    stack = report.get("stack") or {}
    if stack.get("services"):
        lines += [
            "",
            f"== services after every hostile input (stall <= {targets.STALL_TARGET} s, "
            "RSS <= its limit) ==",
            *service_lines(stack["services"]),
        ]
    if stack.get("attacks"):
        lines += ["", "== hostile requests ==", *attack_lines(stack["attacks"])]
        for name, found in stack["attacks"].items():
            lines += [f"  {name}: {error}" for error in found.get("server_errors", [])[:3]]
    busy = report.get("machine", {}).get("busy_before")
    if busy is not None and busy > BUSY:
        lines.append(
            f"WARNING: the machine was {busy:.0%} busy before the run: stalls include the "
            "time a process waited for a CPU"
        )
    for error in report.get("errors", []):
        lines.append(f"HARNESS ERROR: {error}")
    lines.append(f"violations: {report.get('violations')}")
    return "\n".join(lines)
