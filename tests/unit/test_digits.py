"""Unsigned decimal numbers from untrusted text: ASCII digits only, bounded in length."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.digits import MAX_DIGITS, natural


@pytest.mark.parametrize(
    ("text", "number"), [("0", 0), ("7", 7), ("0042", 42), ("9" * 18, 10**18 - 1)]
)
def test_ascii_digits_are_a_number(text: str, number: int) -> None:
    assert natural(text) == number


@pytest.mark.parametrize(
    "text", ["", None, "²", "٣", "\uff11", " 3", "3 ", "+3", "-3", "3_000", "3.0", "0x1", "1e3"]
)
def test_anything_else_is_none(text: str | None) -> None:
    """Unicode digits pass ``str.isdigit()`` and then make ``int()`` raise; signs, blanks and
    underscores pass ``int()``. None of them is a count."""
    assert natural(text) is None


def test_a_number_longer_than_the_limit_is_none() -> None:
    assert natural("1" * (MAX_DIGITS + 1)) is None
    assert natural("123", max_digits=2) is None


@given(st.text(max_size=30))
def test_any_text_is_a_number_or_none_and_never_an_error(text: str) -> None:
    number = natural(text)
    if number is not None:
        assert text.isascii() and int(text) == number >= 0
