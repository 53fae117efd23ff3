"""Rendering a template version for one recipient: sandboxed Jinja2 with time and size
limits, the plain-text part derived from the html when a version has none, and the compiled
parts kept for the next render (:class:`CompiledParts`).

Errors::

    RenderError                a user's template does not compile or render (a 422)
     +-- LimitError            ... because it passes a limit, named by its ``limit``
     +-- RendererCrashed       ... because the process rendering it died otherwise

Templates come from users, so they run in Jinja2's immutable sandbox: no attribute access to
internals (``__class__``, ``mro``, function globals), no mutation of the data, ``range``
capped, autoescaping in html. A render stops with :class:`LimitError` once it has produced
more than :data:`MAX_OUTPUT` characters or run longer than :data:`MAX_SECONDS`. The time is
checked between the chunks Jinja2 yields, at every step of every ``{% for %}`` and at every
call the template makes (macros, ``loop(...)``), so loops nested to do a lot of work without
output are stopped too; a single step that could ask for far more than it is given (``*``, ``**``,
``~``, formats, ``ljust``, ``join``, ``replace``, ``center``, making text of a list that
repeats a long string...) is checked before it runs (``shared.templates.template_limits``), and
running out of memory is a render error. What a loop builds up over many steps (a list
gaining a new long string at each step) is bounded by the time limit only: each step is
checked, their sum is not (about half a gigabyte in 0.5 s, measured). A template too
large to compile or nested too deep is refused as well, and so is any other exception a
template raises (a filter's assertion, a missing attribute): whatever goes wrong in a user's
template is a :class:`RenderError`, and one that passes a limit a :class:`LimitError` naming
it (:class:`shared.templates.template_limits.Limit`). The error names what went wrong and where, for
the 422 that refuses publishing a version that does not render with its sample data.

These limits are checked between Python steps; a step running in C (compiling a huge source,
arithmetic) is stopped only by the process it runs in: users' templates are compiled and
rendered in ``shared.templates.template_pool``'s worker processes, under memory, CPU and time
limits.

The text derived from html is read in one linear pass (no pattern scans ahead of an unclosed
tag), under a time limit of its own.

Pure (the clock is passed in for tests); :class:`CompiledParts` is a cache its owner builds.
"""

from __future__ import annotations

import html
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import CodeType
from typing import Any, Final

from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError, meta, nodes
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from shared.templates import template_limits
from shared.templates.template_limits import MAX_OUTPUT, MAX_SECONDS, MAX_SOURCE, Limit

#: Names of our own in the sandbox; a template may not use (or shadow) any of them.
_RESERVED: Final = "__safedelivr"
#: The name every ``{% for %}``'s iterable is passed through, to check the time at each step.
_STEPS: Final = f"{_RESERVED}_steps"
#: The name every ``~`` calls instead, to check the size of what it joins.
_CONCAT: Final = f"{_RESERVED}_concat"


class RenderError(ValueError):
    """A template that does not render; the message says why (and the line, when known),
    ``fields`` each part's own error when they are known apart."""

    def __init__(self, message: str, *, fields: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.fields = dict(fields) if fields else None


class LimitError(RenderError):
    """A template that passes ``limit``."""

    def __init__(
        self, limit: Limit, message: str, *, fields: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message, fields=fields)
        self.limit = limit


class RendererCrashed(RenderError):
    """The process rendering a template died of something other than a limit (a signal, an
    abort): the template was running, so it is the template's failure too."""


@dataclass(frozen=True, slots=True)
class Rendered:
    subject: str
    html: str | None
    text: str | None


def _never() -> None:
    return None


def _monotonic() -> float:
    # Looked up at each call, not bound once at import as a default ``time.monotonic`` is: a
    # clock put in its place later (the simulator's virtual one) is the clock a render reads.
    return time.monotonic()


class _Deadline:
    """The time a render may take, counted from :meth:`start` (not compile time)."""

    def __init__(self, clock: Callable[[], float], seconds: float, what: str = "rendering") -> None:
        self.clock = clock
        self.seconds = seconds
        self.what = what
        self.started: float | None = None

    def start(self) -> _Deadline:
        self.started = self.clock()
        return self

    def check(self) -> None:
        if self.started is not None and self.clock() - self.started > self.seconds:
            raise LimitError(Limit.TIME, f"{self.what} took longer than {self.seconds:g} s")


class _Sandbox(ImmutableSandboxedEnvironment):
    """A sandbox for one part: html parts autoescape, subject and text do not; undefined
    variables are errors (a missing substitution is a bug to show, not a blank to send).
    ``check`` is called at every loop step and call, and raises to stop the render."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, *, html_part: bool, check: Callable[[], None]) -> None:
        super().__init__(
            autoescape=html_part, undefined=StrictUndefined, finalize=template_limits.check_printed
        )
        self.check = check
        # What a block set, a macro or a call block makes of its output: checked joins.
        self.concat = template_limits.joined  # type: ignore[method-assign]
        self.globals["range"] = template_limits.checked_range
        self.globals[_STEPS] = self._steps
        self.globals[_CONCAT] = template_limits.concat
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
        for used in tree.find_all(nodes.Name):
            if used.name.startswith(_RESERVED):
                raise TemplateSyntaxError(f"the name {used.name!r} is reserved", used.lineno)
        for loop in tree.find_all(nodes.For):
            steps = nodes.Name(_STEPS, "load", lineno=loop.lineno)
            loop.iter = nodes.Call(steps, [loop.iter], [], None, None, lineno=loop.lineno)
        checked = _CheckedConcat().visit(tree)
        assert isinstance(checked, nodes.Template)  # noqa: S101 - the root is kept
        return checked

    def call(
        __self,
        __context: Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        __self.check()  # macros and loop(...) recurse through calls
        args = template_limits.checked_call(__obj, args, kwargs)
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


class _CheckedConcat(NodeTransformer):
    """Every ``a ~ b`` made a call of :func:`shared.templates.template_limits.concat` (Jinja2 joins
    them inline, out of the sandbox's reach)."""

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        name = nodes.Name(_CONCAT, "load", lineno=node.lineno)
        return nodes.Call(name, list(node.nodes), [], None, None, lineno=node.lineno)


@dataclass(frozen=True, slots=True)
class Compiled:
    """One part's source compiled: the code of its template, and the variables it uses."""

    code: CodeType
    names: frozenset[str]


def compile_part(source: str, *, html_part: bool) -> Compiled:
    """``source`` parsed and compiled in the sandbox; RenderError when it cannot be."""
    if len(source) > MAX_SOURCE:
        raise LimitError(Limit.SOURCE_SIZE, f"the template is longer than {MAX_SOURCE} characters")
    env = _Sandbox(html_part=html_part, check=_never)
    try:
        tree = env.parse(source)
        names = meta.find_undeclared_variables(tree) - set(env.globals)
        code = env.compile(tree)
    except TemplateSyntaxError as exc:
        raise RenderError(f"line {exc.lineno}: {exc.message}") from None
    except RecursionError:
        raise LimitError(Limit.NESTING, "the template is nested too deeply") from None
    except MemoryError:
        raise LimitError(Limit.MEMORY, "the template is too large to compile") from None
    except Exception as exc:  # noqa: BLE001 - the parser and Python's compiler may refuse a user's source in ways of their own (too many nested blocks): that is the template's fault
        raise RenderError(f"the template does not compile: {_named(exc)}") from None
    return Compiled(code, frozenset(names))


@dataclass(frozen=True, slots=True)
class _Failed:
    """A source that does not compile, kept to refuse it again the same way."""

    message: str
    limit: Limit | None = None

    def error(self) -> RenderError:
        if self.limit is not None:
            return LimitError(self.limit, self.message)
        return RenderError(self.message)


class CompiledParts:
    """The parts compiled lately, kept by their source (a stored version never changes, so a
    batch naming it compiles nothing): the most recently used first, at most
    ``max_entries`` of them and ``max_chars`` characters of source, failures included.
    Each worker process of ``shared.templates.template_pool`` keeps its own; it locks, for threads
    sharing one."""

    def __init__(self, max_entries: int = 256, max_chars: int = 8_000_000) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._kept: OrderedDict[tuple[str, bool], Compiled | _Failed] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, source: str, *, html_part: bool) -> Compiled:
        """``source`` compiled (RenderError, kept as well, when it cannot be)."""
        key = (source, html_part)
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
        if found is None:
            try:
                found = compile_part(source, html_part=html_part)
            except LimitError as exc:
                found = _Failed(str(exc), exc.limit)
            except RenderError as exc:
                found = _Failed(str(exc))
            self._keep(key, found)
        if isinstance(found, _Failed):
            raise found.error()
        return found

    def _keep(self, key: tuple[str, bool], compiled: Compiled | _Failed) -> None:
        if len(key[0]) > min(MAX_SOURCE, self.max_chars):
            return
        with self._lock:
            if key in self._kept:
                return
            self._kept[key] = compiled
            self._chars += len(key[0])
            while len(self._kept) > self.max_entries or self._chars > self.max_chars:
                (source, _), _ = self._kept.popitem(last=False)
                self._chars -= len(source)

    def __len__(self) -> int:
        return len(self._kept)


def _named(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def render_part(
    source: str,
    data: Mapping[str, Any],
    *,
    html_part: bool = False,
    clock: Callable[[], float] = _monotonic,
    max_output: int = MAX_OUTPUT,
    max_seconds: float = MAX_SECONDS,
    parts: CompiledParts | None = None,
) -> str:
    """One part rendered with ``data`` (compiled through ``parts`` when given); RenderError
    when it cannot be, or passes a limit."""
    if parts is not None:
        compiled = parts.get(source, html_part=html_part)
    else:
        compiled = compile_part(source, html_part=html_part)
    deadline = _Deadline(clock, max_seconds)
    env = _Sandbox(html_part=html_part, check=deadline.check)
    # The code is the environment's to run: each render gets its own, with its own clock.
    template = env.template_class.from_code(env, compiled.code, env.make_globals(None))
    deadline.start()
    out: list[str] = []
    size = 0
    try:
        for chunk in template.generate(**dict(data)):
            size += len(chunk)
            if size > max_output:
                raise LimitError(Limit.OUTPUT_SIZE, f"the output passes {max_output} characters")
            deadline.check()
            out.append(chunk)
    except RenderError:
        raise
    except MemoryError:
        raise LimitError(Limit.MEMORY, "the template needs too much memory") from None
    except template_limits.Exceeded as exc:
        raise LimitError(exc.limit, str(exc)) from None
    except SecurityError as exc:
        raise RenderError(f"not allowed: {exc}") from None
    except TemplateError as exc:
        raise RenderError(str(exc) or type(exc).__name__) from None
    except RecursionError:
        raise LimitError(Limit.NESTING, "the template recurses too deeply") from None
    except Exception as exc:  # noqa: BLE001 - a user's template can make Python raise anything (truncate's assertion, xmlattr's AttributeError): it is a template that does not render, not our failure
        raise RenderError(_named(exc)) from None
    return "".join(out)


def render(
    subject: str,
    html_source: str | None,
    text_source: str | None,
    data: Mapping[str, Any],
    *,
    parts: CompiledParts | None = None,
    clock: Callable[[], float] = _monotonic,
) -> Rendered:
    """Every part of a version for one recipient; the text is derived from the html when
    the version has no text of its own (within a time limit of its own)."""
    rendered_html = (
        render_part(html_source, data, html_part=True, parts=parts, clock=clock)
        if html_source
        else None
    )
    text: str | None = None
    if text_source:
        text = render_part(text_source, data, parts=parts, clock=clock)
    elif rendered_html:
        deadline = _Deadline(clock, MAX_SECONDS, "deriving the text part").start()
        text = text_of(rendered_html, check=deadline.check)
    return Rendered(
        render_part(subject, data, parts=parts, clock=clock).strip(), rendered_html, text
    )


def render_version(
    subject: str,
    html_source: str | None,
    text_source: str | None,
    data: Mapping[str, Any],
    *,
    parts: CompiledParts | None = None,
    clock: Callable[[], float] = _monotonic,
) -> Rendered:
    """A version rendered as :func:`render` renders it, its failure told part by part: a
    RenderError whose ``fields`` name each part that does not render with why, or, at the
    first limit a part passes, that LimitError with its part (the rest is not tried: a part
    that ran out of time would only run out again)."""
    out: dict[str, str] = {}
    errors: dict[str, str] = {}
    for name, source, html_part in (
        ("html", html_source, True),
        ("text", text_source, False),
        ("subject", subject, False),
    ):
        if not source:
            continue
        try:
            out[name] = render_part(source, data, html_part=html_part, parts=parts, clock=clock)
        except LimitError as exc:
            raise LimitError(exc.limit, f"{name}: {exc}", fields={name: str(exc)}) from None
        except RenderError as exc:
            errors[name] = str(exc)
    if errors:
        told = "; ".join(f"{name}: {why}" for name, why in errors.items())
        raise RenderError(told, fields=errors)
    text = out.get("text")
    if text is None and out.get("html"):
        deadline = _Deadline(clock, MAX_SECONDS, "deriving the text part").start()
        try:
            text = text_of(out["html"], check=deadline.check)
        except LimitError as exc:
            raise LimitError(exc.limit, f"text: {exc}", fields={"text": str(exc)}) from None
    return Rendered(out.get("subject", "").strip(), out.get("html"), text)


#: Anything between ``<`` and ``>``; ``[^<>]`` keeps a match from scanning past the next
#: ``<``, so a page of unclosed tags is read in linear time.
_TAG: Final = re.compile(r"<([^<>]*)>")
#: A tag's name after its ``<``, and whether it ends an element. Possessive: ``\s*(/?)\s*``
#: backtracking over a run of blanks (``/?`` empty lets either ``\s*`` take any share of it)
#: read a tag of blanks in quadratic time; only the greedy reading can match anyway.
_TAG_NAME: Final = re.compile(r"\s*+(/?+)\s*+([A-Za-z][A-Za-z0-9]*+)")
_HREF: Final = re.compile(r"""(?<![\w-])href\s*=\s*["']?([^"'\s>]+)""", re.IGNORECASE)
#: Elements whose content is not text, and the end tag each one's content runs to.
_DROPPED: Final = {
    name: re.compile(rf"</{name}\s*>", re.IGNORECASE) for name in ("script", "style", "head")
}
_BREAK_STARTS: Final = frozenset({"br", "hr"})
_BREAK_ENDS: Final = frozenset({"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "ul", "ol"})
_SPACES: Final = re.compile(r"[ \t\r\f\v]+")
_BLANK_LINES: Final = re.compile(r"\n{3,}")
#: Tags read between two looks at the clock.
_TAGS_PER_CHECK: Final = 256


class _TextWalk:
    """One pass over html: the text between tags, with links, breaks and items."""

    def __init__(self, check: Callable[[], None]) -> None:
        self.check = check
        self.out: list[str] = []
        self.link: tuple[str, int] | None = None  # the open link's url, where its label starts
        self.unclosed: set[str] = set()  # dropped elements with no end tag further on

    def walk(self, source: str) -> str:
        at = 0
        while (tag := _TAG.search(source, at)) is not None:
            if len(self.out) % _TAGS_PER_CHECK == 0:
                self.check()
            self.out.append(source[at : tag.start()])
            at = self._tag(source, tag)
        self.out.append(source[at:])
        return "".join(self.out)

    def _tag(self, source: str, tag: re.Match[str]) -> int:
        """Where reading goes on after ``tag``."""
        named = _TAG_NAME.match(tag.group(1))
        if named is None:
            return tag.end()
        closing, name = named.group(1) == "/", named.group(2).lower()
        if not closing and name in _DROPPED and name not in self.unclosed:
            end = _DROPPED[name].search(source, tag.end())
            if end is not None:
                return end.end()
            self.unclosed.add(name)  # no later search can find one either
        if name == "a":
            self._anchor(closing, tag.group(1))
        elif self.link is None:
            if (closing and name in _BREAK_ENDS) or (not closing and name in _BREAK_STARTS):
                self.out.append("\n")
            elif not closing and name == "li":
                self.out.append("\n- ")
        return tag.end()

    def _anchor(self, closing: bool, inside: str) -> None:
        if not closing:
            href = _HREF.search(inside)
            if href is not None and self.link is None:
                self.link = (href.group(1), len(self.out))
            return
        if self.link is None:
            return
        url, start = self.link
        label = "".join(self.out[start:]).strip()
        del self.out[start:]
        self.out.append(url if not label or label == url else f"{label} ({url})")
        self.link = None


def text_of(source: str, check: Callable[[], None] = _never) -> str:
    """A readable plain-text part from html: scripts, styles and head dropped, links as
    ``text (url)``, block ends as line breaks, list items as ``- ``, entities decoded.
    ``check`` is called as it goes, and raises to stop it."""
    text = html.unescape(_TextWalk(check).walk(source))
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()
