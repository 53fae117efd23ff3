"""Provider health (``shared.providers.provider_health``), pure: the score from shared windows, the
circuit's state machine and the order it all gives the chain."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.errors import DependencyUnavailable
from shared.providers.provider_health import (
    COOL_DOWN,
    LATENCY_WEIGHT,
    MIN_EVENTS,
    PROBE_SHARE,
    SLOW,
    VERY_SLOW,
    WINDOW,
    CircuitState,
    HealthRules,
    Reports,
    Tally,
    Window,
    next_circuit,
    order,
    score,
    seen_since,
    window_start,
)

NOW = datetime(2026, 11, 26, 12, 0, 2, tzinfo=UTC)


def _windows(*per_window: tuple[int, int], latency_ms: int = 100) -> list[Window]:
    """Oldest first: (calls, errors) per 5 s window, ending with the last full window."""
    last = window_start(NOW) - timedelta(seconds=WINDOW)
    count = len(per_window)
    return [
        Window(last - timedelta(seconds=WINDOW * (count - 1 - i)), c, e, c * latency_ms)
        for i, (c, e) in enumerate(per_window)
    ]


def test_a_provider_without_errors_is_fully_healthy() -> None:
    scored = score(_windows((20, 0), (20, 0)), NOW)
    assert (scored.health, scored.calls, scored.rate) == (1.0, 40, 4.0)
    assert scored.latency == pytest.approx(0.1)


def test_too_few_calls_to_judge_count_as_healthy() -> None:
    assert score(_windows((3, 3)), NOW).health == 1.0


def test_a_provider_failing_thirty_percent_is_below_the_demotion_line_within_a_few_windows() -> (
    None
):
    """The issue's case: 30 % of calls failing loses the provider its place quickly."""
    healthy = [(20, 0)] * 10
    after = [score(_windows(*healthy, *[(20, 6)] * n), NOW).health for n in (1, 2, 3, 4)]
    assert after[0] > 0.8 and after[-1] < 0.8
    assert after == sorted(after, reverse=True)


def test_a_recovered_provider_climbs_back_above_the_line() -> None:
    failing = [(20, 6)] * 10
    assert score(_windows(*failing, *[(20, 0)] * 4), NOW).health >= 0.8


def test_windows_without_calls_carry_no_information() -> None:
    with_gaps = _windows((20, 10), (0, 0), (0, 0), (20, 10))
    assert score(with_gaps, NOW).health == score(_windows((20, 10), (20, 10)), NOW).health


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 600)), max_size=30))
def test_health_is_always_between_0_and_1(per_window: list[tuple[int, int]]) -> None:
    """Even with more errors than calls (windows are counters added by many processes)."""
    assert 0.0 <= score(_windows(*per_window), NOW).health <= 1.0


def test_a_circuit_opens_cools_down_probes_and_closes() -> None:
    state = next_circuit(CircuitState(), 0.4, NOW)
    assert state == CircuitState("open", NOW)
    assert next_circuit(state, 0.9, NOW + timedelta(seconds=COOL_DOWN - 1)).state == "open"
    half = next_circuit(state, 0.4, NOW + timedelta(seconds=COOL_DOWN))
    assert half.state == "half_open"
    assert next_circuit(half, 0.6, NOW + timedelta(seconds=COOL_DOWN + 5)).state == "half_open"
    assert next_circuit(half, 0.85, NOW + timedelta(seconds=COOL_DOWN + 5)).state == "closed"


def test_a_half_open_circuit_whose_probes_keep_failing_opens_again() -> None:
    half = CircuitState("half_open", NOW)
    assert next_circuit(half, 0.3, NOW + timedelta(seconds=1), probed=3).state == "half_open"
    assert next_circuit(half, 0.3, NOW + timedelta(seconds=COOL_DOWN), probed=3).state == "open"


def test_a_half_open_circuit_no_probe_reached_stays_half_open() -> None:
    """The score is still the one that opened it: nothing new says the provider is down."""
    half = CircuitState("half_open", NOW)
    later = NOW + timedelta(seconds=10 * COOL_DOWN)

    assert next_circuit(half, 0.3, later, probed=0) == half


def test_only_windows_begun_after_the_circuit_went_half_open_are_its_probes() -> None:
    windows = [
        Window(NOW, calls=40, errors=20, latency_ms=0),
        Window(NOW + timedelta(seconds=WINDOW), calls=2, errors=2, latency_ms=0, events=1),
    ]

    assert seen_since(windows, NOW + timedelta(seconds=1)) == 3
    assert seen_since(windows, NOW + timedelta(seconds=WINDOW)) == 0
    assert seen_since(windows, None) == 0


def test_a_healthy_closed_circuit_stays_closed() -> None:
    assert next_circuit(CircuitState(), 0.7, NOW) == CircuitState()


@pytest.mark.parametrize(
    ("health", "circuits", "draw", "chain"),
    [
        ({}, {}, 0.5, ("sg", "mg")),
        ({"sg": 0.7}, {}, 0.5, ("mg", "sg")),
        ({"sg": 0.7}, {}, PROBE_SHARE / 2, ("sg", "mg")),
        ({"sg": 0.9}, {"sg": "open"}, 0.0, ("mg",)),
        ({}, {"sg": "half_open"}, 0.5, ("mg", "sg")),
        ({}, {"sg": "half_open"}, 0.0, ("sg", "mg")),
        ({}, {"sg": "open", "mg": "open"}, 0.5, ("sg", "mg")),
        ({"sg": 0.7, "mg": 0.6}, {}, 0.5, ("sg", "mg")),
    ],
)
def test_the_chain_is_ordered_by_health_within_the_operators_order(
    health: dict[str, float], circuits: dict[str, str], draw: float, chain: tuple[str, ...]
) -> None:
    assert order(("sg", "mg"), health, circuits, draw) == chain  # type: ignore[arg-type]


def test_a_tally_sums_calls_per_provider_and_window_and_empties_when_taken() -> None:
    tally = Tally()
    tally.count("sg", NOW, error=False, seconds=0.2)
    tally.count("sg", NOW, error=True, seconds=0.4)
    tally.count("mg", NOW + timedelta(seconds=WINDOW), error=False, seconds=0.1)

    taken = tally.take()

    assert taken[("sg", window_start(NOW))] == [2, 1, 600]
    assert len(taken) == 2 and tally.take() == {}


def _reported(*per_window: tuple[int, int, int]) -> list[Window]:
    """Oldest first: (events, drops, deferrals) the webhooks reported per window, no calls."""
    last = window_start(NOW) - timedelta(seconds=WINDOW)
    count = len(per_window)
    return [
        Window(last - timedelta(seconds=WINDOW * (count - 1 - i)), 0, 0, 0, ev, dr, de)
        for i, (ev, dr, de) in enumerate(per_window)
    ]


def test_drops_on_the_providers_side_reported_by_webhooks_lower_its_health() -> None:
    scored = score(_windows((20, 0), (20, 0)) + _reported((50, 25, 0), (50, 25, 0)), NOW)

    assert (scored.health, scored.reported_failures) == (0.5, 0.5)


def test_a_deferral_counts_half_a_drop() -> None:
    assert score(_reported((40, 0, 40)), NOW).health == 0.5


def test_too_few_reported_events_to_judge_count_as_healthy() -> None:
    assert score(_reported((MIN_EVENTS - 1, MIN_EVENTS - 1, 0)), NOW).health == 1.0


def test_slow_calls_cost_health_from_the_slow_line_up_to_the_latency_weight() -> None:
    assert score(_windows((20, 0), latency_ms=int(SLOW * 1000)), NOW).health == 1.0
    slower = score(_windows((20, 0), latency_ms=int((SLOW + VERY_SLOW) / 2 * 1000)), NOW)
    assert slower.health == 1.0 - LATENCY_WEIGHT / 2
    slowest = score(_windows((20, 0), latency_ms=int(VERY_SLOW * 3000)), NOW)
    assert slowest.health == 1.0 - LATENCY_WEIGHT


def test_reports_count_fates_per_provider_and_window_but_not_engagement() -> None:
    reports = Reports()
    for kind, side in [("delivered", False), ("dropped", True), ("dropped", False),
                       ("deferred", False), ("opened", False), ("sent", False)]:  # fmt: skip
        reports.count("sg", NOW, kind, provider_side=side)

    assert reports.take() == {("sg", window_start(NOW)): [4, 1, 1]}
    assert reports.take() == {}


def test_the_thresholds_are_the_operators() -> None:
    strict = HealthRules(open_below=0.7, demote_below=0.95, cool_down=5, probe_share=0.5)

    assert next_circuit(CircuitState(), 0.6, NOW, strict).state == "open"
    assert next_circuit(CircuitState(), 0.6, NOW).state == "closed"
    assert order(("sg", "mg"), {"sg": 0.9}, {}, 0.9, strict) == ("mg", "sg")
    assert order(("sg", "mg"), {"sg": 0.9}, {}, 0.4, strict) == ("sg", "mg")  # a probe


class _Windows:
    """The shared windows' reported counts, as ``HealthStore.add_reported`` adds them; the
    next ``failures`` adds raise as Cassandra down."""

    def __init__(self) -> None:
        self.added: list[tuple[str, datetime, int, int, int]] = []
        self.failures = 0
        self.some_added = asyncio.Event()

    async def add_reported(
        self, provider: str, start: datetime, events: int, drops: int, deferrals: int
    ) -> None:
        if self.failures:
            self.failures -= 1
            raise DependencyUnavailable("cassandra", "timeout")
        self.added.append((provider, start, events, drops, deferrals))
        self.some_added.set()


class _Rounds(Reports):
    """Reports that count the flush loop's rounds (each round takes what was counted)."""

    rounds = 0

    def take(self) -> dict[tuple[str, datetime], list[int]]:
        self.rounds += 1
        return super().take()


async def _for(seconds: float) -> None:
    """Let the flush loop run for ``seconds``."""
    await asyncio.sleep(seconds)


async def test_reports_are_added_a_flush_after_the_first_count_and_nothing_is_done_idle() -> None:
    """With nothing counted the flush loop sleeps (no round, no write); the first count
    brings a round ``every`` later that adds it, a failed add is retried the next round."""
    reports, windows = _Rounds(), _Windows()
    loop = asyncio.create_task(reports.keep_adding(windows, every=0.01))  # type: ignore[arg-type]
    await _for(0.05)
    idle = reports.rounds

    windows.failures = 1
    reports.count("sg", NOW, "dropped", provider_side=True)
    # Two rounds (the failed add and its retry), however late a loaded machine runs them.
    await asyncio.wait_for(windows.some_added.wait(), timeout=30)
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop

    assert idle == 0
    assert windows.added == [("sg", window_start(NOW), 1, 1, 0)]
    assert reports.take() == {}
