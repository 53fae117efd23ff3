"""The bench's headline: every figure beside its raw baseline from the same run, a pipeline
figure its baseline makes impossible refused, and ``latest.json`` kept from such a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import headline, report
from bench import run as bench_run
from bench.sampler import ProcessSampler

#: Every headline figure and raw baseline of a believable full run.
FULL: dict[str, float | None] = {
    "api_max_rcpt_per_s": 20_000.0,
    "l_accept_rcpt_per_s": 31_600.0,
    "accept_cpu_us_per_rcpt": 45.0,
    "l_accept_cpu_us_per_rcpt": 30.0,
    "p99_ms_at_50pct": 12.0,
    "p99_ms_at_80pct": 30.0,
    "e2e_recipients_per_s": 8_000.0,
    "l_e2e_recipients_per_s": 10_000.0,
    "e2e_1000_recipients_per_s": 9_000.0,
    "l_e2e_1000_recipients_per_s": 12_000.0,
    "e2e_cpu_us_per_rcpt": 60.0,
    "l_e2e_cpu_us_per_rcpt": 40.0,
    "webhooks_batched_events_per_s": 5_000.0,
    "webhooks_single_events_per_s": 2_000.0,
    "l_webhook_events_per_s": 9_000.0,
    "webhook_cpu_us_per_event": 150.0,
    "l_webhook_cpu_us_per_event": 100.0,
    "pipeline_cpu_us_per_rcpt": 405.0,
    "l_pipeline_cpu_us_per_rcpt": 270.0,
    "stats_read_ms_10m": 20.0,
    "stats_read_cold_ms_10m": 30.0,
    "idle_cores": 0.02,
    "rss_mb_api": 80.0,
    "rss_mb_consumers": 90.0,
    "rss_mb_webhooks": 70.0,
}


def _usage(**cpu_us_per_recipient: float) -> dict[str, dict[str, float]]:
    return {name: {"cpu_us_per_recipient": v} for name, v in cpu_us_per_recipient.items()}


def _built(results: dict[str, Any]) -> dict[str, Any]:
    return report.build(
        run_id="r",
        config={},
        stack_info={},
        results=results,
        sampler=ProcessSampler(),
        started=0.0,
        finished=1.0,
    )


def _acceptance(api_rcpt_per_s: float, **api_usage: float) -> dict[str, Any]:
    """L_accept at 31,600 recipients/s (40 CPU-µs each) in phases A and C, and the API."""
    raw = {"batches_per_s": 316.0, "recipients_per_s": 31_600.0}
    level = {
        "concurrency": 32,
        "ok_per_s": api_rcpt_per_s / 100,
        "recipients_per_s": api_rcpt_per_s,
        "latency_ms": {"p50": 5.0, "p99": 9.0, "p999": 12.0},
        "usage": _usage(**api_usage),
    }
    return {
        "l_accept": raw | {"usage": _usage(**{"raw-accept": 20.0, "cassandra": 15.0}, rabbitmq=5)},
        "l_accept_end": raw
        | {"usage": _usage(**{"raw-accept-end": 20.0, "cassandra": 15.0}, rabbitmq=5)},
        "api_max": {
            "batches_per_s": api_rcpt_per_s / 100,
            "recipients_per_s": api_rcpt_per_s,
            "best_concurrency": 32,
            "levels": [level],
        },
    }


def _write(figures: dict[str, float | None], directory: Path) -> bytes | None:
    """``latest.json`` after writing a run of ``figures`` over an earlier one."""
    (directory / "latest.json").write_bytes(b"the last valid run")
    report.write({"run_id": "r", "figures": figures, "targets": {}}, directory)
    return (directory / "latest.json").read_bytes()


# -- the verdict --------------------------------------------------------------------------------


def test_an_api_maximum_above_l_accept_is_refused_and_meets_no_goal() -> None:
    """35k recipients/s beside L_accept's 31.6k (issue 34's 1.11) is invalid, not a PASS."""
    built = _built(_acceptance(35_000.0))

    ratio_goal = built["targets"]["acceptance_vs_l_accept"]
    rate_goal = built["targets"]["api_max_rcpt_per_s"]

    assert ratio_goal["pass"] is None and "above its raw baseline L_accept" in ratio_goal["invalid"]
    assert rate_goal["pass"] is None and rate_goal["invalid"] == ratio_goal["invalid"]
    assert set(built["refused"]) == {"api_max_rcpt_per_s", "acceptance_ratio"}


def test_the_summary_prints_a_refused_figure_as_invalid_with_its_reason() -> None:
    """The headline line of a refused figure is followed by INVALID and why."""
    summary = report.table(_built(_acceptance(35_000.0)))

    assert (
        "INVALID: 35,000.0 recipients/s is above its raw baseline L_accept 31,600.0 from the "
        "same run (ratio 1.11)" in summary
    )
    assert "INVALID  acceptance_vs_l_accept" in summary


def test_acceptance_cheaper_in_cpu_than_l_accept_is_refused() -> None:
    """API + Cassandra + RabbitMQ at 30 CPU-µs per recipient beside L_accept's 40 is invalid."""
    built = _built(_acceptance(20_000.0, api=10.0, cassandra=15.0, rabbitmq=5.0))

    goal = built["targets"]["accept_cpu_us_per_rcpt"]

    assert goal["pass"] is None and "below its raw baseline L_accept 40.0" in goal["invalid"]
    assert set(built["refused"]) == {"accept_cpu_us_per_rcpt", "accept_cpu_ratio"}


def test_acceptance_cpu_is_not_judged_without_the_baselines_cpu() -> None:
    """Without Cassandra's CPU in L_accept's windows there is no baseline to be below."""
    results = _acceptance(20_000.0, api=10.0, cassandra=15.0, rabbitmq=5.0)
    results["l_accept"]["usage"] = _usage(**{"raw-accept": 20.0}, rabbitmq=5.0)
    results["l_accept_end"]["usage"] = _usage(**{"raw-accept-end": 20.0}, rabbitmq=5.0)

    built = _built(results)

    assert built["refused"] == {}
    assert built["targets"]["accept_cpu_us_per_rcpt"]["pass"] is True


def test_a_pipeline_exactly_at_its_baseline_is_believed() -> None:
    """A ratio of 1.0 (throughput) or 1.0 (CPU) is the bound itself, not beyond it."""
    figures = FULL | {"api_max_rcpt_per_s": 31_600.0, "accept_cpu_us_per_rcpt": 30.0}

    assert headline.refusals(figures) == {}


@pytest.mark.parametrize(
    ("figure", "baseline", "ratio"),
    [
        ("e2e_recipients_per_s", "l_e2e_recipients_per_s", "e2e_ratio"),
        ("e2e_1000_recipients_per_s", "l_e2e_1000_recipients_per_s", "e2e_1000_ratio"),
        ("webhooks_batched_events_per_s", "l_webhook_events_per_s", "webhooks_batched_ratio"),
        ("webhooks_single_events_per_s", "l_webhook_events_per_s", "webhooks_single_ratio"),
    ],
)
def test_end_to_end_and_webhooks_above_their_baseline_are_refused(
    figure: str, baseline: str, ratio: str
) -> None:
    """A drain or an ingest faster than its raw loop is refused, with its ratio figure."""
    figures = FULL | {figure: float(FULL[baseline] or 0) * 1.01}

    assert set(headline.refusals(figures)) == {figure, ratio}


def test_a_refused_figure_gives_the_run_its_own_exit_status() -> None:
    """3 when a figure was refused, whatever else failed; 1 for a failed phase; else 0."""
    assert bench_run.exit_status(failed=False, refused=True) == 3
    assert bench_run.exit_status(failed=True, refused=True) == 3
    assert bench_run.exit_status(failed=True, refused=False) == 1
    assert bench_run.exit_status(failed=False, refused=False) == 0


# -- every figure beside its baseline -----------------------------------------------------------


def test_latest_json_carries_each_headline_figure_beside_its_baseline(tmp_path: Path) -> None:
    """Each headline figure is {value, baseline, ratio}; memory and latency have no baseline."""
    latest = orjson.loads(_write(FULL, tmp_path) or b"")

    assert set(headline.LATEST_KEYS) <= set(latest)
    assert latest["api_max_rcpt_per_s"] == {
        "value": 20_000.0,
        "baseline": 31_600.0,
        "ratio": pytest.approx(0.633, abs=1e-3),
    }
    assert latest["accept_cpu_us_per_rcpt"] == {"value": 45.0, "baseline": 30.0, "ratio": 1.5}
    assert latest["p99_ms_at_50"] == {"value": 12.0, "baseline": None, "ratio": None}
    assert latest["rss_mb"]["api"] == {"value": 80.0, "baseline": None, "ratio": None}
    assert latest["idle_cores"] == {"value": 0.02, "baseline": None, "ratio": None}


def test_the_summary_prints_each_headline_figure_beside_its_baseline() -> None:
    """The summary's headline names each figure's raw baseline and the ratio to it."""
    lines = headline.lines(FULL)

    assert any(
        line.split()[:2] == ["api_max_rcpt_per_s", "20,000.0"]
        and line.endswith("L_accept 31,600.0, ratio 0.63")
        for line in lines
    )
    assert any(line.endswith("L_e2e 40.0, ratio 1.50") for line in lines)
    assert not any("INVALID" in line for line in lines)


# -- latest.json ----------------------------------------------------------------------------------


def test_an_invalid_run_leaves_the_last_valid_headline_alone(tmp_path: Path) -> None:
    """A run whose API outran L_accept writes its own report but not latest.json."""
    assert _write(FULL | {"api_max_rcpt_per_s": 35_000.0}, tmp_path) == b"the last valid run"
    assert (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "baseline", ["l_accept_rcpt_per_s", "l_accept_cpu_us_per_rcpt", "l_webhook_events_per_s"]
)
def test_a_run_without_its_baselines_leaves_the_last_valid_headline_alone(
    tmp_path: Path, baseline: str
) -> None:
    """A headline figure with no raw baseline beside it (a subset of phases) is not a headline."""
    assert _write(FULL | {baseline: None}, tmp_path) == b"the last valid run"


@pytest.mark.parametrize(
    "figure",
    [
        "stats_read_ms_10m",
        "stats_read_cold_ms_10m",
        "e2e_cpu_us_per_rcpt",
        "rss_mb_api",
        "idle_cores",
    ],
)
def test_a_run_of_some_phases_leaves_the_last_valid_headline_alone(
    tmp_path: Path, figure: str
) -> None:
    """A run that did not measure a headline figure leaves the last full run's headline."""
    assert _write(FULL | {figure: None}, tmp_path) == b"the last valid run"


def test_a_believable_full_run_replaces_the_headline(tmp_path: Path) -> None:
    """A full run within every baseline is the new latest.json, and says nothing is kept."""
    assert _write(FULL, tmp_path) != b"the last valid run"
    assert headline.kept({"figures": FULL}) is None
