"""Literal key substitution (``shared.core.substitution``): the longest key at each position, in
one pass, in time proportional to the text and the keys."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.substitution import CLASS_LIMIT, Substitution
from shared.providers.envelope import replace_keys


def _as_was(text: str, replacements: Mapping[str, str]) -> str:
    """The alternation of every key, longest first: what substitution always meant."""
    keys = sorted((k for k in replacements if k), key=len, reverse=True)
    if not keys or not text:
        return text
    pattern = re.compile("|".join(re.escape(k) for k in keys))
    return pattern.sub(lambda m: replacements[m.group(0)], text)


# Few characters, so keys overlap, nest and share prefixes; some are regex metacharacters.
_CHARS = "ab.*|\\(%-"
_keys = st.dictionaries(
    st.text(alphabet=_CHARS, max_size=5), st.text(alphabet="XY%a", max_size=3), max_size=12
)


@settings(deadline=None)  # a loaded machine is no failure
@given(text=st.text(alphabet=_CHARS, max_size=40), replacements=_keys)
def test_the_result_is_the_longest_first_alternation(
    text: str, replacements: dict[str, str]
) -> None:
    """Any keys over any text give what the longest-first alternation of the keys gave."""
    assert replace_keys(text, replacements) == _as_was(text, replacements)


@settings(deadline=None)
@given(texts=st.lists(st.text(alphabet=_CHARS, max_size=20), max_size=3), replacements=_keys)
def test_every_key_occurring_is_found_overlapping_ones_too(
    texts: list[str], replacements: dict[str, str]
) -> None:
    """The keys occurring in texts are every key found anywhere in them, however they
    overlap."""
    expected = {k for k in replacements if k and any(k in t for t in texts)}

    assert Substitution(replacements).occurring(texts) == expected


@settings(deadline=None)  # a loaded machine is no failure
@given(text=st.text(alphabet=_CHARS, max_size=40), replacements=_keys)
def test_a_key_is_found_in_a_text_where_one_occurs(text: str, replacements: dict[str, str]) -> None:
    """A text holds a key exactly when one of the keys occurs in it."""
    assert Substitution(replacements).found_in(text) == any(k and k in text for k in replacements)


def test_of_keys_that_are_prefixes_of_each_other_the_longest_wins() -> None:
    """Where keys that are prefixes of each other start, the longest that fits is replaced."""
    keys = {"a": "1", "ab": "2", "abc": "3", "abcde": "5"}

    assert replace_keys("abcd abcde ab a abx", keys) == "3d 5 2 1 2x"


def test_keys_with_regex_metacharacters_are_literal() -> None:
    """Keys are matched as written, whatever regular expressions would make of them."""
    keys = {".*": "A", "(x)": "B", "[a]": "C", "\\d": "D", "a|b": "E", "^$": "F"}

    assert replace_keys("x.*y(x)[a]\\d1a|b^$ab", keys) == "xAyBCD1EFab"


def test_adjacent_keys_are_each_replaced() -> None:
    """Keys written one after another are replaced one after another."""
    keys = {"-a-": "A", "-b-": "B", "%x%": "X"}

    assert replace_keys("-a--b-%x%%x%-a-", keys) == "ABXXA"


def test_text_that_is_no_key_is_left_alone() -> None:
    """Key-like text whose key is not given stays as written."""
    keys = {"{{first}}": "Ann"}

    assert replace_keys("{{first}} {{last}} {{first", keys) == "Ann {{last}} {{first"


def test_the_keys_replaced_are_reported() -> None:
    """Only the keys found in a text are reported as used."""
    used: set[str] = set()

    Substitution({"-a-": "A", "-b-": "B", "-c-": "C"}).apply("-a- and -c-", used)

    assert used == {"-a-", "-c-"}


def test_many_first_characters_are_looked_for_without_a_class() -> None:
    """Keys starting with more distinct characters than a class holds are still found."""
    keys = {chr(0x4E00 + i) + "!": str(i) for i in range(CLASS_LIMIT + 10)}
    text = "".join(chr(0x4E00 + i) + ("!" if i % 2 else "?") for i in range(CLASS_LIMIT + 10))

    assert replace_keys(text, keys) == _as_was(text, keys)


def test_what_is_prepared_holds_one_entry_per_key() -> None:
    """The prepared keys hold one entry per key, however long or alike the keys are."""
    keys = {"a" * n + "b": "x" for n in range(128)}

    assert Substitution(keys).size == len(keys) + 1  # and the root


def test_a_hundred_thousand_keys_alike_over_a_megabyte_are_not_each_tried_everywhere() -> None:
    """100,000 keys sharing their first 20 characters with a megabyte of text are not each
    tried at each of its positions (that was 10^11 character comparisons, some minutes)."""
    rnd = random.Random(33)
    keys = {"a" * 20 + "".join(rnd.choices("bcdefgh", k=5)): "X" for _ in range(100_000)}
    keys["aaa"] = "3"
    text = "a" * 1_000_000 + "b"

    out = replace_keys(text, keys)

    assert out == "3" * (1_000_000 // 3) + "a" * (1_000_000 % 3) + "b"
