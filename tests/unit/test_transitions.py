"""The recipient state machine, re-send routing and stats bucketing (pure)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

import pytest

from shared.core.webhook_events import Kind, ProviderEvent
from shared.delivery import precedence
from shared.delivery.handoff import next_provider
from shared.delivery.stats import count_rows, is_closed, zero_filled
from shared.ingest.transitions import (
    Effects,
    domain_outcome,
    effects,
    given_row,
    rank,
    stage_rank,
    superseded,
)
from shared.ops.check import outcome_violations
from tests.unit.webhooks.fixtures import provider_event

T0 = datetime(2026, 11, 20, 12, 0, 0, tzinfo=UTC)


def ev(
    kind: Kind,
    *,
    at: datetime = T0,
    provider_side: bool = False,
    suppress: bool = False,
    provider: str = "sg",
) -> ProviderEvent:
    return provider_event(
        kind, provider=provider, at=at, provider_side=provider_side, suppress=suppress
    )


def test_delivered_settles_success() -> None:
    """Delivery is an outcome: success (its outcome row mirrors the state)."""
    e = effects(ev("delivered"))
    assert (e.event, e.state, e.metrics) == ("delivered", "success", ())


def test_hard_bounce_is_final_and_suppresses() -> None:
    """A bounce fails the recipient, counts bounced, and is never handed over."""
    e = effects(ev("bounced"))
    assert (e.state, e.metrics, e.suppress, e.hand_off) == ("failed", ("bounced",), True, False)


def test_provider_side_drop_hands_over_without_an_outcome() -> None:
    """The provider's own drop leaves the recipient queued and hands it to another."""
    e = effects(ev("dropped", provider_side=True))
    assert (e.state, e.metrics, e.hand_off) == (None, (), True)


def test_recipient_side_drop_is_final() -> None:
    """A drop because the address is on the provider's bounce list is a final failure."""
    e = effects(ev("dropped", suppress=True))
    assert (e.state, e.hand_off, e.suppress) == ("failed", False, True)


def test_engagement_never_changes_the_outcome() -> None:
    """Opens and clicks are counted but leave the event and state columns alone."""
    for kind in ("opened", "clicked"):
        e = effects(ev(kind))
        assert (e.event, e.state, e.metrics) == (None, None, (kind,))


def test_complaint_counts_and_suppresses_but_keeps_delivery() -> None:
    """A complaint after delivery is recorded and suppresses; the mail was delivered."""
    e = effects(ev("complained"))
    assert (e.event, e.state, e.metrics, e.suppress) == ("complained", None, ("complained",), True)


def test_deferral_schedules_a_deadline_check_without_an_outcome() -> None:
    """A deferral changes the event only, and asks for a check after the deadline."""
    e = effects(ev("deferred"))
    assert (e.event, e.state, e.deadline, e.hand_off) == ("deferred", None, True, False)


def test_failure_of_a_superseded_attempt_decides_nothing() -> None:
    """A bounce of an attempt already handed over is kept in the timeline only."""
    e = superseded(effects(ev("bounced")))
    assert (e.event, e.state, e.metrics, e.suppress, e.counted) == (None, None, (), False, False)


def test_delivery_by_a_superseded_attempt_still_counts() -> None:
    """A late delivery by the provider we moved away from happened: it is a success."""
    assert superseded(effects(ev("delivered"))) == effects(ev("delivered"))


def test_deferral_or_drop_of_a_superseded_attempt_starts_nothing() -> None:
    """No deadline check and no second hand-off come from an attempt already handed over."""
    deferred = superseded(effects(ev("deferred")))
    dropped = superseded(effects(ev("dropped", provider_side=True)))
    assert (deferred.deadline, deferred.event) == (False, None)
    assert (dropped.hand_off, dropped.event) == (False, None)


def test_unknown_events_only_reach_the_timeline() -> None:
    """Unknown kinds are recorded without touching state or stats."""
    assert effects(ev("unknown")) == Effects(None, None)


BATCH = uuid.UUID(int=(0x1F0C6E0 << 96) | (1 << 76) | 1)  # a version-1 UUID


def stamp(e: ProviderEvent) -> int:
    return precedence.provider_stamp(BATCH, e.occurred_at, rank(e))


def test_same_second_later_stage_wins() -> None:
    """Within one second, delivered outranks processed, whatever the arrival order."""
    assert stamp(ev("delivered")) > stamp(ev("sent"))
    assert stamp(ev("sent", at=T0 + timedelta(seconds=1))) > stamp(ev("delivered"))


@pytest.mark.parametrize(
    ("excluded", "failed", "expected"),
    [
        (frozenset(), "sg", "mg"),
        (frozenset({"mg"}), "sg", None),
        (frozenset(), "mg", "sg"),
        (frozenset({"sg"}), "mg", None),
    ],
)
def test_next_provider_skips_those_that_failed(
    excluded: frozenset[str], failed: str, expected: str | None
) -> None:
    """A hand-off goes to the next provider that has not failed this recipient on its side."""
    assert next_provider(("sg", "mg"), excluded, failed) == expected


def test_stats_are_zero_filled_per_day() -> None:
    """Every day of the range has a row, with zeros where nothing happened."""
    rows = zero_filled(date(2026, 1, 1), date(2026, 1, 3), {date(2026, 1, 2): {"success": 4}})
    assert [r["date"] for r in rows] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert rows[1]["success"] == 4 and rows[0]["success"] == 0 and rows[2]["queued"] == 0


def test_a_day_closes_hours_after_midnight() -> None:
    """Rollups are only written for days that can no longer change much."""
    d = date(2026, 1, 1)
    assert not is_closed(d, datetime(2026, 1, 2, 1, tzinfo=UTC))
    assert is_closed(d, datetime(2026, 1, 2, 7, tzinfo=UTC))


def test_outcome_rows_follow_the_logs() -> None:
    """Stats count outcome rows, each the recipient's visible outcome (a provider's, or our
    give-up), none for a recipient still queued; engagement counts once per recipient."""
    batch = uuid.uuid1()
    a, b, c, d = (uuid.uuid1() for _ in range(4))
    rows = [
        {"log_id": a, "state": "success"},
        {"log_id": b, "state": "failed"},
        {"log_id": c, "state": "queued", "gave_up_reason": "every provider failed"},
        {"log_id": d, "state": "queued"},
    ]
    outcomes = {a: "success", b: "failed", c: "failed"}
    assert outcome_violations(uuid.uuid4(), batch, rows, outcomes) == []

    stat_rows = [
        {"log_id": batch, "queued": 4},
        {"log_id": a, "outcome": "success", "opened": True},
        {"log_id": b, "outcome": "failed", "bounced": True},
        {"log_id": c, "outcome": "failed"},
    ]
    assert count_rows(stat_rows) == {
        "queued": 4,
        "success": 1,
        "failed": 2,
        "bounced": 1,
        "opened": 1,
    }


def test_provider_side_drop_loses_to_the_resends_delivery_in_the_same_second() -> None:
    """A re-sent recipient delivered within the drop's second shows delivered, not dropped."""
    dropped = ev("dropped", provider_side=True)
    delivered = ev("delivered", provider="mg")

    assert stamp(delivered) > stamp(dropped)


def test_sent_records_the_event_without_an_outcome() -> None:
    """The provider accepting the message is timeline and event column only."""
    assert effects(ev("sent")) == Effects("sent", None)


def test_failures_write_their_own_kind_into_the_event_column() -> None:
    """Bounces and drops, recipient- or provider-side, show as what they were."""
    assert effects(ev("bounced")).event == "bounced"
    assert effects(ev("dropped", suppress=True)).event == "dropped"
    assert effects(ev("dropped", provider_side=True)).event == "dropped"


def test_unsubscribe_suppresses_without_touching_event_state_or_stats() -> None:
    """An unsubscribe only suppresses the address: the mail's outcome stands."""
    assert effects(ev("unsubscribed")) == Effects(None, None, suppress=True)


def test_provider_side_drop_loses_even_to_the_resends_first_stage_in_the_same_second() -> None:
    """The re-send's lowest-ranked stage (sent) still outranks the drop it replaces."""
    dropped = ev("dropped", provider_side=True)
    sent = ev("sent", provider="mg")

    assert stamp(sent) > stamp(dropped)


def _row(**fields: object) -> dict[str, object]:
    return {"state": "queued", "event": "sent", "superseded": None, **fields}


def _tagged(
    kind: Kind, attempt: str | None = "c.0", *, provider_side: bool = False, suppress: bool = False
) -> ProviderEvent:
    return replace(ev(kind, provider_side=provider_side, suppress=suppress), attempt=attempt)


def test_a_failure_of_a_queued_recipient_keeps_all_its_effects() -> None:
    drop = _tagged("dropped", provider_side=True)
    assert given_row(effects(drop), drop, _row(superseded={"c.1"})) == effects(drop)


def test_a_failure_of_a_handed_over_attempt_decides_nothing() -> None:
    bounce = _tagged("bounced", suppress=True)
    assert given_row(effects(bounce), bounce, _row(superseded={"c.0"})) == Effects(None, None)
    defer = _tagged("deferred")
    assert given_row(effects(defer), defer, _row(superseded={"c.0"})) == Effects(None, None)


def test_an_untagged_failure_is_judged_by_the_recipients_state_alone() -> None:
    drop = _tagged("dropped", attempt=None, provider_side=True)
    assert given_row(effects(drop), drop, _row(superseded={"c.0"})).hand_off


@pytest.mark.parametrize(
    "row",
    [None, _row(state="success", event="delivered"), _row(gave_up_reason="all failed")],
    ids=["no-row", "final", "given-up"],
)
def test_a_late_failure_or_deferral_only_records_itself(row: dict[str, object] | None) -> None:
    for event in (_tagged("dropped", provider_side=True), _tagged("deferred")):
        eff = given_row(effects(event), event, row)
        assert (eff.hand_off, eff.deadline) == (False, False)
        assert (eff.event, eff.state) == (effects(event).event, None)
    bounce = _tagged("bounced", suppress=True)
    assert given_row(effects(bounce), bounce, row) == Effects(
        "bounced", "failed", ("bounced",), suppress=True
    )


def test_a_provider_side_failure_of_a_final_recipient_only_completes_its_hand_off() -> None:
    drop = _tagged("dropped", provider_side=True)
    final = given_row(effects(drop), drop, _row(state="success", event="delivered"))
    assert (final.hand_off, final.finish_hand_off) == (False, True)
    assert not given_row(effects(drop), drop, _row()).finish_hand_off  # queued: a full hand-off
    assert not given_row(effects(drop), drop, None).finish_hand_off
    bounce = _tagged("bounced", suppress=True)
    assert not given_row(effects(bounce), bounce, _row(state="success")).finish_hand_off


@pytest.mark.parametrize(
    ("kind", "counted"),
    [
        ("delivered", "delivered"),
        ("bounced", "bounced"),
        ("complained", "complained"),
        ("opened", None),
        ("deferred", None),
        ("dropped", None),
    ],
)
def test_what_an_event_counts_for_its_sending_domains_capacity(
    kind: Kind, counted: str | None
) -> None:
    assert domain_outcome(effects(ev(kind))) == counted


def test_a_superseded_bounce_counts_nothing_for_the_domain() -> None:
    assert domain_outcome(superseded(effects(ev("bounced")))) is None


@pytest.mark.parametrize(
    ("event", "needs"),
    [
        (ev("delivered"), False),
        (ev("opened"), False),
        (ev("bounced"), True),  # a failure: was this attempt handed over already?
        (ev("dropped", provider_side=True), True),  # a hand-off
        (ev("deferred"), True),  # a deadline check
    ],
)
def test_only_failures_hand_offs_and_deferrals_depend_on_the_recipients_row(
    event: ProviderEvent, needs: bool
) -> None:
    assert effects(event).needs_row is needs


def test_a_provider_side_failure_ranks_lowest_for_the_state_but_by_stage_in_its_own_map() -> None:
    """Its state write must lose to the next provider's events of the same second; its entry
    in the provider's own map still sorts by how far the message got."""
    dropped = ev("dropped", provider_side=True)

    assert rank(dropped) == 0
    assert stage_rank(dropped) == stage_rank(ev("dropped")) > 0
