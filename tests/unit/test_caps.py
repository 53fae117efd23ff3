"""The caps' decisions (``services.api.caps``): a claim under the limit, a refusal at it, and a
ledger held to the things themselves (leaked places released after the grace, things made
before caps adopted)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.api.caps import Holds, needs_census, plan_claim, plan_release, reconciled

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
GRACE = timedelta(minutes=2)
OLD = NOW - timedelta(hours=1)
YOUNG = NOW - timedelta(seconds=5)


def _holds(*holders: str, at: datetime = OLD, version: int | None = 3) -> Holds:
    return Holds(version, dict.fromkeys(holders, at))


def test_a_claim_under_the_limit_adds_its_holder() -> None:
    plan = plan_claim(_holds("a"), "b", limit=2, now=NOW, grace=GRACE, present=None)

    assert (plan.granted, plan.held) == (True, 2)
    assert plan.write == {"a": OLD, "b": NOW}


def test_a_claim_at_the_limit_is_refused_writing_nothing() -> None:
    plan = plan_claim(_holds("a", "b"), "c", limit=2, now=NOW, grace=GRACE, present={"a", "b"})

    assert (plan.granted, plan.held, plan.write) == (False, 2, None)


def test_a_holder_claiming_again_holds_its_place_without_a_write() -> None:
    plan = plan_claim(_holds("a", "b"), "b", limit=2, now=NOW, grace=GRACE, present=None)

    assert (plan.granted, plan.write) == (True, None)


def test_a_place_whose_thing_is_gone_is_given_back_once_past_the_grace() -> None:
    """The creation that claimed ``a`` died before making it: ``c`` takes its place."""
    plan = plan_claim(_holds("a", "b"), "c", limit=2, now=NOW, grace=GRACE, present={"b"})

    assert (plan.granted, plan.held) == (True, 2)
    assert plan.write is not None and set(plan.write) == {"b", "c"}


def test_a_young_place_whose_thing_is_not_made_yet_is_kept() -> None:
    """``a``'s creation may still be under way: no room for ``c``."""
    holds = Holds(3, {"a": YOUNG, "b": OLD})

    plan = plan_claim(holds, "c", limit=2, now=NOW, grace=GRACE, present={"b"})

    assert (plan.granted, plan.held, plan.write) == (False, 2, None)


def test_things_made_before_the_ledger_are_counted_before_the_first_claim() -> None:
    holds = Holds(None, {})

    plan = plan_claim(holds, "d", limit=3, now=NOW, grace=GRACE, present={"a", "b", "c"})

    assert (plan.granted, plan.held) == (False, 3)
    assert plan.write == {"a": NOW, "b": NOW, "c": NOW}


def test_a_refusal_still_writes_what_it_found_out() -> None:
    """Gone ones released and unheld ones adopted, even when the claim is refused."""
    plan = plan_claim(_holds("a", "b"), "c", limit=2, now=NOW, grace=GRACE, present={"b", "x"})

    assert (plan.granted, plan.held) == (False, 2)
    assert plan.write == {"b": OLD, "x": NOW}


def test_a_check_finds_room_without_claiming() -> None:
    room = plan_claim(_holds("a"), None, limit=2, now=NOW, grace=GRACE, present=None)
    full = plan_claim(_holds("a", "b"), None, limit=2, now=NOW, grace=GRACE, present={"a", "b"})

    assert (room.granted, room.write) == (True, None)
    assert (full.granted, full.write, full.held) == (False, None, 2)


def test_the_census_is_taken_when_the_ledger_is_new_or_full() -> None:
    assert needs_census(Holds(None, {}), 5)
    assert needs_census(_holds("a", "b"), 2)
    assert not needs_census(_holds("a"), 2)


def test_reconciling_keeps_present_and_young_holders_and_adopts_the_rest() -> None:
    holders = {"gone": OLD, "young": YOUNG, "kept": OLD}

    assert reconciled(holders, {"kept", "new"}, now=NOW, grace=GRACE) == {
        "young": YOUNG,
        "kept": OLD,
        "new": NOW,
    }


def test_a_release_removes_its_holder_once() -> None:
    holds = _holds("a", "b")

    assert plan_release(holds, {"a"}) == {"b": OLD}
    assert plan_release(Holds(4, {"b": OLD}), {"a"}) is None
