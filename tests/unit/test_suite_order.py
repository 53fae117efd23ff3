"""The order ``make test`` hands its groups of tests to the workers (tests/conftest.py): some
unit tests first, while the workers' keyspaces migrate, then the rest as xdist orders it."""

from __future__ import annotations

from tests.conftest import units_first

GROUPS = [
    "tests/integration/test_caps.py",
    "tests/unit/test_docs.py::test_one",
    "tests/contracts/test_stores.py",
    "tests/unit/test_docs.py::test_two",
    "browser",
    "tests/unit/test_layers.py::test_three",
]


def test_the_first_unit_tests_go_first_and_the_rest_keep_their_order() -> None:
    assert units_first(GROUPS, 2) == [
        "tests/unit/test_docs.py::test_one",
        "tests/unit/test_docs.py::test_two",
        "tests/integration/test_caps.py",
        "tests/contracts/test_stores.py",
        "browser",
        "tests/unit/test_layers.py::test_three",
    ]


def test_every_group_is_handed_out_once() -> None:
    for count in (0, 1, 3, 10):
        assert sorted(units_first(GROUPS, count)) == sorted(GROUPS)
