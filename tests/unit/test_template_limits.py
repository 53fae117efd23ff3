"""Hostile templates stop fast (``shared.template_limits`` and the checks
``shared.template_render`` makes with them): loops nested to work without output run out of
time, and one step that would ask for gigabytes is refused before it runs."""

from __future__ import annotations

import itertools
import time

import pytest

from shared.template_render import RenderError, render_part

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
    started = time.monotonic()

    with pytest.raises(RenderError, match=r"longer than 0\.5 s"):
        render_part(source, {})

    assert time.monotonic() - started < 5


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
        ("{{ '{:{}}'.format(1, 10**9) }}", "widths and precisions"),
        ("{{ '%09999999d' | format(1) }}", "widths and precisions"),
        ("{{ ('a' * 1000000) | replace('a', 'bb') }}", "replace is limited"),
        ("{{ 'a\na' | indent(10**9, true) }}", "indent is limited"),
        ("{{ [1] | batch(10**9, 0) | list }}", "batch is limited"),
        ("{{ [1] | slice(10**9) | list }}", "slice is limited"),
        ("{{ lipsum(10**9) }}", "'lipsum' is undefined"),
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
    ],
)
def test_what_stays_within_the_limits_renders_as_jinja_would(source: str, out: str) -> None:
    """The checked operators and filters keep Jinja2's results within the limits."""
    assert render_part(source, {"d": {"a": 1}, "xs": [7, 8]}) == out
