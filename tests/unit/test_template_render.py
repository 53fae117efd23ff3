"""Rendering users' templates (``shared.template_render``): sandboxed, limited, with a text
part derived from the html."""

from __future__ import annotations

import itertools

import pytest

from shared.template_render import MAX_RANGE, RenderError, render, render_part, text_of


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
