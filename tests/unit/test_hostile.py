"""``make hostile``'s pure parts: the verdicts on ratios, stalls and memory, a parser row,
the table and the summary line, reading the stall monitor's metrics, and the hostile inputs
themselves (each fits the limit of what it is sent to, and 10x is ten times the input)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bench.hostile import cases, measure, parsers, payloads, report, scrape, targets
from services.api.templates import BODY_LIMIT
from services.webhooks.receivers import MAILGUN_MAX_BODY, MAX_BODY
from shared.infra.config import ApiSettings, Settings
from shared.infra.stall_monitor import StallMetrics
from shared.templates.template_limits import MAX_SOURCE

#: The memory limits of the default settings.
LIMITS = targets.rss_limits(Settings())

Timing = targets.Timing


def test_a_linear_parser_passes_with_its_ratio() -> None:
    """10x the input in 9.5x the time is within the target."""
    verdict = targets.judge_parser(Timing(0.2, "ok"), Timing(1.9, "ok"), timeout=20)

    assert verdict["pass"] is True
    assert verdict["ratio"] == pytest.approx(9.5)


def test_a_quadratic_parser_fails_with_its_ratio() -> None:
    """10x the input in 75x the time is over the target of 15."""
    verdict = targets.judge_parser(Timing(0.09, "ok"), Timing(6.8, "ok"), timeout=20)

    assert verdict["pass"] is False
    assert verdict["ratio"] == pytest.approx(75.6, abs=0.1)


def test_a_10x_that_timed_out_fails_with_a_lower_bound_on_its_ratio() -> None:
    """A 10x stopped at the timeout fails, its ratio at least timeout / the 1x time."""
    verdict = targets.judge_parser(Timing(0.25, "ok"), Timing(None, "timeout"), timeout=20)

    assert verdict == {"ratio": 80.0, "ratio_at_least": True, "target": 15.0, "pass": False}


def test_a_10x_under_the_noise_floor_passes_whatever_its_ratio() -> None:
    """A refusal in microseconds at both sizes passes, though its ratio is over 15."""
    verdict = targets.judge_parser(Timing(0.0001, "refused"), Timing(0.004, "refused"), timeout=20)

    assert verdict["pass"] is True
    assert verdict["ratio"] == pytest.approx(40.0)


def test_a_1x_that_timed_out_fails_and_one_that_errored_is_not_judged() -> None:
    """A timeout at 1x is a failure; a measuring process that died gives no verdict."""
    timed_out = targets.judge_parser(Timing(None, "timeout"), Timing(None, "not run"), timeout=20)
    errored = targets.judge_parser(Timing(None, "error"), Timing(None, "not run"), timeout=20)

    assert timed_out["pass"] is False
    assert errored["pass"] is None


def test_a_service_over_its_stall_target_and_rss_limit_fails_both() -> None:
    """A 3.2 s stall and 1.5 GB fail the 100 ms target and a 192 MB limit."""
    verdict = targets.judge_service(3.2, 1500.0, answered=True, limit=192)

    assert verdict["stall_s"]["pass"] is False
    assert verdict["rss_mb"] == {"value": 1500.0, "target": 192, "pass": False}


def test_a_service_within_its_targets_passes() -> None:
    """A 40 ms stall and 80 MB pass."""
    verdict = targets.judge_service(0.04, 80.0, answered=True, limit=100)

    assert (verdict["stall_s"]["pass"], verdict["rss_mb"]["pass"]) == (True, True)


def test_a_service_that_never_answered_fails_its_stall_without_a_figure() -> None:
    """No answer within the scrape's timeout is a failed stall with no value."""
    verdict = targets.judge_service(None, None, answered=False, limit=128)

    assert verdict["stall_s"] == {"value": None, "target": 0.1, "pass": False}
    assert verdict["rss_mb"]["pass"] is None


def test_every_service_is_judged_by_the_memory_limit_its_settings_configure() -> None:
    """Each service of the stack has a limit, and it is its own memory_max_mb setting."""
    settings = Settings(api=ApiSettings(memory_max_mb=300))

    limits = targets.rss_limits(settings)

    assert set(limits) == set(targets.SERVICES)
    assert limits["api"] == 300
    assert limits["hooks"] == settings.hooks.memory_max_mb


def test_violations_count_only_failures() -> None:
    """Passes and verdicts without a figure are not violations."""
    found: list[dict[str, bool | None]] = [
        {"pass": True},
        {"pass": False},
        {"pass": None},
        {"pass": False},
    ]

    assert targets.violations(found) == 2


def test_a_row_reports_a_10x_timeout_and_the_1x_figure() -> None:
    """A case whose 10x timed out has its 1x time, a 10x timeout and a failed verdict."""
    case = cases.by_name("link rewrite")
    found = parsers.row(
        case,
        {1: {"seconds": 0.25, "outcome": "ok", "peak_mb": 98.0}},
        {1: 30_000, 10: 300_000},
        timeout=20,
        missing="timeout",
    )

    assert found["seconds"] == {"1x": 0.25, "10x": None}
    assert found["outcome"] == {"1x": "ok", "10x": "timeout"}
    assert (found["ratio"], found["ratio_at_least"], found["pass"]) == (80.0, True, False)


def test_a_row_after_a_1x_timeout_says_the_10x_was_not_run() -> None:
    """The scale after the one that timed out is reported as not run."""
    found = parsers.row(cases.CASES[0], {}, {1: 30_000}, timeout=20, missing="timeout")

    assert found["outcome"] == {"1x": "timeout", "10x": "not run"}
    assert found["pass"] is False


def _report() -> dict[str, Any]:
    row = parsers.row(
        cases.by_name("link rewrite"),
        {1: {"seconds": 0.25, "outcome": "ok", "peak_mb": 98.0}},
        {1: 30_000, 10: 300_000},
        timeout=20,
        missing="timeout",
    )
    scraped: dict[str, dict[str, Any]] = {
        "api": {"stall_s": 3.2, "rss_mb": 1500.0, "answered": True},
        "consumers": {"stall_s": None, "rss_mb": None, "answered": False, "problem": "no answer"},
        "hooks": {"stall_s": 0.02, "rss_mb": None, "answered": True, "sampled_hwm_mb": 70.0},
    }
    found: dict[str, Any] = {
        "run_id": "hostile-x",
        "parsers": [row],
        "stack": {
            "services": report.services(scraped, {"api": {"stall_s": 0.01}}, LIMITS),
            "attacks": {
                "click tracking": {
                    "requests": 2,
                    "statuses": {"202": 1},
                    "slowest_s": 61.0,
                    "errors": [],
                }
            },
        },
        "errors": [],
    }
    found["violations"] = targets.violations(report.verdicts(found))
    return found


def test_violations_of_a_report_count_parsers_stalls_and_rss() -> None:
    """One parser over its ratio, the API's stall and RSS, the silent consumers: four."""
    assert _report()["violations"] == 4


def test_a_service_without_the_rss_gauge_is_judged_on_the_sampled_peak() -> None:
    """The peak RSS sampled from /proc stands in when /metrics has none."""
    services = report.services(
        {"hooks": {"stall_s": 0.02, "rss_mb": None, "answered": True, "sampled_hwm_mb": 70.0}},
        {},
        LIMITS,
    )

    assert services["hooks"]["rss_mb"]["value"] == 70.0


def test_the_table_shows_each_figure_beside_its_target() -> None:
    """The table names the timeout, the ratio's bound, the failing service and the count."""
    text = report.table(_report())

    assert "timeout (> 20 s)" in text
    assert "> 80" in text
    assert "FAIL: stall, RSS" in text
    assert "no answer" in text
    assert text.splitlines()[-1] == "violations: 4"


def test_the_summary_line_is_json_with_the_headline_figures() -> None:
    """The last line carries the worst ratio, every stall and RSS, and the violations."""
    line = orjson.dumps(report.summary(_report(), None))
    found = orjson.loads(line)

    assert found["violations"] == 4
    assert found["worst_ratio"] == 80.0
    assert found["max_stall_s"] == {"api": 3.2, "consumers": None, "hooks": 0.02}
    assert found["parsers_over_ratio"] == 1


def test_a_parser_under_the_noise_floor_does_not_make_the_worst_ratio() -> None:
    """1 us at 1x and 400 us at 10x reads 400 and passes: the headline keeps the judged 80."""
    found = _report()
    quick = parsers.row(
        cases.by_name("webhook email"),
        {
            1: {"seconds": 1e-6, "outcome": "ok", "peak_mb": 96.0},
            10: {"seconds": 4e-4, "outcome": "ok", "peak_mb": 96.0},
        },
        {1: 100_000, 10: 1_000_000},
        timeout=20,
        missing="timeout",
    )
    found["parsers"] = [*found["parsers"], quick]

    assert quick["pass"] is True
    assert report.summary(found, None)["worst_ratio"] == 80.0


def test_the_figures_are_read_from_a_services_metrics_page() -> None:
    """The longest stall and the peak RSS (in MB) come from the monitor's metrics."""
    registry = CollectorRegistry()
    metrics = StallMetrics.create(registry, peak_rss=lambda: 150 * 1024 * 1024)
    metrics.longest.set(2.5)

    assert scrape.figures(generate_latest(registry).decode()) == (2.5, 150.0)


def test_the_longest_stalls_wait_for_a_cpu_is_read_and_shown_beside_it() -> None:
    """The monitor's CPU wait of the longest stall reaches the service's row in the table."""
    registry = CollectorRegistry()
    metrics = StallMetrics.create(registry)
    metrics.longest.set(0.12)
    metrics.longest_cpu_wait.set(0.09)
    waited = scrape.cpu_wait(generate_latest(registry).decode())
    scraped = {
        "api": {"stall_s": 0.12, "rss_mb": 150.0, "answered": True, "stall_cpu_wait_s": waited}
    }

    row = report.service_lines(report.services(scraped, {}, {"api": 192.0}))[-1]

    assert waited == 0.09
    assert row.split()[:4] == ["api", "-", "0.120", "0.090"]


def test_a_page_without_the_monitor_gives_no_figures() -> None:
    """A service without the monitor gives None for both."""
    assert scrape.figures("process_resident_memory_bytes 1e+07\n") == (None, None)


def test_a_refusal_is_timed_and_named() -> None:
    """A parser that raises is measured all the same, its outcome naming the exception."""

    def refuse(_: object) -> None:
        raise ValueError("no")

    seconds, outcome = measure.timed(refuse, "x")

    assert outcome == "refused (ValueError)"
    assert seconds >= 0


def test_a_parse_is_timed_at_least_three_times_however_long_it_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every run already past the total the runs stop at, the best of three is still taken."""
    monkeypatch.setattr(measure, "MIN_TOTAL", 0.0)
    runs: list[object] = []

    measure.timed(runs.append, "x")

    assert len(runs) == measure.MIN_RUNS == 3


def test_case_names_are_unique() -> None:
    """Each case is found by its name."""
    names = [case.name for case in cases.CASES]

    assert len(names) == len(set(names))


@pytest.mark.parametrize("case", cases.CASES, ids=lambda case: case.name)
def test_ten_times_the_scale_is_about_ten_times_the_input(case: cases.Case) -> None:
    """Every case's 10x input is 8 to 12 times its 1x input."""
    ratio = case.size(case.build(10), 10) / case.size(case.build(1), 1)

    assert 8 <= ratio <= 12


def test_each_hostile_request_fits_the_limit_it_is_sent_to() -> None:
    """The hostile requests are refused for their content, never for their size: every one
    is within the body limit of its route (and the template sources within MAX_SOURCE)."""
    signature = {"timestamp": "1", "token": "t", "signature": "s"}
    templates = [
        payloads.int_bomb_template(),
        payloads.memory_bomb_template(),
        payloads.compile_bomb_template(),
        payloads.markers_template(),
    ]
    max_body = ApiSettings().max_body_bytes

    assert len(orjson.dumps(payloads.large_substitutions_batch(0))) <= max_body
    assert len(orjson.dumps(payloads.mailgun_batch())) <= max_body
    assert len(payloads.sendgrid_webhook()) <= MAX_BODY
    assert len(payloads.mailgun_webhook(signature)) <= MAILGUN_MAX_BODY
    assert all(len(t["html"]) <= MAX_SOURCE for t in templates)
    assert all(len(orjson.dumps(t)) <= BODY_LIMIT for t in templates)
    assert len(payloads.csv_file()) <= 50 * 1024 * 1024


def test_the_table_lists_the_server_errors_of_a_hostile_request() -> None:
    """A 5xx answer to a hostile request is listed under the requests with its route."""
    found = _report()
    attacks = found["stack"]["attacks"]
    attacks["click tracking"]["server_errors"] = ["POST /v1/batches: 500 Batch too large"]

    assert "  click tracking: POST /v1/batches: 500 Batch too large" in report.table(found)
