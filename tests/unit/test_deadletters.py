"""How the dead-letter tool describes one dead letter (``shared.deadletters.describe``): one
line an operator can read whatever the message carries."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.deadletters import describe


def test_a_dead_letter_names_its_key_why_it_died_where_and_its_body() -> None:
    headers = {"x-death": [{"reason": "delivery_limit", "queue": "safedelivr.sg", "count": 1}]}
    line = describe("sg.4f1c", headers, b'{"batch_id": "4f1c"}')
    assert line == (
        'sg.4f1c  reason=delivery_limit queue=safedelivr.sg  body=b\'{"batch_id": "4f1c"}\''
    )


def test_the_most_recent_death_is_the_one_described() -> None:
    """RabbitMQ puts the latest death first in ``x-death``."""
    headers = {
        "x-death": [
            {"reason": "rejected", "queue": "safedelivr.mg"},
            {"reason": "expired", "queue": "safedelivr.delay.5s"},
        ]
    }
    assert "reason=rejected queue=safedelivr.mg" in describe("mg.1", headers, b"")


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-death": None}, {"x-death": []}, {"x-death": ["not a table"]}, {"x-death": [{}]}],
)
def test_a_dead_letter_without_a_usable_death_record_still_gets_a_line(
    headers: dict[str, Any],
) -> None:
    """A message published straight to the dead-letter exchange has no ``x-death``."""
    assert describe("sg.1", headers, b"x") == "sg.1  reason=? queue=?  body=b'x'"


@pytest.mark.parametrize("death", [{"reason": "rejected", "queue": "q"}, 5])
def test_a_malformed_x_death_header_does_not_break_the_description(death: object) -> None:
    """Any client can publish to the dead-letter exchange with an ``x-death`` of its own."""
    assert describe("sg.1", {"x-death": death}, b"x") == "sg.1  reason=? queue=?  body=b'x'"


def test_an_undecodable_body_is_shown_escaped() -> None:
    line = describe("batch.1", {}, b"\xff\xfe\x00\n{")
    assert line.endswith("body=b'\\xff\\xfe\\x00\\n{'")


def test_a_long_body_is_cut_to_its_first_120_bytes() -> None:
    line = describe("batch.1", {}, b"a" * 119 + b"Z" + b"b" * 5000)
    assert line.endswith("body=b'" + "a" * 119 + "Z'")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.text(max_size=60),
    body=st.binary(max_size=400),
    deaths=st.lists(
        st.dictionaries(
            st.sampled_from(["reason", "queue", "count", "time"]),
            # RabbitMQ's own values: reasons and queue names, never control characters.
            st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=20) | st.integers(),
        ),
        max_size=3,
    ),
)
def test_the_description_is_always_one_line_starting_with_the_key(
    key: str, body: bytes, deaths: list[dict[str, Any]]
) -> None:
    """Whatever the body holds (newlines included), a listing stays one line per message."""
    line = describe(key, {"x-death": deaths}, body)
    assert line.startswith(key)
    assert "\n" not in line.removeprefix(key)
    assert len(line) - len(key) < 120 * 4 + 200
