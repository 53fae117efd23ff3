"""Click-tracking link rewriting (``shared.engagement.link_rewrite``): only absolute http(s) links
of ``<a>``/``<area>``, everything else byte for byte."""

from __future__ import annotations

import re
from typing import SupportsIndex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.engagement.link_rewrite import MAX_LINKS, rewrite, tags


def _t(i: int) -> str:
    return f"https://t.example/c/{i}"


def test_links_are_rewritten_in_order_and_kept_as_followed() -> None:
    source = (
        '<p><a href="https://shop.example/a?x=1&amp;y=2">A</a> '
        "<A HREF='http://shop.example/b'>B</A> "
        "<a class=x href=https://shop.example/c>C</a></p>"
    )

    out, links = rewrite(source, _t)

    assert links == [
        "https://shop.example/a?x=1&y=2",
        "http://shop.example/b",
        "https://shop.example/c",
    ]
    assert out == (
        '<p><a href="https://t.example/c/0">A</a> '
        '<A HREF="https://t.example/c/1">B</A> '
        '<a class=x href="https://t.example/c/2">C</a></p>'
    )


def test_other_links_stay_as_they_are() -> None:
    source = (
        '<a href="mailto:hi@shop.example">m</a><a href="tel:+1">t</a><a href="#top">x</a>'
        '<a href="/relative">r</a><a name="n">n</a><img src="https://shop.example/i.png">'
        '<a href="https://shop.example/-name-">personal</a>'
        '<a data-href="https://shop.example/d">d</a>'
    )

    out, links = rewrite(source, _t, keys=["-name-"])

    assert out == source
    assert links == ["https://shop.example/-name-"]  # numbered, never rewritten


def test_numbering_does_not_depend_on_the_keys() -> None:
    source = '<a href="https://s.example/-id-">1</a><a href="https://s.example/b">2</a>'

    out, links = rewrite(source, _t, keys=["-id-"])

    assert out == '<a href="https://s.example/-id-">1</a><a href="https://t.example/c/1">2</a>'
    assert links == rewrite(source, _t)[1]


def test_a_url_seen_twice_is_two_links() -> None:
    source = '<a href="https://s.example/">1</a><a href="https://s.example/">2</a>'

    assert rewrite(source, _t)[1] == ["https://s.example/", "https://s.example/"]


def test_beyond_the_limit_links_stay() -> None:
    source = '<a href="https://s.example/">x</a>' * (MAX_LINKS + 3)

    out, links = rewrite(source, _t)

    assert len(links) == MAX_LINKS and out.endswith('<a href="https://s.example/">x</a>' * 3)


@given(st.text())
def test_text_without_links_is_untouched(text: str) -> None:
    source = text.replace("<", "&lt;")

    assert rewrite(source, _t) == (source, [])


# The tag the rewriter always matched, as a regular expression: the scanner must find exactly
# these (the tracking endpoint numbers the links of mail already sent by them).
_TAG_AS_WAS = re.compile(r"<(?:a|area)\b[^>]*>", re.IGNORECASE)


@settings(deadline=None)  # a loaded machine is no failure
@given(st.text(alphabet="<>aArReE h=\"'/_1é\n", max_size=60))
def test_the_scanner_finds_the_tags_the_regular_expression_found(text: str) -> None:
    """The scanner finds exactly the tags ``<(?:a|area)\\b[^>]*>`` finds, in order."""
    assert list(tags(text)) == [m.span() for m in _TAG_AS_WAS.finditer(text)]


class _CountedText(str):
    """A text that counts the characters its ``find`` calls read."""

    read = 0

    def find(
        self, sub: str, start: SupportsIndex | None = None, *rest: SupportsIndex | None
    ) -> int:
        found = super().find(sub, start, *rest)
        begin = 0 if start is None else int(start)
        self.read += (found + len(sub) if found >= 0 else len(self)) - begin
        return found


@pytest.mark.parametrize(
    "unit", ["<a ", "<a", "<area ", "<A\t", "<a <", "<abc <a", "<a href='x", "<<", "<a>"]
)
def test_scanning_reads_each_character_at_most_twice(unit: str) -> None:
    """However tags are left unclosed, finding them reads each character at most twice."""
    text = _CountedText(unit * 20_000)

    found = list(tags(text))

    assert 0 < text.read <= 2 * len(text)
    assert len(found) == (20_000 if unit == "<a>" else 0)


def test_a_megabyte_of_unclosed_tags_after_a_link_keeps_the_link() -> None:
    """A link before a megabyte of unclosed ``<a`` is rewritten and the rest kept as it is."""
    tail = "<a " * 350_000
    source = '<a href="https://s.example/">x</a>' + tail

    out, links = rewrite(source, _t)

    assert links == ["https://s.example/"]
    assert out == '<a href="https://t.example/c/0">x</a>' + tail
