"""When a verified domain's TXT record is looked up again and what each look-up decides
(``shared.accounts.domain_checks``): the schedule and the grace."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from shared.accounts.domain_checks import CheckRules, Outcome, due, judge, unverified_after
from shared.accounts.domains import SendingDomain

T0 = datetime(2026, 11, 26, 2, 0, tzinfo=UTC)
RULES = CheckRules(every=timedelta(hours=6), grace=timedelta(days=3))
VERIFIED = SendingDomain("example.com", "tok", T0, verified_at=T0, seen_at=T0, checked_at=T0)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def test_a_verified_domain_is_due_once_every_interval() -> None:
    assert [due(VERIFIED, at(h), RULES) for h in (0, 5.9, 6, 30)] == [False, False, True, True]


def test_a_domain_verified_before_checks_began_is_due_at_once() -> None:
    assert due(replace(VERIFIED, checked_at=None, seen_at=None), T0, RULES)


@pytest.mark.parametrize("state", ["pending", "unverified"])
def test_a_domain_not_verified_is_never_looked_up(state: str) -> None:
    """Pending ones wait for their owner; unverified ones must be verified again."""
    d = replace(VERIFIED, verified_at=None, checked_at=None)
    if state == "unverified":
        d = replace(d, unverified_at=T0, unverified_reason="gone")
    assert not due(d, at(1000), RULES)


def test_a_found_record_keeps_the_domain_verified_and_ends_a_grace() -> None:
    missing = replace(VERIFIED, missing_since=at(6))

    assert judge(missing, True, at(12), RULES) == Outcome("seen", at(12))
    assert Outcome("seen", at(12)).cells() == {
        "checked_at": at(12),
        "seen_at": at(12),
        "missing_since": None,
    }


def test_the_first_miss_starts_the_grace_and_later_misses_keep_its_start() -> None:
    first = judge(VERIFIED, False, at(6), RULES)
    again = judge(replace(VERIFIED, missing_since=at(6)), False, at(12), RULES)

    assert first == Outcome("missing", at(6), missing_since=at(6))
    assert again == Outcome("missing", at(12), missing_since=at(6))
    assert again.cells() == {"checked_at": at(12), "missing_since": at(6)}


def test_a_miss_past_the_grace_unverifies_saying_why_and_since_when() -> None:
    missing = replace(VERIFIED, missing_since=at(6))

    within = judge(missing, False, at(6 + 71.9), RULES)
    past = judge(missing, False, at(6 + 72), RULES)

    assert within.kind == "missing"
    assert past.kind == "unverified" and past.at == at(78)
    assert past.reason is not None
    assert "_safedelivr.example.com" in past.reason and "2026-11-26 08:00 UTC" in past.reason
    assert past.cells()["verified_at"] is None and past.cells()["unverified_at"] == at(78)


def test_however_short_the_grace_one_miss_never_unverifies() -> None:
    """A stray answer is never enough: the first miss only starts the grace."""
    none = CheckRules(every=timedelta(hours=6), grace=timedelta(0))

    assert judge(VERIFIED, False, at(6), none).kind == "missing"
    assert judge(replace(VERIFIED, missing_since=at(6)), False, at(6), none).kind == "unverified"


def test_an_owner_is_told_when_a_missing_record_unverifies_the_domain() -> None:
    assert unverified_after(replace(VERIFIED, missing_since=at(6)), RULES) == at(78)
    assert unverified_after(VERIFIED, RULES) is None
    assert unverified_after(replace(VERIFIED, verified_at=None, missing_since=at(6)), RULES) is None
