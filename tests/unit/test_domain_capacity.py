"""Capacity with penalty per sending domain: the pure rule (warm-up, penalty, window) and the
gate the consumers ask before each call (over its in-memory twin)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from shared.delivery.domain_capacity import (
    HISTORY_DAYS,
    Capacity,
    CapacityGate,
    CapacityRules,
    DayVolume,
    capacity,
    judge,
    renews_in,
)
from tests.fakes.delivery import FakeDomainVolumes

TODAY = date(2026, 11, 26)
RULES = CapacityRules(enabled=True, initial=1000)
NOW = datetime(2026, 11, 26, 18, 0, tzinfo=UTC)


def _ago(days: int) -> date:
    return TODAY - timedelta(days=days)


def test_a_new_domain_starts_at_the_initial_capacity() -> None:
    cap = capacity({}, TODAY, RULES)

    assert (cap.limit, cap.state) == (1000, "new")


def test_each_clean_day_that_used_half_its_capacity_doubles_it() -> None:
    history = {
        _ago(3): DayVolume(sent=500),
        _ago(2): DayVolume(sent=1000),
        _ago(1): DayVolume(sent=2000),
    }

    cap = capacity(history, TODAY, RULES)

    assert (cap.limit, cap.state) == (8000, "warming_up")


def test_a_day_that_used_little_of_its_capacity_does_not_grow_it() -> None:
    assert capacity({_ago(1): DayVolume(sent=499)}, TODAY, RULES).limit == 1000


def test_a_day_over_the_bounce_limit_halves_the_capacity() -> None:
    history = {_ago(2): DayVolume(sent=1000), _ago(1): DayVolume(sent=2000, bounced=200)}

    cap = capacity(history, TODAY, RULES)

    assert (cap.limit, cap.state) == (1000, "penalised")
    assert "hard-bounce rate 10.0% over 5.0%" in cap.why


def test_a_day_over_the_complaint_limit_halves_the_capacity() -> None:
    cap = capacity({_ago(1): DayVolume(sent=1000, complained=4)}, TODAY, RULES)

    assert cap.limit == 500 and "complaint rate 0.40%" in cap.why


def test_todays_rates_slow_the_domain_today() -> None:
    cap = capacity({TODAY: DayVolume(sent=400, bounced=60)}, TODAY, RULES)

    assert (cap.limit, cap.state) == (500, "penalised") and cap.why.endswith("today")


def test_penalties_stop_at_a_tenth_of_the_initial_capacity() -> None:
    history = {_ago(d): DayVolume(sent=1000, bounced=500) for d in range(1, 10)}

    assert capacity(history, TODAY, RULES).limit == 100


def test_rates_are_not_judged_on_fewer_than_a_hundred_recipients() -> None:
    assert judge(DayVolume(sent=99, bounced=99), RULES) is None
    assert judge(DayVolume(sent=100, bounced=6), RULES) is not None


def test_days_outside_the_window_are_forgotten() -> None:
    history = {_ago(HISTORY_DAYS + 1): DayVolume(sent=1000, bounced=900)}

    assert capacity(history, TODAY, RULES).limit == 1000


def test_capacity_renews_at_midnight_utc() -> None:
    assert renews_in(NOW) == 6 * 3600


async def test_a_chunk_that_starts_under_the_capacity_goes_whole() -> None:
    gate = CapacityGate(FakeDomainVolumes())

    first = await gate.admit("shop.example", 999, NOW, RULES)
    second = await gate.admit("shop.example", 900, NOW, RULES)

    assert (first, second) == (None, None)


async def test_a_chunk_that_would_start_over_the_capacity_is_held_and_not_counted() -> None:
    volumes = FakeDomainVolumes()
    gate = CapacityGate(volumes)
    await gate.admit("shop.example", 1000, NOW, RULES)

    held = await gate.admit("shop.example", 10, NOW, RULES)

    assert held is not None and held.wait == renews_in(NOW)
    assert "shop.example reached today's sending capacity (1,000 of 1,000" in held.reason
    assert "held, not dropped" in held.reason
    assert volumes.days[("shop.example", TODAY)]["sent"] == 1000


async def test_a_held_chunk_is_reported_to_the_alert() -> None:
    seen: list[tuple[str, int, int]] = []

    async def on_held(domain: str, cap: Capacity, sent: int) -> None:
        seen.append((domain, cap.limit, sent))

    gate = CapacityGate(FakeDomainVolumes(), on_held)
    await gate.admit("shop.example", 1000, NOW, RULES)
    await gate.admit("shop.example", 1, NOW, RULES)

    assert seen == [("shop.example", 1000, 1000)]


async def test_a_call_the_provider_refused_gives_its_recipients_back() -> None:
    volumes = FakeDomainVolumes()
    gate = CapacityGate(volumes)
    await gate.admit("shop.example", 1000, NOW, RULES)

    await gate.release("shop.example", 1000, NOW, RULES)

    assert await gate.admit("shop.example", 1000, NOW, RULES) is None


async def test_domains_have_their_own_capacity() -> None:
    gate = CapacityGate(FakeDomainVolumes())
    await gate.admit("shop.example", 1000, NOW, RULES)

    assert await gate.admit("news.example", 10, NOW, RULES) is None


@pytest.mark.parametrize("rules", [CapacityRules(enabled=False, initial=10)])
async def test_a_disabled_gate_admits_everything_and_counts_nothing(rules: CapacityRules) -> None:
    volumes = FakeDomainVolumes()
    gate = CapacityGate(volumes)

    results = [await gate.admit("shop.example", 100, NOW, rules) for _ in range(3)]

    assert results == [None] * 3 and volumes.days == {}


async def test_an_outage_lets_the_chunk_go() -> None:
    volumes = FakeDomainVolumes()
    gate = CapacityGate(volumes)
    volumes.failing = True

    assert await gate.admit("shop.example", 5000, NOW, RULES) is None
    await gate.release("shop.example", 5000, NOW, RULES)  # never raises either


async def test_new_rules_apply_to_the_next_chunk() -> None:
    gate = CapacityGate(FakeDomainVolumes())
    small = CapacityRules(enabled=True, initial=100)
    await gate.admit("shop.example", 100, NOW, small)
    assert await gate.admit("shop.example", 1, NOW, small) is not None

    larger = CapacityRules(enabled=True, initial=5000)

    assert await gate.admit("shop.example", 1, NOW, larger) is None
