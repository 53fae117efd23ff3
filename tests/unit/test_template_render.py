"""Rendering users' templates (``shared.templates.template_render``): sandboxed, limited, with a
text part derived from the html."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markupsafe import Markup

from shared.templates import template_render
from shared.templates.template_limits import MAX_RANGE
from shared.templates.template_render import (
    CompiledParts,
    RenderError,
    compile_part,
    render,
    render_part,
    text_of,
)


def test_a_version_renders_each_part_with_the_recipients_data() -> None:
    out = render("Hi {{ name }}", "<p>Hello <b>{{ name }}</b></p>", None, {"name": "Ann & <Bob>"})

    assert out.subject == "Hi Ann & <Bob>"  # subjects are not html
    assert out.html == "<p>Hello <b>Ann &amp; &lt;Bob&gt;</b></p>"  # html autoescapes
    assert out.text == "Hello Ann & <Bob>"


def test_a_text_part_of_its_own_wins_over_the_derived_one() -> None:
    assert render("s", "<p>x</p>", "plain {{ n }}", {"n": 1}).text == "plain 1"


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("{{ name.__class__.__mro__ }}", "not allowed"),
        ("{{ ''.__class__.__subclasses__() }}", "not allowed"),
        ("{{ cycler.__init__.__globals__ }}", "not allowed"),
        ("{% for i in range(10000000) %}x{% endfor %}", f"limited to {MAX_RANGE}"),
        ("{{ missing }}", "missing"),
        ("{% if %}", "line 1"),
        ("{{ items.append(1) }}", "not allowed"),
    ],
)
def test_what_a_sandbox_refuses_is_a_render_error_naming_it(source: str, problem: str) -> None:
    with pytest.raises(RenderError, match=problem):
        render_part(source, {"name": "x", "items": [1]})


def test_output_past_the_limit_stops_the_render() -> None:
    with pytest.raises(RenderError, match="passes 100 characters"):
        render_part("{% for i in range(1000) %}{{ i }}{% endfor %}", {}, max_output=100)


def test_a_render_past_its_time_stops() -> None:
    ticks = itertools.count(step=0.3)

    with pytest.raises(RenderError, match=r"longer than 0\.5 s"):
        render_part("{% for i in range(100) %}{{ i }}{% endfor %}", {}, clock=lambda: next(ticks))


def test_the_derived_text_keeps_links_lines_and_lists_readable() -> None:
    source = (
        "<html><head><title>t</title><style>p{}</style></head><body>"
        "<h1>Sale</h1><p>See <a href='https://s.example/a'>the sale</a> &amp; more.</p>"
        "<ul><li>one</li><li>two</li></ul><script>x()</script>"
        '<p><a href="https://s.example/b">https://s.example/b</a></p></body></html>'
    )

    assert text_of(source) == (
        "Sale\nSee the sale (https://s.example/a) & more.\n\n- one\n- two\nhttps://s.example/b"
    )


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'x'|truncate(-1) }}",  # AssertionError inside the filter
        "{{ 'a'|xmlattr }}",  # AttributeError
        "{{ x.items()|first|attr('y') }}",
        "{{ {}|dictsort(by='nope') }}",
        "{{ [1, 'a']|sort }}",
    ],
)
def test_any_exception_a_template_raises_is_a_render_error(source: str) -> None:
    """Whatever Python raises while a user's template renders is a RenderError, not a crash."""
    with pytest.raises(RenderError):
        render_part(source, {"x": {"a": 1}})


@pytest.mark.parametrize(
    "source", ["{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "{% if 1 %}" * 3000]
)
def test_a_source_nested_too_deeply_is_a_render_error(source: str) -> None:
    """Parsing or compiling a deeply nested source is a RenderError (no RecursionError leaks)."""
    with pytest.raises(RenderError):
        compile_part(source, html_part=False)


@pytest.mark.parametrize("name", ["__safedelivr_steps", "__safedelivr_x"])
def test_the_sandbox_s_own_names_are_refused(name: str) -> None:
    """A template cannot read or shadow the names the sandbox keeps for itself."""
    with pytest.raises(RenderError, match="reserved"):
        render_part(f"{{% set {name} = 1 %}}{{% for i in [1] %}}{{{{ i }}}}{{% endfor %}}", {})


def test_compiled_parts_compile_a_source_once_and_render_it_with_each_data() -> None:
    """A source compiled once renders anew with each data, under its own clock each time."""
    parts = CompiledParts()

    first = render_part("Hi {{ n }}", {"n": 1}, parts=parts)
    second = render_part("Hi {{ n }}", {"n": 2}, parts=parts)

    assert (first, second, len(parts)) == ("Hi 1", "Hi 2", 1)


def test_compiled_parts_keep_failures_and_stay_within_their_bounds() -> None:
    """A source that does not compile fails the same way again; the oldest entries go first."""
    parts = CompiledParts(max_entries=2)

    for _ in range(2):
        with pytest.raises(RenderError, match="line 1"):
            parts.get("{{", html_part=False)
    parts.get("a", html_part=False)
    parts.get("b", html_part=False)

    assert len(parts) == 2


@pytest.mark.parametrize(
    "source",
    [
        "<a href=x>" * 100_000,
        "<script>" * 100_000,
        "<" * 500_000,
        "<a " * 300_000,
        "<style>x" * 100_000,
    ],
)
def test_deriving_text_from_unclosed_tags_is_fast(source: str) -> None:
    """A megabyte of unclosed tags is read to the end and its text derived (how the time
    grows is make hostile's figure; a quadratic reading fails by the per-test timeout)."""
    text = text_of(source)

    assert isinstance(text, str)


def test_deriving_text_checks_the_clock_as_it_goes() -> None:
    """Text derivation calls its check while it walks the tags, so a deadline can stop it."""
    calls = itertools.count()

    def check() -> None:
        if next(calls) > 3:
            raise RenderError("too slow")

    with pytest.raises(RenderError, match="too slow"):
        text_of("<p>x</p>" * 10_000, check=check)


def test_concatenation_escapes_in_html_as_jinja_does() -> None:
    """``~`` (checked by the sandbox) keeps Jinja2's escaping: markup stays, text is escaped."""
    out = render_part(
        "{{ m ~ '<' ~ 1 }}|{{ s ~ '>' }}", {"m": Markup("<i>"), "s": "<"}, html_part=True
    )

    assert out == "<i>&lt;1|&lt;&gt;"


# The tag name text derivation always read, as a regular expression: the possessive one must
# read exactly it (a derived text part is the same).
_TAG_NAME_AS_WAS = re.compile(r"\s*(/?)\s*([A-Za-z][A-Za-z0-9]*)")


@settings(deadline=None)  # a loaded machine is no failure
@given(st.text(alphabet=" \t\n/aZ1-<>", max_size=40))
def test_a_tag_name_is_read_as_the_regular_expression_read_it(inside: str) -> None:
    """The tag name pattern matches what ``\\s*(/?)\\s*([A-Za-z][A-Za-z0-9]*)`` matched."""
    was, now = _TAG_NAME_AS_WAS.match(inside), template_render._TAG_NAME.match(inside)

    assert (was and (was.span(), was.groups())) == (now and (now.span(), now.groups()))


HALF = 500_000


@pytest.mark.parametrize("blanks", [" " * 2 * HALF, "\t\n" * HALF, " " * HALF + "/" + " " * HALF])
def test_a_tag_of_a_megabyte_of_blanks_is_read_and_derives_no_text(blanks: str) -> None:
    """A tag of a megabyte of blanks (a slash among them or not) is read within the suite's
    per-test timeout and derives no text (``\\s*(/?)\\s*`` backtracked over them: days)."""
    assert text_of("x<" + blanks + ">y") == "xy"
