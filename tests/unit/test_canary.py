"""Canary rollout decisions (``shared.templates.canary``)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.templates.canary import Counts, Margins, decide, in_canary

TEMPLATE = uuid.uuid4()


def test_a_recipient_always_gets_the_same_version() -> None:
    assert in_canary(TEMPLATE, "Ann@Example.com", 30) == in_canary(TEMPLATE, "ann@example.com", 30)


def test_the_canarys_share_is_about_its_percent() -> None:
    share = sum(in_canary(TEMPLATE, f"r{i}@example.com", 10) for i in range(20_000)) / 20_000

    assert 0.09 < share < 0.11


@given(st.emails(), st.floats(0, 100), st.floats(0, 100))
def test_raising_the_share_only_adds_recipients(email: str, low: float, high: float) -> None:
    low, high = sorted((low, high))

    assert not in_canary(TEMPLATE, email, low) or in_canary(TEMPLATE, email, high)


def test_no_share_is_no_canary() -> None:
    assert not any(in_canary(TEMPLATE, f"r{i}@example.com", 0) for i in range(1000))


def test_a_canary_bouncing_more_than_its_margin_is_rolled_back() -> None:
    verdict = decide(
        Counts(sent=200, hard_bounces=20), Counts(sent=1800, hard_bounces=18), Margins(),
        deadline_passed=False,
    )  # fmt: skip

    assert verdict.decision == "rollback"
    assert verdict.reason.startswith("hard bounces: 10.00% of the canary's 200 against 1.00%")


def test_a_canary_within_every_margin_is_promoted() -> None:
    verdict = decide(
        Counts(sent=200, hard_bounces=3, complaints=0, provider_failures=2),
        Counts(sent=1800, hard_bounces=18, complaints=1, provider_failures=20),
        Margins(),
        deadline_passed=False,
    )

    assert verdict.decision == "promote"


@pytest.mark.parametrize(("deadline", "decision"), [(False, "wait"), (True, "promote")])
def test_too_few_recipients_wait_until_the_deadline(deadline: bool, decision: str) -> None:
    verdict = decide(Counts(sent=10, hard_bounces=5), Counts(sent=1000), Margins(),
                     deadline_passed=deadline)  # fmt: skip

    assert verdict.decision == decision


def test_complaints_have_their_own_small_margin() -> None:
    verdict = decide(Counts(sent=1000, complaints=5), Counts(sent=9000, complaints=9), Margins(),
                     deadline_passed=False)  # fmt: skip

    assert verdict.decision == "rollback" and verdict.reason.startswith("complaints")


def test_at_the_deadline_a_large_canary_is_judged_against_a_short_live_side() -> None:
    """A high share leaves the live side under ``min_sent``; the canary's own bounces
    still roll it back rather than being promoted for want of a comparison."""
    verdict = decide(Counts(sent=900, hard_bounces=300), Counts(sent=40), Margins(),
                     deadline_passed=True)  # fmt: skip

    assert verdict.decision == "rollback" and verdict.reason.startswith("hard bounces")


def test_at_the_deadline_a_large_healthy_canary_is_promoted() -> None:
    verdict = decide(Counts(sent=900, hard_bounces=1), Counts(sent=40), Margins(),
                     deadline_passed=True)  # fmt: skip

    assert verdict.decision == "promote"
