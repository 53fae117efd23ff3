"""Hostile templates stop fast (``shared.templates.template_limits`` and the checks
``shared.templates.template_render`` makes with them): loops nested to work without output run out
of time, and one step that would ask for gigabytes is refused before it runs."""

from __future__ import annotations

import itertools
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.templates.template_limits import Exceeded, check_percent_format, percent_specs
from shared.templates.template_render import RenderError, render_part

NESTED = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}ok"


@pytest.mark.parametrize(
    "source",
    [
        NESTED,
        "{% for i in range(9) recursive %}{% if loop.depth < 9 %}{{ loop(range(9999)) }}"
        "{% endif %}{% endfor %}",
    ],
)
def test_loops_that_work_without_output_run_out_of_time(source: str) -> None:
    """Nested and recursive loops that yield nothing still stop at the time limit."""
    with pytest.raises(RenderError, match=r"longer than 0\.5 s"):
        render_part(source, {})


def test_a_loop_step_checks_the_clock() -> None:
    """The clock is read at loop steps, not only between output chunks."""
    ticks = itertools.count(step=0.3)

    with pytest.raises(RenderError, match=r"longer than 0\.5 s"):
        render_part(NESTED, {}, clock=lambda: next(ticks))


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("{{ [1] * 10**8 }}", "repeating 1 items"),
        ("{{ 'x' * 10**8 }}", "repeating 1 items"),
        ("{{ ((10**1000)**1000)**1000 }}", "power is too large"),
        ("{{ 'x' | center(10**10) }}", "center is limited"),
        ("{{ '%999999999d' % 1 }}", "widths and precisions"),
        ("{{ '%*d' % (10**9, 1) }}", "widths and precisions"),
        ("{{ '{:>999999999}'.format(1) }}", "widths and precisions"),
        ("{{ '{:{}}'.format(1, 10**9) }}", "cannot be another field"),
        ("{{ '{0:{1}{2}}'.format('a', 99, 9999) }}", "cannot be another field"),
        ("{{ ('{0}' * 1000).format('x' * 10000) }}", "would pass"),
        ("{{ ('%s' * 1000) % (('x' * 10000,) * 1000) }}", "would pass"),
        ("{{ 'x'.encode() * 10**9 }}", "repeating 1 items"),
        ("{{ '%09999999d' | format(1) }}", "widths and precisions"),
        ("{{ ('a' * 1000000) | replace('a', 'bb') }}", "replace is limited"),
        ("{{ 'a\na' | indent(10**9, true) }}", "indent is limited"),
        ("{{ [1] | batch(10**9, 0) | list }}", "batch is limited"),
        ("{{ [1] | slice(10**9) | list }}", "slice is limited"),
        ("{{ lipsum(10**9) }}", "'lipsum' is undefined"),
        ("{{ '€'.ljust(200000000) }}", "ljust is limited"),
        ("{{ 'x'.rjust(200000000, 'y') }}", "rjust is limited"),
        ("{{ 'x'.center(200000000) }}", "center is limited"),
        ("{{ '1'.zfill(200000000) }}", "zfill is limited"),
        ("{{ 'x'.encode().ljust(200000000) }}", "ljust is limited"),
        ("{{ ('a' * 999999).replace('a', 'bb') }}", "replace is limited"),
        ("{{ 'ab'.replace('', 'x' * 999999) }}", "replace is limited"),
        ("{{ ('\t' * 999999).expandtabs(100) }}", "expandtabs is limited"),
        ("{{ ('a' * 999).translate({97: 'x' * 999999}) }}", "translate is limited"),
        ("{{ ('b' * 999999).join(['a'] * 200) }}", "join is limited"),
        ("{{ ('b' * 999999).join(range(200)|map('string')) }}", "join is limited"),
        ("{{ (['a'] * 200) | join('b' * 999999) }}", "join is limited"),
        ("{{ ('a ' * 1000) | wordwrap(1, wrapstring='x' * 99999) }}", "wordwrap is limited"),
        ("{{ (['a'] * 1000) | tojson(indent=999999) }}", "indent is limited"),
        ("{{ ['x' * 999999] * 1000 }}", "printing this value"),
        ("{{ (['x' * 999999] * 1000) | string }}", "printing this value"),
        ("{{ (['x' * 999999] * 1000) | pprint }}", "printing this value"),
        ("{{ (['x' * 999999] * 1000) ~ '' }}", "~ is limited"),
    ],
)
def test_a_step_that_would_ask_for_too_much_is_refused_before_it_runs(
    source: str, problem: str
) -> None:
    """Each single step that would allocate far more than it is given is refused, naming it."""
    with pytest.raises(RenderError, match=problem):
        render_part(source, {})


@pytest.mark.parametrize(
    ("source", "out"),
    [
        ("{{ 'ab' * 3 }}|{{ 2**64 }}", "ababab|18446744073709551616"),
        ("{{ '%5d|%s' % (1, 'a') }} {{ '%(a)s' % d }} {{ '%d%%' % 5 }}", "    1|a 1 5%"),
        ("{{ '{:>5}|{}'.format(1, 2) }} {{ '{a}'.format_map(d) }}", "    1|2 1"),
        ("{{ 'aaa' | replace('a', 'bb') }} {{ 'x' | center(5) }}|", "bbbbbb   x  |"),
        (
            "{{ [1, 2, 3] | batch(2, 0) | list }} {{ [1, 2, 3] | slice(2) | list }}",
            "[[1, 2], [3, 0]] [[1, 2], [3]]",
        ),
        ("{% for x in xs %}{{ loop.index }}/{{ loop.length }} {% endfor %}", "1/2 2/2 "),
        ("{% for x in [] %}{{ x }}{% else %}none{% endfor %}", "none"),
        ("{{ 'ab'.ljust(4, '.') }}{{ '7'.zfill(3) }}{{ 'a\tb'.expandtabs(2) }}", "ab..007a b"),
        (
            "{{ '-'.join(['a', 'b']) }}{{ ['c', 'd'] | join('+') }}{{ 'ab'.replace('', '.') }}",
            "a-bc+d.a.b.",
        ),
        (
            "{{ 'ab'.translate({97: 'xy'}) }} {{ {'a': [1]} | tojson(2) }}",
            'xyb {\n  "a": [\n    1\n  ]\n}',
        ),
        ("{{ 2**64 * 3 }} {{ [1, 2] + [3] }} {{ 'a' + 'b' }}", "55340232221128654848 [1, 2, 3] ab"),
        ("{% set v = 2**49999 %}{{ (v * v) % 7 }} {{ (1).to_bytes(2, 'big') }}", "4 b'\\x00\\x01'"),
        (
            "{% set b %}<{{ 'x' }}>{% endset %}{% macro m(a) %}{{ a }}{{ a }}{% endmacro %}"
            "{% macro c() %}{{ caller() }}{{ caller() }}{% endmacro %}"
            "{{ b }}{{ m('y') }}{% call c() %}z{% endcall %}",
            "<x>yyzz",
        ),
    ],
)
def test_what_stays_within_the_limits_renders_as_jinja_would(source: str, out: str) -> None:
    """The checked operators and filters keep Jinja2's results within the limits."""
    assert render_part(source, {"d": {"a": 1}, "xs": [7, 8]}) == out


#: ``2**49999`` squared 14 times: 6.3 s of one step holding the GIL before the cap.
SQUARINGS = "{% set v0 = 2**49999 %}" + "".join(
    f"{{% set v{i + 1} = v{i} * v{i} %}}" for i in range(14)
)
MEGABYTE = "{% set s = 'x' * 1000000 %}"


@pytest.mark.parametrize(
    ("source", "limit"),
    [
        (SQUARINGS, "integer_size"),
        ("{% set v = 2**99999 %}{{ v * v * v }}", "integer_size"),
        ("{{ 3 ** 100000 }}", "integer_size"),
        (MEGABYTE + "{% set s = s + s %}{% set s = s + s %}{{ s | length }}", "result_size"),
        ("{% set l = [0] * 1000000 %}{{ (l + l + l) | length }}", "result_size"),
        ("{{ (1).to_bytes(10**9, 'big') | length }}", "result_size"),
        ("{{ (0).to_bytes(length=10**9) | length }}", "result_size"),
        (
            MEGABYTE + "{% set a %}{{ s }}{{ s }}{% endset %}{% set b %}{{ a }}{{ a }}{% endset %}"
            "{{ b | length }}",
            "result_size",
        ),
        (
            MEGABYTE + "{% macro twice(x) %}{{ x }}{{ x }}{% endmacro %}"
            "{{ twice(twice(twice(s))) | length }}",
            "result_size",
        ),
        (
            MEGABYTE + "{% macro twice() %}{{ caller() }}{{ caller() }}{% endmacro %}"
            "{% set a %}{% call twice() %}{{ s }}{% endcall %}{% endset %}{{ a | length }}",
            "result_size",
        ),
        ("{{ 'x' * 10**8 }}", "result_size"),
        ("{{ '%999999999d' % 1 }}", "format_width"),
        ("{% for i in range(10**7) %}{% endfor %}", "range"),
        ("{{ [1] | batch(10**9) | list }}", "range"),
        (NESTED, "time"),
        ("{% for i in range(2000) %}{{ 'x' * 1000 }}{% endfor %}", "output_size"),
        ("x" * 500_001, "source_size"),
    ],
)
def test_a_hostile_expression_is_refused_naming_the_limit_it_passes(
    source: str, limit: str
) -> None:
    """Integers, sequences, blocks and macros that would grow past the limits are refused by
    a LimitError whose ``limit`` names the limit (for the 422), before the step runs."""
    # A clock that stands still for every case but the time limit's own: a process paused
    # by a loaded machine would otherwise pass the time limit first.
    clock = time.monotonic if limit == "time" else lambda: 0.0
    with pytest.raises(RenderError) as caught:
        render_part(source, {}, clock=clock)

    assert getattr(caught.value, "limit", None) == limit


# The conversions the width check always read, as a regular expression: the scanner must
# read exactly these (a format is refused or let through as it was).
_PERCENT_AS_WAS = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")


@settings(deadline=None)  # a loaded machine is no failure
@given(st.text(alphabet="%()#0- +*.12a", max_size=60))
def test_the_conversions_are_those_the_regular_expression_read(fmt: str) -> None:
    """The scanner reads the widths and precisions ``_PERCENT.findall`` read, in order."""
    assert percent_specs(fmt) == _PERCENT_AS_WAS.findall(fmt)


def test_a_megabyte_of_unclosed_mapping_keys_then_a_wide_conversion_is_refused() -> None:
    """Half a million ``%(`` that no ``)`` closes are read as conversions without a width,
    and the too wide one after them is refused naming the width, within the suite's per-test
    timeout (the regular expression read the rest of the text for each ``%(``: hours)."""
    fmt = "%(" * 500_000 + "%99999d"

    with pytest.raises(Exceeded) as refused:
        check_percent_format(fmt, [1])

    assert refused.value.limit == "format_width"
    assert percent_specs(fmt)[-2:] == [("", ""), ("99999", "")]
