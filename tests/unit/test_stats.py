"""How stats are counted from outcome rows, and when a stored count still stands (pure)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from shared.delivery.recipients import log_id_for
from shared.delivery.stats import (
    LARGE_BUCKET,
    LARGE_STALE,
    METRICS,
    SETTLE,
    Roll,
    Rollup,
    add,
    bucket_of,
    count_rows,
    current,
    fresh_enough,
    roll_step,
)

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def test_a_bucket_counts_queued_recipients_outcomes_and_event_metrics() -> None:
    rows: list[dict[str, object]] = [
        {"log_id": uuid.uuid1(), "queued": 1000},
        {"log_id": uuid.uuid1(), "queued": 3},
        {"log_id": uuid.uuid1(), "outcome": "success", "opened": True, "clicked": True},
        {"log_id": uuid.uuid1(), "outcome": "success", "opened": True},
        {"log_id": uuid.uuid1(), "outcome": "failed", "bounced": True, "complained": None},
        {"log_id": uuid.uuid1(), "outcome": None, "complained": True},
    ]
    counts = count_rows(rows)
    assert counts == {
        "queued": 1003,
        "success": 2,
        "failed": 1,
        "bounced": 1,
        "complained": 1,
        "opened": 2,
        "clicked": 1,
    }
    assert list(counts) == list(METRICS)


def test_a_bucket_leaves_out_what_counts_nothing() -> None:
    rows: list[dict[str, object]] = [
        {"queued": 0},  # a cancelled batch
        {"outcome": "queued"},
        {"outcome": None, "bounced": False, "opened": None},
    ]
    assert count_rows(rows) == {}
    assert count_rows([]) == {}


def test_bucket_counts_add_up_per_metric() -> None:
    assert add([{"queued": 2, "success": 1}, {}, {"success": 2, "failed": 1}]) == {
        "queued": 2,
        "success": 3,
        "failed": 1,
    }
    assert add([]) == {}


def test_a_rollup_of_a_bucket_nothing_changed_in_is_current() -> None:
    assert current(None, None)
    assert current(Rollup({"success": 1}, NOW), None)


def test_a_changed_bucket_never_counted_is_not_current() -> None:
    assert not current(None, NOW)


def test_a_rollup_is_current_only_when_counted_over_settle_after_the_change() -> None:
    counted = Rollup({"success": 1}, NOW)
    assert current(counted, NOW - SETTLE - timedelta(microseconds=1))
    assert not current(counted, NOW - SETTLE)
    assert not current(counted, NOW - SETTLE + timedelta(seconds=1))
    assert not current(counted, NOW + timedelta(seconds=1))  # changed after the count


def test_a_naive_change_time_is_read_as_utc() -> None:
    """The driver returns timestamps as naive UTC."""
    counted = Rollup({}, NOW)
    naive = (NOW - SETTLE - timedelta(seconds=1)).replace(tzinfo=None)
    assert current(counted, naive)
    assert not current(counted, NOW.replace(tzinfo=None))


def test_only_a_large_recently_counted_bucket_may_serve_a_stale_count() -> None:
    large = Rollup({}, NOW - LARGE_STALE + timedelta(seconds=1), LARGE_BUCKET + 1)
    assert fresh_enough(large, NOW)
    assert not fresh_enough(Rollup({}, NOW - LARGE_STALE, LARGE_BUCKET + 1), NOW)
    assert not fresh_enough(Rollup({}, NOW, LARGE_BUCKET), NOW)
    assert not fresh_enough(None, NOW)


@pytest.mark.parametrize(
    ("stored", "dirty_at", "step"),
    [
        (None, None, Roll.DROP),  # nothing ever changed
        (Rollup({"success": 1}, NOW), NOW - SETTLE - timedelta(seconds=1), Roll.DROP),
        (None, NOW, Roll.RECOUNT),  # changed, never counted
        (Rollup({"success": 1}, NOW - timedelta(minutes=5), 10), NOW, Roll.RECOUNT),
        (Rollup({}, NOW - LARGE_STALE, LARGE_BUCKET + 1), NOW, Roll.RECOUNT),
        (Rollup({}, NOW - timedelta(seconds=1), LARGE_BUCKET + 1), NOW, Roll.KEEP),
    ],
)
def test_the_roll_up_pass_drops_current_marks_recounts_changed_buckets_and_waits_on_large_ones(
    stored: Rollup | None, dirty_at: datetime | None, step: Roll
) -> None:
    """A marked bucket's mark is dropped once its rollup is current, the bucket recounted when
    it changed since, unless it is large and was counted less than LARGE_STALE ago."""
    assert roll_step(stored, dirty_at, NOW) is step


def test_a_rollup_survives_its_encoding() -> None:
    rollup = Rollup({"queued": 3, "success": 1}, NOW, 4)
    assert Rollup.decode(rollup.encode()) == rollup
    assert Rollup.decode(None) is None
    assert Rollup.decode(b"") is None
    legacy = b'{"counts": {"failed": 2}, "scanned_at": "2026-11-25T12:00:00+00:00"}'
    assert Rollup.decode(legacy) == Rollup({"failed": 2}, NOW, 0)


@pytest.mark.parametrize("buckets", [1, 7, 64, 4096])
def test_a_recipients_bucket_is_its_log_ids_node_modulo_the_buckets(buckets: int) -> None:
    batch = uuid.uuid1()
    for n in range(50):
        log_id = log_id_for(batch, f"r{n}@example.org")
        assert bucket_of(log_id, buckets) == log_id.node % buckets
        assert 0 <= bucket_of(log_id, buckets) < buckets
    assert bucket_of(batch, buckets) == batch.node % buckets


def test_a_recipient_keeps_its_bucket_whatever_else_its_id_holds() -> None:
    """Only the low 48 bits (the node) choose the bucket: not the time, nor the clock."""
    node = 0x123456789ABC
    ids = [uuid.UUID(fields=(t, 1, 0x1001, 0x80 | c, 0, node)) for t in (1, 99) for c in (0, 0x3F)]
    assert {bucket_of(i, 64) for i in ids} == {node % 64}


def test_a_batchs_recipients_spread_over_every_bucket() -> None:
    batch = uuid.uuid1()
    spread = {bucket_of(log_id_for(batch, f"r{n}@example.org"), 64) for n in range(2000)}
    assert spread == set(range(64))
