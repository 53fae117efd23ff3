"""``safedelivr check``'s judgement of one batch's stored rows (pure)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from cassandra.util import uuid_from_time

from shared.ops.check import batch_violations, outcome_violations

ACCEPTED = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
BATCH = uuid_from_time(ACCEPTED)
USER = uuid.uuid4()


def row(email: str, **kw: object) -> dict[str, object]:
    base = {"log_id": uuid.uuid1(), "chunk": 0, "email": email, "state": "queued"}
    return {**base, "event": "queued", **kw}


def judge(
    rows: list[dict[str, object]],
    *,
    delivered: frozenset[uuid.UUID] = frozenset(),
    age: float = 7200,
) -> list[str]:
    found = batch_violations(
        USER,
        BATCH,
        rows,
        set(delivered),
        {"c0": "attempt 0 via sg accepted"},
        now=ACCEPTED + timedelta(seconds=age),
        settle_after=timedelta(hours=1),
    )
    return [f"{v.kind} {v.subject}" for v in found]


def test_a_settled_batch_with_outcomes_for_everyone_has_no_violation() -> None:
    rows = [row("a", state="success", evidence={"c.0"}), row("b", gave_up_reason="all failed")]
    assert judge(rows) == []


def test_a_recipient_queued_past_every_window_is_reported_with_its_attempts() -> None:
    found = batch_violations(
        USER,
        BATCH,
        [row("a")],
        set(),
        {"c0": "attempt 2 via mg ambiguous"},
        now=ACCEPTED + timedelta(hours=2),
        settle_after=timedelta(hours=1),
    )
    assert [v.kind for v in found] == ["not_final"]
    assert "attempt 2 via mg ambiguous" in found[0].detail


def test_a_recipient_still_within_its_windows_is_not_reported() -> None:
    assert judge([row("a")], age=60) == []


def test_two_accepted_attempts_neither_handed_over_are_a_double_send() -> None:
    assert judge([row("a", state="success", evidence={"c.0", "c.1"})]) == ["sent_twice a"]


def test_an_attempt_handed_over_to_another_provider_is_not_a_double_send() -> None:
    handed = row("a", state="success", evidence={"c.0", "r.0"}, superseded={"c.0"})
    assert judge([handed]) == []


def test_a_delivery_shown_as_failed_is_reported() -> None:
    failed = row("a", gave_up_reason="every provider failed")
    assert judge([failed], delivered=frozenset({failed["log_id"]})) == ["delivered_but_failed a"]  # type: ignore[arg-type]


def outcomes_judged(
    rows: list[dict[str, object]], outcomes: dict[uuid.UUID, str | None]
) -> list[str]:
    return [f"{v.subject}: {v.detail}" for v in outcome_violations(USER, BATCH, rows, outcomes)]


def test_outcome_rows_that_mirror_every_state_are_no_violation() -> None:
    rows = [
        row("a", state="success"),
        row("b", state="failed"),
        row("c", gave_up_reason="every provider failed"),
        row("d"),
    ]
    outcomes = {
        r["log_id"]: o for r, o in zip(rows, ("success", "failed", "failed", None), strict=True)
    }
    assert outcomes_judged(rows, outcomes) == []  # type: ignore[arg-type]
    assert outcomes_judged(rows[3:], {}) == []  # a queued recipient needs no outcome row


def test_a_missing_or_different_outcome_row_is_a_stats_violation() -> None:
    delivered, gave_up, queued = row("a", state="success"), row("b", gave_up_reason="x"), row("c")
    outcomes = {gave_up["log_id"]: "success", queued["log_id"]: "failed"}
    found = outcome_violations(USER, BATCH, [delivered, gave_up, queued], outcomes)  # type: ignore[arg-type]
    assert {(v.kind, v.user_id, v.batch_id) for v in found} == {("stats", USER, BATCH)}
    assert [f"{v.subject}: {v.detail}" for v in found] == [
        "a: outcome row says nothing, the log says success",
        "b: outcome row says success, the log says failed",
        "c: outcome row says failed, the log says queued",
    ]
