"""A service process hands the GIL to a waiting thread (its event loop) within a fraction of
a millisecond, not CPython's 5 ms (``shared.gil``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from shared.gil import SWITCH_INTERVAL, shorten_switch_interval


@pytest.fixture
def interval_restored() -> Iterator[None]:
    saved = sys.getswitchinterval()
    yield
    sys.setswitchinterval(saved)


@pytest.mark.usefixtures("interval_restored")
def test_a_service_process_switches_threads_at_least_ten_times_as_often() -> None:
    """After the entry point's call, the interval is at most a tenth of CPython's default."""
    shorten_switch_interval()

    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
    assert sys.getswitchinterval() <= 0.005 / 10
