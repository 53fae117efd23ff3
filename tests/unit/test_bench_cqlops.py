"""The bench's Cassandra operations per batch: two ``system_views`` snapshots of the run's
keyspace turned into round trips, reads, writes, LWTs and scans per batch, and null with why
(never a negative number) when the node restarted or a counter cannot be trusted."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from bench import cqlops, report
from bench.cqlops import Snapshot
from bench.loadgen import Answer, Recorder
from bench.phases.dispatch import whole_batches

NODE = "127.0.0.1:7000"


def snap(
    tables: Mapping[str, Mapping[str, int]],
    connections: Mapping[str, int],
    generation: int = 1_700_000_000,
) -> Snapshot:
    return Snapshot(generations={NODE: generation}, tables=tables, connections=connections)


BEFORE = snap(
    {
        "batches": {"reads": 10, "writes": 20, "scans": 0, "local_reads": 10},
        "send_attempts": {"reads": 5, "writes": 0, "scans": 1, "local_reads": 7},
        "idle_table": {"reads": 3, "writes": 3, "scans": 0, "local_reads": 3},
    },
    {"127.0.0.1:5001": 100, "127.0.0.1:5002": 50},
)
AFTER = snap(
    {
        "batches": {"reads": 110, "writes": 320, "scans": 0, "local_reads": 110},
        "send_attempts": {"reads": 5, "writes": 0, "scans": 1, "local_reads": 207},
        "idle_table": {"reads": 3, "writes": 3, "scans": 0, "local_reads": 3},
    },
    {"127.0.0.1:5001": 500, "127.0.0.1:5002": 250},
)


def test_operations_are_the_counters_moved_between_the_two_snapshots() -> None:
    """Reads, writes and scans add up the keyspace's tables; round trips its connections."""
    d = cqlops.delta(BEFORE, AFTER)

    assert (d.round_trips, d.reads, d.writes, d.scans) == (600, 100, 300, 0)
    assert d.why == ()


def test_a_local_read_without_a_coordinator_read_is_a_paxos_round() -> None:
    """An LWT's prepare reads the partition locally with no coordinator read: it counts as one
    LWT, and a plain read (both counts move) does not."""
    d = cqlops.delta(BEFORE, AFTER)

    assert d.lwt == 200
    assert d.per_table["send_attempts"] == {"reads": 0, "writes": 0, "lwt": 200, "scans": 0}
    assert d.per_table["batches"]["lwt"] == 0


def test_tables_the_window_did_not_touch_are_left_out() -> None:
    """Only tables whose counters moved are listed per table."""
    assert set(cqlops.delta(BEFORE, AFTER).per_table) == {"batches", "send_attempts"}


def test_per_batch_divides_every_figure_by_the_batches_of_the_window() -> None:
    """Each figure is its total over the window divided by the batches, rounded to 0.01."""
    ops = cqlops.per_unit(BEFORE, AFTER, 100)

    assert {k: ops[k] for k in cqlops.KINDS} == {
        "round_trips": 6.0,
        "reads": 1.0,
        "writes": 3.0,
        "lwt": 2.0,
        "scans": 0.0,
    }
    assert ops["unit"] == "batch"
    assert ops["units"] == 100
    assert "why" not in ops


def test_a_restarted_node_gives_null_figures_and_says_why() -> None:
    """A new gossip generation means the counters started again: every figure is null, with
    the restart as the reason, even when the counters have since passed their old values."""
    after = snap(AFTER.tables, AFTER.connections, generation=1_700_000_999)

    ops = cqlops.per_unit(BEFORE, after, 100)

    assert all(ops[k] is None for k in cqlops.KINDS)
    assert "restarted" in ops["why"][0]


def test_a_counter_that_went_back_gives_null_figures_not_negative_ones() -> None:
    """A count lower after than before (a reset the generation did not show) is no figure."""
    reset = snap(
        {**AFTER.tables, "batches": {"reads": 4, "writes": 2, "scans": 0, "local_reads": 4}},
        AFTER.connections,
    )

    ops = cqlops.per_unit(BEFORE, reset, 100)

    assert all(ops[k] is None for k in cqlops.KINDS)
    assert "went back" in ops["why"][0]


def test_a_table_gone_from_the_counters_gives_null_figures() -> None:
    """A table counted before and missing after (dropped, or a restart) is no figure."""
    gone = snap({k: v for k, v in AFTER.tables.items() if k != "batches"}, AFTER.connections)

    ops = cqlops.per_unit(BEFORE, gone, 100)

    assert ops["reads"] is None
    assert "batches" in ops["why"][0]


def test_a_connection_closed_during_the_window_leaves_round_trips_unknown() -> None:
    """Its last requests went with it: round trips are null with why; the table counts stand."""
    closed = snap(AFTER.tables, {"127.0.0.1:5001": 500})

    ops = cqlops.per_unit(BEFORE, closed, 100)

    assert ops["round_trips"] is None
    assert ops["writes"] == 3.0
    assert "closed" in ops["why"][0]


def test_a_connection_opened_during_the_window_counts_from_zero() -> None:
    """A new connection's requests are all the window's."""
    opened = snap(AFTER.tables, {**AFTER.connections, "127.0.0.1:5003": 40})

    assert cqlops.delta(BEFORE, opened).round_trips == 640


def test_a_window_without_batches_gives_no_ratio() -> None:
    """Zero batches: the totals are kept, the figures per batch are null with why."""
    ops = cqlops.per_unit(BEFORE, AFTER, 0)

    assert ops["round_trips"] is None
    assert ops["totals"]["round_trips"] == 600
    assert ops["why"] == ["no batch in the window"]


def test_unreadable_system_views_give_null_figures() -> None:
    """A snapshot that could not be read leaves every figure null, with why."""
    ops = cqlops.per_unit(None, AFTER, 100)

    assert all(ops[k] is None for k in cqlops.KINDS)
    assert ops["why"] == ["system_views could not be read"]


def test_the_summary_names_each_figure_per_unit() -> None:
    """One line per phase: round trips per unit, then the breakdown and the units counted."""
    line = cqlops.summary(cqlops.per_unit(BEFORE, AFTER, 100, "post"))

    assert line == (
        "6.0 round trips per post (reads 1.0, writes 3.0, lwt 2.0, scans 0.0; 100 posts)"
    )


def test_the_summary_of_null_figures_says_why() -> None:
    """Null figures print as n/a with the reason."""
    restarted = snap(AFTER.tables, AFTER.connections, generation=2)

    assert cqlops.summary(cqlops.per_unit(BEFORE, restarted, 100)).startswith("n/a: node ")


def test_the_table_shows_round_trips_per_batch_of_each_phase() -> None:
    """The summary table's column holds round trips per batch, ``-`` when unknown."""
    assert (
        report.round_trips_cell({"cassandra_ops_per_batch": cqlops.per_unit(BEFORE, AFTER, 100)})
        == "6.0"
    )
    assert (
        report.round_trips_cell({"cassandra_ops_per_batch": cqlops.per_unit(None, AFTER, 1)}) == "-"
    )
    assert report.round_trips_cell({}) == "-"


def test_the_summary_lists_the_operations_of_every_step() -> None:
    """API levels and open-loop steps each get their own line, as do whole phases and the
    idle stack's operations per second; a phase without them gets none."""
    ops = cqlops.per_unit(BEFORE, AFTER, 100)
    phases = {
        "api_max": {"levels": [{"concurrency": 16, "cassandra_ops_per_batch": ops}]},
        "api_open": {"steps": {"50%": {"cassandra_ops_per_batch": ops}}},
        "e2e": {"cassandra_ops_per_batch": ops},
        "stats_read": {"ms_10m": 3.0},
        "idle": {"cassandra_ops_per_s": cqlops.per_unit(BEFORE, AFTER, 60, "second")},
    }

    lines = report.ops_lines(phases)

    assert [line.split()[0] for line in lines[1:]] == ["api_max", "api_open", "e2e", "idle"]
    assert "per second" in lines[4]
    assert "c=16" in lines[1]
    assert "50%" in lines[2]


def test_a_drain_counts_only_the_batches_whose_every_chunk_was_sent() -> None:
    """A batch with a chunk still unsent did part of its work: it is not a unit."""
    a, b = uuid.uuid4(), uuid.uuid4()
    attempts = {(a, 0): 1.0, (a, 1): 2.0, (b, 0): 3.0}

    assert whole_batches(attempts, 2) == 1


def test_the_load_generator_reports_every_accepted_answer_warm_up_included() -> None:
    """The snapshots bracket the whole run, so its accepted answers are counted whole."""
    rec = Recorder(window_start=10.0, window_end=20.0)
    rec.record(5.0, 0.01, Answer("202", 100))
    rec.record(12.0, 0.01, Answer("202", 100))
    rec.record(13.0, 0.01, Answer("500"))

    result = rec.result(10.0)

    assert (result["ok"], result["accepted_all"]) == (1, 2)
