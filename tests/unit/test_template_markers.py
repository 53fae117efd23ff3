"""Finding the per-recipient markers of a rendered template (``shared.templates.template_use``): the
markers a regular expression always found, in one pass whatever the text."""

from __future__ import annotations

import re
from typing import SupportsIndex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.models import TemplateCopy
from shared.templates import template_use
from shared.templates.template_render import RenderError
from shared.templates.template_use import Source, markers_of

# The markers the check always matched, as a regular expression: the scanner must find
# exactly these (a copy passes or is refused as it was, and a subject's variables are the same).
_MARKER_AS_WAS = re.compile(r"\[\[sd\.([a-z])\.([^\]]*)\]\]", re.IGNORECASE)

# The characters the expression branches on, with those its letters match in any case (long
# s, U+017F, is an "s"; the Kelvin sign, U+212A, a "k"; dotless i, U+0131, and dotted capital
# I, U+0130, an "i"), and pieces of markers, so that random texts often hold whole heads.
_ODD = "\u017f\u212a\u0131\u0130"
_PIECES = ["[[sd.", "[[SD.", "[[\u017fd.", "[[sd.h.", "[[Sd.T.", "[[sd.\u212a.", "[[sd.\u0130."]
_CHARACTERS = "[]sSdDhHtT.x_1 \n" + _ODD
_TEXTS = st.one_of(
    st.text(alphabet=_CHARACTERS, max_size=60),
    st.lists(st.sampled_from([*_PIECES, *_CHARACTERS, "]]", "[["]), max_size=25).map("".join),
)


@settings(deadline=None)  # a loaded machine is no failure
@given(_TEXTS)
def test_the_scanner_finds_the_markers_the_regular_expression_found(text: str) -> None:
    """The scanner finds exactly the markers ``\\[\\[sd\\.([a-z])\\.([^\\]]*)\\]\\]`` finds."""
    assert [(m.start, m.end, m.part, m.name) for m in markers_of(text)] == [
        (m.start(), m.end(), m.group(1), m.group(2)) for m in _MARKER_AS_WAS.finditer(text)
    ]


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
    ("unit", "closed"),
    [
        ("[[sd.h.x", False),
        ("[[sd.h.", False),
        ("[[sd.h.x]", False),
        ("[[sd.h.]", False),
        ("[[sd.h.x[[", False),
        ("[[sd.h.x ]", False),
        ("[[sd.", False),
        ("[[sd.hh", False),
        ("[[[", False),
        ("[", False),
        ("[[sd.h.x]]", True),
        ("[[sd.h.x]]]", True),
    ],
)
def test_scanning_reads_each_character_at_most_twice(unit: str, closed: bool) -> None:
    """However markers are left unclosed, finding them reads each character at most twice."""
    text = _CountedText(unit * 20_000)

    found = list(markers_of(text))

    assert 0 < text.read <= 2 * len(text)
    assert len(found) == (20_000 if closed else 0)


def test_a_megabyte_of_unclosed_markers_is_refused_as_cut() -> None:
    """A rendered html of a megabyte of unclosed markers is refused as a cut marker, within
    the suite's per-test timeout (the regular expression took about 12 minutes)."""
    blob = "[[sd.h.x" * 124_999  # just under a rendered part's limit of 1,000,000 characters

    with pytest.raises(RenderError, match="cut or transformed"):
        template_use.render_once(Source(1, "Hi", "{{ blob }}", None), {"blob": blob}, ())


def test_the_variables_of_a_subject_are_those_of_its_markers_in_either_copy() -> None:
    """A subject's per-recipient variables are the names its markers hold, in the live copy
    and the canary's, and none of those of the bodies."""
    live = TemplateCopy(version=1, subject="Hi [[sd.t.first]]", html="[[sd.h.plan]]")
    canary = TemplateCopy(version=2, subject="[[sd.t.first]] [[sd.t.last]]", text="[[sd.t.x]]")

    assert template_use.subject_variables([live, None, canary]) == {"first", "last"}
