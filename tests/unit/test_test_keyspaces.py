"""Which keyspaces a test run's sweep drops (tests/keyspaces.py): only test keyspaces, those
whose run is gone (after a grace) and any older than a run can last; never one it cannot date
unless its run is gone, and never the service's own."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.util import uuid_from_time

from tests.keyspaces import GRACE, LONGEST_RUN, NAME, Found, created_at, name_for, stale

NOW = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
LIVE, GONE = 4242, 4343


def alive(pid: int) -> bool:
    return pid == LIVE


def found(name: str, age: timedelta | None) -> Found:
    return Found(name, None if age is None else NOW - age)


def test_a_new_name_is_a_test_keyspace_naming_its_run() -> None:
    name = name_for("p", "gw1", LIVE)
    match = NAME.match(name)
    assert match is not None and match["pid"] == str(LIVE)
    assert len(name) <= 48  # Cassandra's limit for a keyspace name


@pytest.mark.parametrize(
    ("name", "age", "dropped"),
    [
        (f"t_gw0_{GONE}_0123abcd", GRACE + timedelta(seconds=1), True),
        (f"p_main_{GONE}_0123abcd", None, False),
        (f"t_gw0_{GONE}_0123abcd", GRACE - timedelta(seconds=1), False),
        (f"t_gw0_{LIVE}_0123abcd", LONGEST_RUN - timedelta(seconds=1), False),
        (f"t_gw0_{LIVE}_0123abcd", LONGEST_RUN + timedelta(seconds=1), True),
        ("p_gw1_0123456789", LONGEST_RUN + timedelta(seconds=1), True),
        ("p_gw1_0123456789", LONGEST_RUN - timedelta(seconds=1), False),
        ("p_gw1_0123456789", None, False),
        ("safedelivr", LONGEST_RUN * 10, False),
        ("system_auth", None, False),
        (f"m_{GONE}_0123abcd", LONGEST_RUN * 10, False),
    ],
)
def test_the_sweep_drops_only_what_a_gone_run_left(
    name: str, age: timedelta | None, dropped: bool
) -> None:
    assert stale(found(name, age), NOW, alive) is dropped


def test_a_tables_time_uuid_dates_it() -> None:
    made = datetime(2026, 11, 29, 18, 5, 47, 582000, tzinfo=UTC)
    dated = created_at(uuid_from_time(made))
    assert dated is not None and abs(dated - made) < timedelta(milliseconds=1)
    assert created_at(uuid.uuid4()) is None
