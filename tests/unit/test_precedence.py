"""Which write of a recipient's state wins, and what readers see (pure)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.util import uuid_from_time

from shared.core import batch_ids
from shared.delivery import precedence

ACCEPTED = datetime(2026, 11, 25, 12, 0, 0, 250_000, tzinfo=UTC)
BATCH = uuid_from_time(ACCEPTED)


def test_acceptance_time_is_read_from_the_batch_id() -> None:
    assert abs(batch_ids.accepted_at(BATCH) - ACCEPTED) < timedelta(milliseconds=1)


def test_queued_loses_to_our_give_up_which_loses_to_any_provider_evidence() -> None:
    queued = precedence.queued_stamp(BATCH)
    gave_up = precedence.give_up_stamp(BATCH)
    evidence = precedence.provider_stamp(BATCH, ACCEPTED, 0)
    assert queued < gave_up < evidence


def test_our_drop_at_send_time_outranks_queued_and_the_give_up_but_no_provider_evidence() -> None:
    dropped = precedence.suppressed_stamp(BATCH)

    assert precedence.give_up_stamp(BATCH) < dropped < precedence.provider_stamp(BATCH, ACCEPTED, 0)


def test_a_delivery_reported_long_after_the_give_up_still_wins() -> None:
    late = precedence.provider_stamp(BATCH, ACCEPTED + timedelta(days=2), 0)
    assert late > precedence.give_up_stamp(BATCH)


def test_a_provider_clock_behind_ours_never_loses_to_queued() -> None:
    behind = precedence.provider_stamp(BATCH, ACCEPTED - timedelta(minutes=5), 0)
    assert behind > precedence.queued_stamp(BATCH)


def test_within_one_second_the_higher_ranked_kind_wins() -> None:
    assert precedence.provider_stamp(BATCH, ACCEPTED, 2) > precedence.provider_stamp(
        BATCH, ACCEPTED, 1
    )


@pytest.mark.parametrize("rank", [-1, 1000])
def test_ranks_outside_a_second_are_refused(rank: int) -> None:
    with pytest.raises(ValueError, match="rank"):
        precedence.provider_stamp(BATCH, ACCEPTED, rank)


def test_readers_see_a_provider_outcome_over_our_give_up() -> None:
    row = {"state": "success", "event": "delivered", "gave_up_reason": "all providers failed"}
    assert precedence.visible(row) == precedence.Visible("success", "delivered", None)


def test_readers_see_failed_when_we_gave_up_and_no_provider_spoke() -> None:
    row = {"state": None, "event": "sent", "gave_up_reason": "every provider failed"}
    assert precedence.visible(row) == precedence.Visible(
        "failed", "failed", "every provider failed"
    )


def test_a_recipient_nobody_decided_is_queued_with_its_latest_event() -> None:
    assert precedence.visible({"state": "queued", "event": "deferred"}).state == "queued"
    assert precedence.visible({}).event == "queued"


def test_ids_from_other_clocks_are_ordered_by_their_own_time() -> None:
    other = uuid.uuid1()
    assert precedence.queued_stamp(other) < precedence.give_up_stamp(other)


def test_queued_and_give_up_are_stamped_just_below_the_whole_acceptance_second() -> None:
    """Write timestamps are integer microseconds; the acceptance second is truncated."""
    second = int(ACCEPTED.timestamp())
    assert precedence.queued_stamp(BATCH) == second * 1_000_000 - 1000
    assert precedence.give_up_stamp(BATCH) == second * 1_000_000 - 500


def test_provider_evidence_from_behind_our_clock_is_stamped_at_the_acceptance_second() -> None:
    behind = precedence.provider_stamp(BATCH, ACCEPTED - timedelta(minutes=5), 3)
    assert behind == int(ACCEPTED.timestamp()) * 1_000_000 + 3


def test_readers_see_the_reason_of_a_provider_outcome() -> None:
    row = {"state": "failed", "event": "bounced", "reason_detail": "550 no such user"}
    assert precedence.visible(row) == precedence.Visible("failed", "bounced", "550 no such user")


def test_a_queued_recipient_shows_its_latest_event() -> None:
    row = {"state": "queued", "event": "deferred"}
    assert precedence.visible(row) == precedence.Visible("queued", "deferred", None)


def _row(**cells: tuple[object, object]) -> dict[str, object]:
    """A stored row: ``cells`` as ``name=(value, stamp)`` (a list of stamps for a map or set)."""
    out: dict[str, object] = {}
    for name, (value, stamp) in cells.items():
        out[name], out[precedence.stamp_column(name)] = value, stamp
    return out


def test_merge_keeps_the_later_write_of_each_cell() -> None:
    shared = _row(event=("sent", 20), state=("queued", 10), gave_up_reason=("all failed", 15))
    own = _row(event=("delivered", 30), state=("success", 30), reason_detail=("x", 5))
    merged = precedence.merge(shared, own)
    assert (merged["event"], merged["w_event"]) == ("delivered", 30)
    assert (merged["state"], merged["w_state"]) == ("success", 30)
    assert (merged["gave_up_reason"], merged["w_gave_up_reason"]) == ("all failed", 15)
    assert (merged["reason_detail"], merged["w_reason_detail"]) == ("x", 5)
    older = _row(event=("deferred", 10))
    assert (precedence.merge(shared, older)["event"], precedence.merge(older, shared)["event"]) == (
        "sent",
        "sent",
    )


def test_merge_breaks_a_tie_of_stamps_by_the_larger_value_either_way() -> None:
    sent, deferred = _row(event=("sent", 10)), _row(event=("deferred", 10))
    assert precedence.merge(sent, deferred)["event"] == "sent"
    assert precedence.merge(deferred, sent)["event"] == "sent"


def test_merge_of_a_chunk_row_alone_is_its_cells() -> None:
    shared = _row(event=("sent", 7), providers=({"sg": "sent"}, [7]), evidence=({"c.0"}, [7]))
    merged = precedence.merge(shared, None)
    assert (merged["event"], merged["w_event"]) == ("sent", 7)
    assert (merged["providers"], merged["w_providers"]) == ({"sg": "sent"}, [7])
    assert (merged["evidence"], merged["w_evidence"]) == ({"c.0"}, [7])
    assert (merged["state"], merged["w_state"], merged["superseded"]) == (None, None, None)
    assert set(merged) == {
        name for cell in precedence.STATE_CELLS for name in (cell, precedence.stamp_column(cell))
    }


def test_merge_of_absent_maps_and_sets_is_null_as_cassandra_returns_them() -> None:
    merged = precedence.merge(_row(event=("sent", 7)), _row(state=("success", 9)))
    assert (merged["providers"], merged["message_ids"], merged["evidence"]) == (None, None, None)
    assert (merged["w_providers"], merged["w_evidence"]) == (None, None)


def test_merge_refuses_a_read_without_its_write_timestamps() -> None:
    with pytest.raises(KeyError):
        precedence.merge({"event": "sent"}, None)
    with pytest.raises(ValueError, match="zip"):
        precedence.merge(_row(providers=({"mg": "x", "sg": "sent"}, [7])), None)
    with pytest.raises(ValueError, match="zip"):
        precedence.merge(_row(evidence=({"c.0", "r.1"}, [7])), None)


def test_merge_merges_map_entries_one_by_one() -> None:
    shared = _row(providers=({"mg": "sent", "sg": "failed: 500"}, [20, 10]))
    own = _row(providers=({"sg": "delivered", "zz": "dropped"}, [30, 5]))
    merged = precedence.merge(shared, own)
    assert merged["providers"] == {"mg": "sent", "sg": "delivered", "zz": "dropped"}
    assert merged["w_providers"] == [20, 30, 5]  # in key order, as Cassandra returns them
    assert list(merged["providers"]) == ["mg", "sg", "zz"]
    tie = precedence.merge(_row(providers=({"sg": "b"}, [9])), _row(providers=({"sg": "a"}, [9])))
    assert tie["providers"] == {"sg": "b"}


def test_merge_unites_set_elements_with_their_latest_stamps() -> None:
    shared = _row(evidence=(["c.0"], [10]), superseded=(None, None))
    # Sets read back in element order, with their stamps in the same order.
    own = _row(evidence=(["c.0", "r.0"], [12, 15]), superseded=(["c.0"], [15]))
    merged = precedence.merge(shared, own)
    assert (merged["evidence"], merged["w_evidence"]) == ({"c.0", "r.0"}, [12, 15])
    assert (merged["superseded"], merged["w_superseded"]) == ({"c.0"}, [15])
    assert precedence.merge(_row(), _row())["evidence"] is None


def test_merge_of_both_rows_is_what_one_row_would_hold() -> None:
    """Splitting a recipient's writes between its chunk's row and its own row changes
    nothing a reader sees: the merge is what the one row would have held."""
    writes = [("event", "sent", 10), ("event", "deferred", 12), ("event", "bounced", 12)]
    writes += [("state", "failed", 12), ("last_update", "t2", 12), ("last_update", "t1", 10)]
    for split in range(1 << len(writes)):
        rows: tuple[dict[str, object], dict[str, object]] = ({}, {})
        one: dict[str, object] = {}
        for i, (cell, value, stamp) in enumerate(writes):
            for row in (rows[(split >> i) & 1], one):
                have = (row.get(precedence.stamp_column(cell)), row.get(cell))
                if have[0] is None or (stamp, value) > have:
                    row[cell], row[precedence.stamp_column(cell)] = value, stamp
        merged = precedence.merge(*rows)
        for cell in ("event", "state", "last_update"):
            assert merged[cell] == one[cell], (split, cell)


@pytest.mark.parametrize("state", [None, "", "queued", "success", "failed"])
@pytest.mark.parametrize("gave_up", [None, "", "every provider failed"])
@pytest.mark.parametrize("event", [None, "deferred", "delivered"])
def test_queued_agrees_with_what_readers_see(
    state: str | None, gave_up: str | None, event: str | None
) -> None:
    """The send path's cheap ``queued`` says queued exactly when ``visible`` does."""
    row = {"state": state, "gave_up_reason": gave_up, "event": event}

    assert (precedence.visible(row).state == "queued") == precedence.queued(row)
