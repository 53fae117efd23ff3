"""Rendering a template version for one recipient: sandboxed Jinja2 with time and size
limits, and the plain-text part derived from the html when a version has none.

Templates come from users, so they run in Jinja2's immutable sandbox: no attribute access to
internals (``__class__``, ``mro``, function globals), no mutation of the data, ``range``
capped, autoescaping in html. A render stops with :class:`RenderError` once it has produced
more than :data:`MAX_OUTPUT` characters or run longer than :data:`MAX_SECONDS`. The time is
checked between the chunks Jinja2 yields, at every step of every ``{% for %}`` and at every
call the template makes (macros, ``loop(...)``), so loops nested to do a lot of work without
output are stopped too; a single step that could ask for far more than it is given (``*``, ``**``,
formats, ``replace``, ``center``...) is checked before it runs (``shared.template_limits``),
and running out of memory is a render error. A template too large to compile or nested
too deep is refused as well. The error names what went wrong and where, for the 422 that
refuses publishing a version that does not render with its sample data.

Pure (the clock is passed in for tests).
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError, nodes
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from shared import template_limits

#: Longest output of one part (subject, html or text) of one render.
MAX_OUTPUT: Final = 1_000_000
#: Longest a render may run (seconds of wall time, checked between output chunks).
MAX_SECONDS: Final = 0.5
#: Longest template source accepted.
MAX_SOURCE: Final = 500_000
#: ``range`` in templates stops here (Jinja2's sandbox default is 100,000).
MAX_RANGE: Final = 10_000
#: The name every ``{% for %}``'s iterable is passed through, to check the time at each step.
_STEPS: Final = "__safedelivr_steps"


class RenderError(ValueError):
    """A template that does not render; the message says why (and the line, when known)."""


@dataclass(frozen=True, slots=True)
class Rendered:
    subject: str
    html: str | None
    text: str | None


def _range(*args: int) -> range:
    found = range(*args)
    if len(found) > MAX_RANGE:
        raise SecurityError(f"range is limited to {MAX_RANGE} items")
    return found


def _never() -> None:
    return None


class _Deadline:
    """The time a render may take, counted from :meth:`start` (not compile time)."""

    def __init__(self, clock: Callable[[], float], seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.started: float | None = None

    def start(self) -> None:
        self.started = self.clock()

    def check(self) -> None:
        if self.started is not None and self.clock() - self.started > self.seconds:
            raise RenderError(f"rendering took longer than {self.seconds:g} s")


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, *, html_part: bool, check: Callable[[], None]) -> None:
        super().__init__(autoescape=html_part, undefined=StrictUndefined)
        self.check = check
        self.globals["range"] = _range
        self.globals[_STEPS] = self._steps
        self.globals.pop("lipsum", None)  # loops in Python for as long as it is asked to
        self.filters.update(template_limits.FILTERS)

    def _steps(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            self.check()
            yield item

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        # Jinja2 has no hook into loops, so each loop's iterable is wrapped in the tree it
        # compiles: a step of any loop, nested or not, checks the time.
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            steps = nodes.Name(_STEPS, "load", lineno=loop.lineno)
            loop.iter = nodes.Call(steps, [loop.iter], [], None, None, lineno=loop.lineno)
        return tree

    def call(
        __self,
        __context: Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        __self.check()  # macros and loop(...) recurse through calls
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        template_limits.check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        sandboxed = super().wrap_str_format(value)
        if sandboxed is None:
            return None
        fmt = str(value.__self__)

        def checked(*args: Any, **kwargs: Any) -> str:
            given = [*args, *kwargs.values()]
            if args and isinstance(args[0], Mapping):  # format_map
                given.extend(args[0].values())
            template_limits.check_brace_format(fmt, given)
            return sandboxed(*args, **kwargs)

        return checked


def environment(
    *, html_part: bool, check: Callable[[], None] = _never
) -> ImmutableSandboxedEnvironment:
    """A fresh sandbox: html parts autoescape, subject and text do not; undefined variables
    are errors (a missing substitution is a bug to show, not a blank to send). ``check`` is
    called at every loop step and call, and raises to stop the render."""
    return _Sandbox(html_part=html_part, check=check)


def render_part(
    source: str,
    data: Mapping[str, Any],
    *,
    html_part: bool = False,
    clock: Callable[[], float] = time.monotonic,
    max_output: int = MAX_OUTPUT,
    max_seconds: float = MAX_SECONDS,
) -> str:
    """One part rendered with ``data``; RenderError when it cannot be, or passes a limit."""
    if len(source) > MAX_SOURCE:
        raise RenderError(f"the template is longer than {MAX_SOURCE} characters")
    deadline = _Deadline(clock, max_seconds)
    try:
        template = environment(html_part=html_part, check=deadline.check).from_string(source)
    except TemplateSyntaxError as exc:
        raise RenderError(f"line {exc.lineno}: {exc.message}") from None
    except RecursionError:
        raise RenderError("the template is nested too deeply") from None
    deadline.start()
    out: list[str] = []
    size = 0
    try:
        for chunk in template.generate(**dict(data)):
            size += len(chunk)
            if size > max_output:
                raise RenderError(f"the output passes {max_output} characters")
            deadline.check()
            out.append(chunk)
    except MemoryError:
        raise RenderError("the template needs too much memory") from None
    except SecurityError as exc:
        raise RenderError(f"not allowed: {exc}") from None
    except TemplateError as exc:
        raise RenderError(str(exc) or type(exc).__name__) from None
    except RecursionError:
        raise RenderError("the template recurses too deeply") from None
    except (TypeError, ValueError, ArithmeticError, LookupError) as exc:
        if isinstance(exc, RenderError):
            raise
        raise RenderError(f"{type(exc).__name__}: {exc}") from None
    return "".join(out)


def render(
    subject: str, html_source: str | None, text_source: str | None, data: Mapping[str, Any]
) -> Rendered:
    """Every part of a version for one recipient; the text is derived from the html when
    the version has no text of its own."""
    rendered_html = render_part(html_source, data, html_part=True) if html_source else None
    text: str | None = None
    if text_source:
        text = render_part(text_source, data)
    elif rendered_html:
        text = text_of(rendered_html)
    return Rendered(render_part(subject, data).strip(), rendered_html, text)


_DROP: Final = re.compile(r"<(script|style|head)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_LINK: Final = re.compile(
    r"""<a\b[^>]*?href\s*=\s*["']?([^"'\s>]+)["']?[^>]*>(.*?)</a\s*>""", re.IGNORECASE | re.DOTALL
)
_BREAK: Final = re.compile(r"<\s*(br|/p|/div|/h[1-6]|/tr|/ul|/ol|hr)\b[^>]*>", re.IGNORECASE)
_ITEM: Final = re.compile(r"<\s*li\b[^>]*>", re.IGNORECASE)
_TAG: Final = re.compile(r"<[^>]+>")
_SPACES: Final = re.compile(r"[ \t\r\f\v]+")
_BLANK_LINES: Final = re.compile(r"\n\s*\n\s*\n+")


def text_of(source: str) -> str:
    """A readable plain-text part from html: scripts, styles and head dropped, links as
    ``text (url)``, block ends as line breaks, list items as ``- ``, entities decoded."""

    def link(match: re.Match[str]) -> str:
        url, label = match.group(1), _TAG.sub("", match.group(2)).strip()
        if not label or label == url:
            return url
        return f"{label} ({url})"

    text = _DROP.sub("", source)
    text = _LINK.sub(link, text)
    text = _ITEM.sub("\n- ", text)
    text = _BREAK.sub("\n", text)
    text = html.unescape(_TAG.sub("", text))
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()
