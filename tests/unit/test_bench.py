"""The benchmark's pure parts: statistics, the open-loop schedule, goals, /proc parsing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from cassandra.util import uuid_from_time

from bench import gclog, procfs, report, stats, targets
from bench.cleanup import stale
from bench.experiments import NAMES, sitecustomize
from bench.phases import Phase, plan
from bench.phases.dispatch import corpus_batches
from bench.phases.lanes import time_to_provider, transactional_body
from bench.phases.ratelimit import in_force, limit_figures
from bench.sampler import value_at
from bench.schedule import RateSchedule
from bench.workload import LOG_ID_NODE, log_ids

# -- percentiles and summaries ---------------------------------------------------------------


def test_percentile_of_one_value_is_that_value() -> None:
    """Every percentile of a single value is the value."""
    assert stats.percentile([7.0], 99.9) == 7.0


def test_percentile_interpolates_between_ranks() -> None:
    """Percentiles interpolate linearly between neighbouring ranks, as numpy does."""
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert stats.percentile(values, 50) == pytest.approx(5.5)
    assert stats.percentile(values, 90) == pytest.approx(9.1)


def test_percentile_extremes_are_min_and_max() -> None:
    """The 0th and 100th percentiles are the smallest and largest values."""
    values = [1.0, 2.0, 40.0]
    assert stats.percentile(values, 0) == 1.0
    assert stats.percentile(values, 100) == 40.0


def test_p99_of_1000_values_sees_the_slowest_ten() -> None:
    """p99 of 990 fast and 10 slow requests lands among the slow ones."""
    values = sorted([1.0] * 990 + [100.0] * 10)
    assert stats.percentile(values, 99) > 1.0
    assert stats.percentile(values, 99.9) == 100.0


def test_percentile_refuses_no_values() -> None:
    """A percentile of nothing is an error, not zero."""
    with pytest.raises(ValueError, match="no values"):
        stats.percentile([], 50)


def test_percentile_refuses_out_of_range_q() -> None:
    """q must lie within 0-100."""
    with pytest.raises(ValueError, match="0-100"):
        stats.percentile([1.0], 101)


def test_latency_summary_sorts_its_input() -> None:
    """The summary does not depend on the order latencies arrived in."""
    summary = stats.latency_summary([3.0, 1.0, 2.0])
    assert (summary["min"], summary["p50"], summary["max"], summary["count"]) == (1.0, 2.0, 3.0, 3)


def test_latency_summary_of_nothing_has_no_figures() -> None:
    """An empty summary reports count 0 and None for every figure."""
    summary = stats.latency_summary([])
    assert summary["count"] == 0
    assert summary["p99"] is None and summary["mean"] is None


def test_spread_window_brackets_the_middle_of_a_drain() -> None:
    """The 10%-90% window of 11 evenly spaced events runs from the 2nd to the 10th."""
    assert stats.spread_window([float(t) for t in range(11)], 0.1, 0.9) == (1.0, 9.0)


def test_window_count_is_half_open() -> None:
    """Events exactly at the window's end belong to the next window."""
    assert stats.window_count([0.0, 1.0, 2.0], 0.0, 2.0) == 2


# -- open-loop schedule ----------------------------------------------------------------------


def test_schedule_spaces_requests_evenly() -> None:
    """At 200/s request i is due 5 ms after request i-1, whatever happened before."""
    schedule = RateSchedule(rate=200.0, start=10.0)
    assert [schedule.at(i) for i in range(3)] == pytest.approx([10.0, 10.005, 10.010])


def test_schedule_counts_requests_in_a_duration() -> None:
    """A 10 s window at 123/s holds 1,230 requests."""
    assert RateSchedule(rate=123.0, start=0.0).count(10.0) == 1230


def test_schedule_due_by_includes_a_request_due_exactly_now() -> None:
    """A request due at exactly ``now`` is due (no off-by-one at the boundary)."""
    schedule = RateSchedule(rate=10.0, start=5.0)
    assert schedule.due_by(5.0) == 1
    assert schedule.due_by(5.3) == 4


def test_schedule_nothing_is_due_before_the_start() -> None:
    """Nothing is due before the schedule starts."""
    assert RateSchedule(rate=10.0, start=5.0).due_by(4.99) == 0


def test_schedule_catches_up_after_a_stall() -> None:
    """After a 1 s stall every request of that second is due at once (open loop)."""
    schedule = RateSchedule(rate=100.0, start=0.0)
    assert schedule.due_by(1.0) - schedule.due_by(0.0) == 100


def test_schedule_refuses_a_zero_rate() -> None:
    """A rate of zero has no schedule."""
    with pytest.raises(ValueError, match="positive"):
        RateSchedule(rate=0.0, start=0.0)


# -- ratios, goals and stability -------------------------------------------------------------


def test_ratio_divides_the_figure_by_its_limit() -> None:
    """3 against a limit of 4 is a ratio of 0.75."""
    assert targets.ratio(3.0, 4.0) == 0.75


@pytest.mark.parametrize("limit", [None, 0.0])
def test_ratio_is_none_without_a_limit(limit: float | None) -> None:
    """A ratio to a missing or zero limit is not a number."""
    assert targets.ratio(5.0, limit) is None


def test_reference_is_the_mean_of_both_measurements() -> None:
    """The limit a ratio refers to averages phases A and C."""
    assert targets.reference(100.0, 90.0) == 95.0


def test_reference_uses_the_one_measurement_there_is() -> None:
    """Without phase A (or C) the other measurement is the limit."""
    assert targets.reference(None, 90.0) == 90.0


def test_acceptance_ratio_at_the_bound_passes() -> None:
    """0.6 x L_accept exactly meets the acceptance goal."""
    result = targets.evaluate({"acceptance_ratio": 0.6})["acceptance_vs_l_accept"]
    assert result == {
        "value": 0.6,
        "target": 0.6,
        "pass": True,
        "rule": targets.GOALS["acceptance_vs_l_accept"].rule,
    }


def test_latency_above_the_bound_fails() -> None:
    """A p99 of 20.5 ms at 50% load misses the 20 ms goal."""
    assert targets.evaluate({"p99_ms_at_50pct": 20.5})["p99_ms_at_50pct"]["pass"] is False


def test_missing_figure_is_not_judged() -> None:
    """A goal whose phase did not run is neither passed nor failed."""
    result = targets.evaluate({})["e2e_vs_l_e2e"]
    assert result["value"] is None and result["pass"] is None


def test_each_python_service_has_a_memory_goal() -> None:
    """The API and the consumers are each held to 100 MB."""
    judged = targets.evaluate({"rss_mb_api": 39.0, "rss_mb_consumers": 120.0})
    assert judged["rss_mb_api"]["pass"] is True
    assert judged["rss_mb_consumers"]["pass"] is False


def test_all_passed_ignores_unjudged_goals() -> None:
    """Unjudged goals neither pass nor fail the run."""
    assert targets.all_passed({"a": {"pass": True}, "b": {"pass": None}}) is True


def test_all_passed_is_none_when_nothing_was_judged() -> None:
    """A run that judged no goal has no verdict."""
    assert targets.all_passed({"a": {"pass": None}}) is None


def test_runs_within_ten_percent_are_stable() -> None:
    """L_accept 200 at the start and 185 at the end (7.5% apart) is a stable run."""
    assert stats.stability(200.0, 185.0)["stable"] is True


def test_runs_more_than_ten_percent_apart_are_unstable() -> None:
    """L_accept 200 then 170 (15% apart) flags the run as unstable."""
    result = stats.stability(200.0, 170.0)
    assert result["stable"] is False
    assert result["difference"] == pytest.approx(0.15)


# -- /proc parsing ---------------------------------------------------------------------------

_STAT = (
    "4242 (python (bench) x) S 1 4242 4242 0 -1 4194560 2000 0 0 0 "
    "1234 567 0 0 20 0 3 0 100 1000000 2500 18446744073709551615"
)


def test_parse_stat_reads_utime_and_stime_after_an_odd_command_name() -> None:
    """utime and stime are found even when the command name has spaces and parentheses."""
    cpu = procfs.parse_stat(_STAT)
    assert (cpu.utime, cpu.stime) == (1234, 567)


def test_cpu_seconds_divide_ticks_by_the_clock_rate() -> None:
    """1,234 + 567 ticks at 100 Hz are 18.01 s of CPU."""
    assert procfs.parse_stat(_STAT).seconds(100) == pytest.approx(18.01)


def test_parse_status_reads_rss_and_peak_in_kb() -> None:
    """VmRSS and VmHWM come out in kB."""
    text = "Name:\tpython\nVmPeak:\t  900000 kB\nVmHWM:\t   81234 kB\nVmRSS:\t   70000 kB\n"
    memory = procfs.parse_status(text)
    assert (memory.rss_kb, memory.hwm_kb) == (70000, 81234)


def test_parse_status_of_a_kernel_thread_is_zero() -> None:
    """Kernel threads have no VmRSS line; their memory reads as 0."""
    assert procfs.parse_status("Name:\tkthreadd\nState:\tS (sleeping)\n").rss_kb == 0


def test_parse_system_stat_excludes_idle_and_iowait_from_busy() -> None:
    """Busy ticks are the total minus idle and iowait."""
    text = "cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n"
    assert procfs.parse_system_stat(text) == (160, 1000)


def test_parse_system_stat_needs_the_aggregate_line() -> None:
    """A /proc/stat without the aggregate cpu line is refused."""
    with pytest.raises(ValueError, match="aggregate"):
        procfs.parse_system_stat("cpu0 1 2 3 4 5 6 7 8\n")


# -- sampler interpolation, corpus sizing, phase plan ------------------------------------------


def test_value_at_interpolates_cumulative_cpu() -> None:
    """CPU halfway between two samples is halfway between their values."""
    assert value_at([0.0, 1.0], [2.0, 4.0], 0.5) == pytest.approx(3.0)


def test_value_at_clamps_outside_the_samples() -> None:
    """Before the first and after the last sample the series is flat."""
    assert value_at([1.0, 2.0], [5.0, 6.0], 0.0) == 5.0
    assert value_at([1.0, 2.0], [5.0, 6.0], 9.0) == 6.0


def test_corpus_lasts_the_intended_seconds() -> None:
    """At 10k recipients/s, a 20 s drain of N=100 batches needs 2,000 batches."""
    assert corpus_batches(10_000.0, 20.0, 100, 20, 1_000_000) == 2000


def test_corpus_is_bounded_both_ways() -> None:
    """A tiny rate still gets the minimum corpus; a huge one stops at the recipient cap."""
    assert corpus_batches(1.0, 20.0, 100, 20, 1_000_000) == 20
    assert corpus_batches(1e9, 20.0, 1000, 20, 1_000_000) == 1000


# -- priority lanes ---------------------------------------------------------------------------


def test_lanes_time_to_provider_runs_from_submission_to_the_provider() -> None:
    """Each transactional batch's figure is its provider time minus its submission time."""
    ids = [uuid.uuid4() for _ in range(3)]
    submitted = {ids[0]: 100.0, ids[1]: 100.1, ids[2]: 100.2}
    reached = {ids[0]: 100.5, ids[1]: 100.6, ids[2]: 101.7}

    figures = time_to_provider(submitted, reached, target=2.0)

    assert figures["time_to_provider_s"]["max"] == pytest.approx(1.5)
    assert figures["time_to_provider_s"]["min"] == pytest.approx(0.5)
    assert (figures["reached"], figures["missing"], figures["within_target"]) == (3, 0, True)


def test_lanes_a_batch_that_never_reached_the_provider_counts_as_late() -> None:
    """A missing batch is counted at the wait limit, so it can only worsen the p99."""
    ok, lost = uuid.uuid4(), uuid.uuid4()

    figures = time_to_provider({ok: 0.0, lost: 0.0}, {ok: 0.3}, target=2.0, late=30.0)

    assert figures["missing"] == 1
    assert figures["time_to_provider_s"]["max"] == 30.0
    assert figures["within_target"] is False


def test_lanes_without_transactional_batches_nothing_is_judged() -> None:
    """No batch submitted (the bulk never started): no figure, no verdict."""
    figures = time_to_provider({}, {}, target=2.0)

    assert (figures["batches"], figures["within_target"]) == (0, None)


def test_lanes_transactional_batches_are_small_and_distinct() -> None:
    """One recipient each, no priority (the size makes them transactional), own address."""
    first, second = (
        orjson.loads(transactional_body(1, "t")),
        orjson.loads(transactional_body(2, "t")),
    )

    assert len(first["to"]) == 1 and "priority" not in first
    assert first["to"] != second["to"]


def test_lanes_p99_is_judged_against_two_seconds() -> None:
    """The lanes goal reads the phase's p99 and passes at 2 s, fails above."""
    goal = targets.GOALS["lanes_tx_p99_s"]

    assert goal.judge(2.0)["pass"] is True
    assert goal.judge(2.01)["pass"] is False


async def _noop(ctx: object) -> dict[str, object]:
    return {}


def test_plan_orders_phases_by_group_then_order() -> None:
    """Raw limits (A) run before the pipeline (B) and the closing limit (C)."""
    registry = {
        name: Phase(name, group, order, frozenset(), _noop, "")
        for name, group, order in [("c1", "C", 1), ("b2", "B", 2), ("a9", "A", 9), ("b1", "B", 1)]
    }
    assert [p.name for p in plan(registry)] == ["a9", "b1", "b2", "c1"]


def test_quick_plan_leaves_out_phases_not_meant_for_it() -> None:
    """``--quick`` runs only the phases registered with ``in_quick``."""
    registry = {
        "a": Phase("a", "A", 1, frozenset(), _noop, ""),
        "extra": Phase("extra", "A", 2, frozenset(), _noop, "", in_quick=False),
    }
    assert [p.name for p in plan(registry, quick=True)] == ["a"]


def test_plan_refuses_an_unknown_phase_name() -> None:
    """Asking for a phase that is not registered is an error naming it."""
    with pytest.raises(ValueError, match="nope"):
        plan({}, ["nope"])


def test_every_named_experiment_exists() -> None:
    """``--experiment`` offers exactly the experiments sitecustomize can apply."""
    assert set(NAMES) == set(sitecustomize.KNOWN)


def test_cleanup_picks_only_old_benchmark_keyspaces() -> None:
    """Only ``bench_<time>_<tag>`` keyspaces older than the limit are stale."""
    now = datetime(2026, 11, 20, 23, 0, tzinfo=UTC)
    names = ["bench_20261120t210000z_abc123", "bench_20261120t225500z_abc123", "safedelivr"]
    assert stale(names, now, timedelta(minutes=60)) == ["bench_20261120t210000z_abc123"]


def test_replayable_log_ids_match_the_drivers_time_uuids() -> None:
    """Log id i is the driver's time UUID for the batch time with clock sequence i."""
    ids = log_ids(1_800_000_000.123, 1000)
    assert [ids[i] for i in (0, 1, 255, 256, 999)] == [
        uuid_from_time(1_800_000_000.123, node=LOG_ID_NODE, clock_seq=i)
        for i in (0, 1, 255, 256, 999)
    ]


def test_gc_log_pause_line_is_parsed() -> None:
    """A unified-logging pause line gives its time, kind and duration."""
    line = (
        "[2026-11-20T23:28:32.779+0000][3312.759s][28076][28091][info] GC(3350) Pause Young "
        "(Concurrent Start) (G1 Evacuation Pause) 796M->431M(1024M) 16.464ms"
    )
    pause = gclog.parse_line(line)
    assert pause == gclog.Pause(at=1795217312.779, kind="Young", ms=16.464)


def test_gc_log_lines_without_a_pause_are_ignored() -> None:
    """Concurrent phases are not stop-the-world pauses."""
    line = (
        "[2026-11-20T23:28:32.976+0000][3312.956s][info] GC(3351) Concurrent Mark Cycle 196.685ms"
    )
    assert gclog.parse_line(line) is None


def _usage(unit: str, **per_process: float) -> dict[str, dict[str, float]]:
    return {name: {f"cpu_us_per_{unit}": value} for name, value in per_process.items()}


def test_work_per_recipient_adds_up_the_processes_of_the_path_only() -> None:
    usage = _usage("recipient", api=90.0, cassandra=100.0, rabbitmq=8.0, sandbox=50.0, bench=3.0)
    assert report.work_per_unit(usage, report.ACCEPT_PROCESSES, "recipient") == 198.0


def test_work_per_unit_is_unknown_when_a_process_was_not_sampled() -> None:
    usage = _usage("event", webhooks=600.0, cassandra=400.0)
    assert report.work_per_unit(usage, report.WEBHOOK_PROCESSES, "event") is None
    assert report.work_per_unit(None, report.WEBHOOK_PROCESSES, "event") is None


def test_acceptance_work_is_read_at_the_level_that_reached_the_maximum() -> None:
    levels = [
        {"concurrency": 16, "usage": _usage("recipient", api=1.0, cassandra=1.0, rabbitmq=1.0)},
        {"concurrency": 32, "usage": _usage("recipient", api=2.0, cassandra=2.0, rabbitmq=2.0)},
    ]
    results = {"api_max": {"levels": levels, "best_concurrency": 32, "recipients_per_s": 9.0}}
    assert report.best_level(results) == levels[1]


@pytest.mark.parametrize(
    ("goal", "value", "passed"),
    [
        ("accept_cpu_us_per_rcpt", 30.0, True),
        ("accept_cpu_us_per_rcpt", 30.1, False),
        ("api_max_rcpt_per_s", 30_000.0, True),
        ("api_max_rcpt_per_s", 29_999.0, False),
        ("e2e_cpu_us_per_rcpt", 51.0, False),
        ("webhook_cpu_us_per_event", 150.0, True),
        ("stats_read_ms_10m", 50.1, False),
        ("stats_read_cold_ms_10m", 50.0, True),
        ("stats_read_cold_ms_10m", 50.1, False),
    ],
)
def test_absolute_work_goals_hold_at_their_bound(goal: str, value: float, passed: bool) -> None:
    figure = targets.GOALS[goal].figure
    assert targets.evaluate({figure: value})[goal]["pass"] is passed


# -- the shared rate limit under a flood ------------------------------------------------------


def test_busiest_second_counts_a_burst_across_a_second_boundary_whole() -> None:
    """The window slides over the calls: four calls within 0.9 s count as four, though a
    grid of whole seconds would split them two and three."""
    assert stats.busiest_second([0.0, 0.9, 1.0, 1.05, 1.8]) == 4


def test_busiest_second_leaves_out_a_call_a_whole_second_later() -> None:
    """A call exactly one second after another is in the next window."""
    assert stats.busiest_second([5.0, 6.0, 7.0]) == 1
    assert stats.busiest_second([]) == 0


def _steady(rate: float, seconds: float, start: float = 1_800_000_000.0) -> list[float]:
    return [start + i / rate for i in range(int(rate * seconds))]


def test_a_flood_held_to_its_limit_uses_all_of_it_and_no_more() -> None:
    """SendGrid at exactly 20 calls/s and the rest at Mailgun: ratios of 1, no defect."""
    figures = limit_figures(_steady(20, 10), _steady(30, 10), limit=20)

    assert (figures["sendgrid_busiest_second"], figures["busiest_ratio"]) == (20, 1.0)
    assert figures["steady_ratio"] == pytest.approx(1.0, abs=0.02)
    assert figures["mailgun_steady_per_s"] == pytest.approx(30, abs=0.5)
    assert figures["spilled_share"] == pytest.approx(0.6)
    assert figures["defect"] is False


def test_two_calls_over_the_limit_are_the_window_edges_three_a_defect() -> None:
    """At 20/s, 22 calls in a second are within 1.1 x the limit; 23 are a limiter defect."""
    edges = limit_figures(_steady(20, 10) + _steady(1000, 0.002, 1_800_000_003.01), [], 20)
    over = limit_figures(_steady(20, 10) + _steady(1000, 0.003, 1_800_000_003.01), [], 20)

    assert (edges["sendgrid_busiest_second"], edges["defect"]) == (22, False)
    assert (over["sendgrid_busiest_second"], over["defect"]) == (23, True)


def test_a_steady_rate_above_the_limit_is_a_defect() -> None:
    """SendGrid held at 25/s under a limit of 20 is recorded with its ratio, as a defect."""
    figures = limit_figures(_steady(25, 10), [], limit=20)

    assert figures["steady_ratio"] == pytest.approx(1.25, abs=0.03)
    assert figures["defect"] is True


def test_a_flood_with_no_calls_gives_no_ratios_and_no_verdict() -> None:
    """Nothing arrived: nothing is measured, and nothing is called a defect."""
    figures = limit_figures([], [], limit=20)

    assert (figures["busiest_ratio"], figures["steady_ratio"]) == (0.0, None)
    assert figures["defect"] is False


def test_no_limit_and_a_limit_of_zero_are_the_same_setting() -> None:
    """The settings put back are those in force: none and 0 both mean no limit."""
    shown = {
        "sendgrid": {"code": "sg", "paused": False, "rate_limit_per_s": None},
        "mailgun": {"code": "mg", "paused": True, "rate_limit_per_s": 0},
    }
    assert in_force(shown) == {
        "sendgrid": {"paused": False, "rate_limit_per_s": 0.0},
        "mailgun": {"paused": True, "rate_limit_per_s": 0.0},
    }


def test_the_limiter_ceilings_fail_only_above_1_1_times_the_limit() -> None:
    """Both ratios pass at 1.1 x the limit and fail above it."""
    judged = targets.evaluate({"rate_limit_busiest_ratio": 1.1, "rate_limit_steady_ratio": 1.11})

    assert judged["rate_limit_busiest_vs_limit"]["pass"] is True
    assert judged["rate_limit_steady_vs_limit"]["pass"] is False


def test_limiter_work_adds_up_the_three_consumer_processes_and_cassandra() -> None:
    """CPU per call of the limiter's processes: every consumer process and Cassandra."""
    usage = _usage(
        "call", consumers=5.0, **{"consumers-b": 6.0, "consumers-c": 7.0}, cassandra=10.0
    )
    usage["rabbitmq"] = {"cpu_us_per_call": 100.0}

    assert report.work_per_unit(usage, report.LIMITER_PROCESSES, "call") == 28.0


def test_the_summary_says_loudly_when_the_limiter_let_too_many_calls_through() -> None:
    """A defect adds its own line to the rate limit summary; a failed phase adds none."""
    phase = limit_figures(_steady(25, 10), [], limit=20) | {"unlimited": {"offered_per_s": 60.0}}

    lines = report.rate_limit_lines({"rate_limit": phase}, {})
    clean = report.rate_limit_lines(
        {"rate_limit": limit_figures(_steady(20, 10), [], limit=20)}, {}
    )

    assert len(lines) == 2 and lines[1].startswith("LIMITER DEFECT")
    assert len(clean) == 1 and "1.00 x the limit" in clean[0]
    assert report.rate_limit_lines({"rate_limit": {"error": "boom"}}, {}) == []


def test_pipeline_cpu_adds_acceptance_dispatch_and_two_webhook_events() -> None:
    """A recipient's pipeline CPU is its acceptance, its dispatch and its two events."""
    assert report.pipeline_per_recipient(40.0, 60.0, 100.0) == 300.0


def test_pipeline_cpu_is_not_judged_without_each_part() -> None:
    """A pipeline figure missing one of its parts is no figure."""
    assert report.pipeline_per_recipient(40.0, None, 100.0) is None
