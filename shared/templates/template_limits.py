"""The limits of users' templates: their values, their names (:class:`Limit`, what a refusal
tells), and the size checks on operators, formats, methods and filters whose result can be far
larger than what they are given.

A render's output and time are limited by ``shared.templates.template_render`` between steps, but
one step (``"x" * n``, ``a + a``, ``n * n`` of integers, ``"{:>n}".format(...)``, ``s.ljust(n)``,
``sep.join(items)``, ``(1).to_bytes(n)``, ``s|replace(a, b)``, a ``{% set %}`` block or macro
printing its argument twice) runs in C and can ask for gigabytes or minutes of CPU before any
check runs again. These refuse such a step *before* it runs, with :class:`Exceeded` (a
:class:`jinja2.exceptions.SecurityError`) naming it and its limit; what they let through is at
most about :data:`MAX_RESULT` characters (or list items), and integers of at most
:data:`MAX_INT_BITS` bits (each further squaring would triple the time: 14 squarings of
``2**49999`` took 6.3 s). A format whose width is itself a replacement
field (``'{0:{1}}'``) is refused outright: its width is only known once it is formatted. A
list that repeats a long string is small to hold and huge as text, so printing a value
(``{{ v }}``), ``~`` and the filters that make text of their value count its text first.

What builds up over many steps (1,500 strings of a megabyte each) is not counted here: the
process a template renders in has a memory and a CPU limit of its own
(``shared.templates.template_pool``, whose values are settings), and breaching one is told with its
:class:`Limit` as well.

Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from types import BuiltinMethodType
from typing import Any, Final

from jinja2 import filters as jinja_filters
from jinja2 import pass_environment, pass_eval_context
from jinja2 import runtime as jinja_runtime
from jinja2.exceptions import SecurityError
from jinja2.nodes import EvalContext

#: Longest output of one part (subject, html or text) of one render.
MAX_OUTPUT: Final = 1_000_000
#: Longest a render may run (seconds of wall time, checked between steps).
MAX_SECONDS: Final = 0.5
#: Longest template source accepted.
MAX_SOURCE: Final = 500_000
#: ``range`` in templates stops here (Jinja2's sandbox default is 100,000).
MAX_RANGE: Final = 10_000
#: Largest result of one step.
MAX_RESULT: Final = 1_000_000
#: Widest field (or longest precision) a format may pad to.
MAX_WIDTH: Final = 10_000
#: Largest integer ``*`` and ``**`` may compute, in bits (30,103 decimal digits).
MAX_INT_BITS: Final = 100_000
#: Most pieces ``batch`` and ``slice`` may cut a sequence into.
MAX_PIECES: Final = 10_000
#: Widest indent ``tojson`` may use.
MAX_JSON_INDENT: Final = 8
#: How deep :func:`text_size` looks into nested containers before it gives up.
_MAX_DEPTH: Final = 20

#: What ``+`` joins into something longer.
_SIZED: Final = (str, bytes, list, tuple)
#: A printf-style conversion: its width and precision (``*``: taken from the arguments).
_PERCENT: Final = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
#: The same without a mapping key, for a ``%(`` that no ``)`` closes.
_PERCENT_UNKEYED: Final = re.compile(r"%[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
#: A ``str.format`` replacement field's spec, nested fields included.
_BRACES: Final = re.compile(r"\{[^{}:]*:((?:[^{}]|\{[^{}]*\})*)\}")
#: A ``str.format`` replacement field (escaped braces are taken out first).
_FIELD: Final = re.compile(r"\{[^{}]*\}")
_NUMBER: Final = re.compile(r"\d+")


class Limit(StrEnum):
    """The limits a template can breach, as a refusal names them."""

    TIME = "time"
    """Wall time of a render (checked between steps) or of compiling and rendering."""
    CPU_TIME = "cpu_time"
    """CPU time of the process rendering it."""
    MEMORY = "memory"
    """Address space of the process rendering it."""
    INTEGER_SIZE = "integer_size"
    RESULT_SIZE = "result_size"
    """What one step makes: repeating, joining, padding, replacing, printing a value."""
    FORMAT_WIDTH = "format_width"
    OUTPUT_SIZE = "output_size"
    SOURCE_SIZE = "source_size"
    RANGE = "range"
    """Items of a ``range``, pieces of ``batch`` and ``slice``."""
    NESTING = "nesting"
    """How deeply a source nests, or a render recurses."""


_VALUES: Final[dict[str, int]] = {
    Limit.INTEGER_SIZE: MAX_INT_BITS,
    Limit.RESULT_SIZE: MAX_RESULT,
    Limit.FORMAT_WIDTH: MAX_WIDTH,
    Limit.OUTPUT_SIZE: MAX_OUTPUT,
    Limit.SOURCE_SIZE: MAX_SOURCE,
    Limit.RANGE: MAX_RANGE,
    Limit.NESTING: _MAX_DEPTH,
}


def value_of(limit: str) -> int | None:
    """The number ``limit`` allows; ``None`` for those set per server (time, CPU, memory)."""
    return _VALUES.get(limit)


class Exceeded(SecurityError):
    """A step refused before it runs: it would pass ``limit``."""

    def __init__(self, limit: Limit, message: str) -> None:
        super().__init__(message)
        self.limit = limit


def _too_wide(numbers: Iterable[int], what: str) -> None:
    if any(n > MAX_WIDTH for n in numbers):
        raise Exceeded(
            Limit.FORMAT_WIDTH, f"{what}: widths and precisions are limited to {MAX_WIDTH}"
        )


def _ints(values: Iterable[Any]) -> list[int]:
    return [v for v in values if isinstance(v, int)]


def text_size(value: Any, depth: int = 0) -> int:
    """About how long ``str(value)`` is, without building it (a list holding the same long
    string a thousand times is short to hold and long to print); past :data:`MAX_RESULT`
    it stops counting."""
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, Mapping | list | tuple | set | frozenset):
        if depth >= _MAX_DEPTH:
            return MAX_RESULT + 1
        items = [*value.keys(), *value.values()] if isinstance(value, Mapping) else value
        size = 2
        for item in items:
            size += text_size(item, depth + 1) + 4  # quotes and separators
            if size > MAX_RESULT:
                break
        return size
    return 32 if isinstance(value, int | float | bool) or value is None else 0


def _formatted(what: str, fields: int, widths: list[int], args: Iterable[Any]) -> None:
    """Refuse a format whose fields, each as wide as its widest argument, pass the limit."""
    _too_wide(widths, what)
    longest = max((text_size(a) for a in args), default=0)
    if fields * max(longest, max(widths, default=0)) > MAX_RESULT:
        raise Exceeded(Limit.RESULT_SIZE, f"{what}: the result would pass {MAX_RESULT} characters")


def percent_specs(fmt: str) -> list[tuple[str, str]]:
    """The width and precision (each "" when not given) of every conversion of ``fmt``, in
    order: what ``_PERCENT.findall`` finds, reading each character about once.

    ``_PERCENT`` reads from a ``%(`` to the next ``)``; with none left, that is the end of
    the text, for every ``%(`` after the last ``)``: quadratic. After the last ``)`` the
    mapping key cannot close, so those conversions are read without it."""
    last = fmt.rfind(")")
    specs = []
    at = fmt.find("%")
    while at >= 0:
        spec = (_PERCENT if at + 2 <= last else _PERCENT_UNKEYED).match(fmt, at)
        if spec is None:  # pragma: no cover - both patterns match at any "%"
            break
        specs.append((spec.group(1) or "", spec.group(2) or ""))
        at = fmt.find("%", spec.end())
    return specs


def check_percent_format(fmt: str, args: Iterable[Any]) -> None:
    """``fmt % args`` (and the ``format`` filter) pads to no more than :data:`MAX_WIDTH`,
    and its result is no longer than about :data:`MAX_RESULT`."""
    given = list(args)
    specs = percent_specs(fmt)
    widths = [int(n) for spec in specs for n in spec if n.isdigit()]
    if any("*" in spec for spec in specs):
        widths += _ints(given)
    _formatted("a % format", len(specs), widths, given)


def check_brace_format(fmt: str, args: Iterable[Any]) -> None:
    """``fmt.format(...)`` pads to no more than :data:`MAX_WIDTH`, has no width given by
    another field, and its result is no longer than about :data:`MAX_RESULT`."""
    specs = _BRACES.findall(fmt)
    if any("{" in spec for spec in specs):
        # '{0:{1}{2}}' puts two fields' values side by side as one width: refuse the form.
        raise Exceeded(Limit.FORMAT_WIDTH, "a format: a width or precision cannot be another field")
    widths = [int(n) for spec in specs for n in _NUMBER.findall(spec)]
    fields = len(_FIELD.findall(fmt.replace("{{", "").replace("}}", "")))
    _formatted("a format", fields, widths, args)


def _values(right: Any) -> list[Any]:
    if isinstance(right, tuple):
        return list(right)
    if isinstance(right, Mapping):
        return list(right.values())
    return [right]


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse ``*``, ``**``, ``+`` and ``%`` whose result would pass the limits."""
    if operator == "*":
        _check_product(left, right)
    elif operator == "**":
        powers = isinstance(left, int) and isinstance(right, int) and right > 0
        if powers and left.bit_length() * right > MAX_INT_BITS:
            raise Exceeded(
                Limit.INTEGER_SIZE,
                f"the power is too large: integers are limited to {MAX_INT_BITS} bits",
            )
    elif operator == "+":
        if (
            isinstance(left, _SIZED)
            and isinstance(right, _SIZED)
            and len(left) + len(right) > MAX_RESULT
        ):
            raise Exceeded(Limit.RESULT_SIZE, f"+ is limited to {MAX_RESULT} items")
    elif operator == "%" and isinstance(left, str | bytes):
        fmt = left if isinstance(left, str) else left.decode("latin-1")
        check_percent_format(fmt, _values(right))


def _check_product(left: Any, right: Any) -> None:
    if isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise Exceeded(
                Limit.INTEGER_SIZE,
                f"the product is too large: integers are limited to {MAX_INT_BITS} bits",
            )
        return
    for seq, times in ((left, right), (right, left)):
        repeated = isinstance(seq, str | bytes | list | tuple) and isinstance(times, int)
        if repeated and len(seq) * times > MAX_RESULT:
            raise Exceeded(
                Limit.RESULT_SIZE, f"repeating {len(seq)} items {times} times is too much"
            )


def _width_of(
    name: str, text: str | bytes, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> int:
    """About how long ``text.<name>(*args, **kwargs)`` is (0: not a method that grows)."""
    first = args[0] if args else None
    if name in ("ljust", "rjust", "center", "zfill"):
        return first if isinstance(first, int) else 0
    if name == "expandtabs":
        tab = kwargs.get("tabsize", first if args else 8)
        tabs = text.count("\t") if isinstance(text, str) else text.count(b"\t")
        return len(text) + tabs * tab if isinstance(tab, int) else 0
    if name == "replace" and len(args) >= 2:
        return _replaced(text, args[0], args[1], args[2] if len(args) > 2 else -1)
    if name == "translate" and isinstance(text, str):
        return len(text) * max(1, _longest_value(first))
    return 0


def _replaced(text: str | bytes, old: Any, new: Any, count: Any) -> int:
    if not (isinstance(old, type(text)) and isinstance(new, type(text))):
        return 0  # the call itself refuses the types
    # str.count(str) or bytes.count(bytes): the types match, as checked above.
    times = text.count(old) if old else len(text) + 1  # type: ignore[arg-type]
    if isinstance(count, int) and count >= 0:
        times = min(times, count)
    return len(text) + times * max(0, len(new) - len(old))


def _longest_value(table: Any) -> int:
    values = table.values() if isinstance(table, Mapping) else table
    if not isinstance(values, Iterable) or isinstance(table, str):
        return 1
    return max((len(v) for v in values if isinstance(v, str)), default=1)


def checked_call(method: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """Refuse a call of a ``str`` or ``bytes`` method (``ljust``, ``rjust``, ``center``,
    ``zfill``, ``expandtabs``, ``replace``, ``translate``, ``join``) or of ``int.to_bytes``
    whose result would pass :data:`MAX_RESULT`; the arguments to call it with (``join``'s
    items listed, to be counted before they are joined)."""
    text = getattr(method, "__self__", None)
    if not isinstance(method, BuiltinMethodType):
        return args
    name = method.__name__
    if isinstance(text, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        if isinstance(length, int) and length > MAX_RESULT:
            raise Exceeded(Limit.RESULT_SIZE, f"to_bytes is limited to {MAX_RESULT} bytes")
        return args
    if not isinstance(text, str | bytes):
        return args
    if name == "join" and len(args) == 1 and not kwargs:
        items = list(args[0])
        _joined(name, text, items)
        return (items,)
    if _width_of(name, text, args, kwargs) > MAX_RESULT:
        raise Exceeded(Limit.RESULT_SIZE, f"{name} is limited to {MAX_RESULT} characters")
    return args


def _joined(what: str, sep: str | bytes, items: list[Any]) -> None:
    size = len(sep) * max(0, len(items) - 1)
    for item in items:
        size += text_size(item)
        if size > MAX_RESULT:
            raise Exceeded(Limit.RESULT_SIZE, f"{what} is limited to {MAX_RESULT} characters")


def check_printed(value: Any) -> Any:
    """``value`` as it is, unless printing it (``{{ value }}``) would pass the limit: a list
    repeating one long string is small to hold and huge as text."""
    if not isinstance(value, str) and text_size(value) > MAX_RESULT:
        raise Exceeded(Limit.RESULT_SIZE, f"printing this value would pass {MAX_RESULT} characters")
    return value


def _center(value: Any, width: int = 80) -> str:
    if isinstance(width, int) and width > MAX_RESULT:
        raise Exceeded(Limit.RESULT_SIZE, f"center is limited to {MAX_RESULT} characters")
    return jinja_filters.do_center(value, width)


def _indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    step = width if isinstance(width, int) else len(str(width))
    if step * (str(s).count("\n") + 1) > MAX_RESULT:
        raise Exceeded(Limit.RESULT_SIZE, f"indent is limited to {MAX_RESULT} characters")
    return jinja_filters.do_indent(s, width, first, blank)


@pass_eval_context
def _join(eval_ctx: EvalContext, value: Any, d: Any = "", attribute: Any = None) -> str:
    items = list(value)
    if attribute is not None:
        get = jinja_filters.make_attrgetter(eval_ctx.environment, attribute)
        _joined("join", str(d), [get(i) for i in items])
    else:
        _joined("join", str(d), items)
    return str(jinja_filters.do_join(eval_ctx, items, d, attribute))


def _wordwrap(environment: Any, s: Any, width: int = 79, *args: Any, **kwargs: Any) -> str:
    wrap = kwargs.get("wrapstring", args[1] if len(args) > 1 else None)
    # Each line may end with the wrap string; there are at most as many lines as characters.
    if wrap is not None and len(str(s)) * len(str(wrap)) > MAX_RESULT:
        raise Exceeded(Limit.RESULT_SIZE, f"wordwrap is limited to {MAX_RESULT} characters")
    return jinja_filters.do_wordwrap(environment, s, width, *args, **kwargs)


@pass_eval_context
def _tojson(eval_ctx: EvalContext, value: Any, indent: Any = None) -> Any:
    wide = isinstance(indent, int) and indent > MAX_JSON_INDENT
    if wide or (isinstance(indent, str) and len(indent) > MAX_JSON_INDENT):
        raise Exceeded(Limit.FORMAT_WIDTH, f"tojson's indent is limited to {MAX_JSON_INDENT}")
    return jinja_filters.do_tojson(eval_ctx, value, indent)


def _format(value: Any, *args: Any, **kwargs: Any) -> str:
    check_percent_format(str(value), [*args, *kwargs.values()])
    return jinja_filters.do_format(value, *args, **kwargs)


@pass_eval_context
def _replace(eval_ctx: EvalContext, s: Any, old: Any, new: Any, count: int | None = None) -> str:
    text, found = str(s), str(old)
    times = text.count(found) if count is None else min(count, text.count(found))
    if len(text) + times * len(str(new)) > MAX_RESULT:
        raise Exceeded(Limit.RESULT_SIZE, f"replace is limited to {MAX_RESULT} characters")
    return jinja_filters.do_replace(eval_ctx, s, old, new, count)


def _pieces(name: str, cut: Callable[..., Any]) -> Callable[..., Any]:
    def cut_at_most(value: Any, pieces: int, fill_with: Any = None) -> Any:
        if isinstance(pieces, int) and pieces > MAX_PIECES:
            raise Exceeded(Limit.RANGE, f"{name} is limited to {MAX_PIECES} pieces")
        return cut(value, pieces, fill_with)

    return cut_at_most


def _printing(cut: Callable[..., Any]) -> Callable[..., Any]:
    """``cut`` refusing a value whose text (which it makes first) would pass the limit."""
    passes = getattr(cut, "jinja_pass_arg", None)  # the context, environment or eval context

    def checked(*args: Any, **kwargs: Any) -> Any:
        check_printed(args[1] if passes is not None else args[0])
        return cut(*args, **kwargs)

    if passes is not None:
        checked.jinja_pass_arg = passes  # type: ignore[attr-defined]
    return checked


@pass_eval_context
def concat(eval_ctx: EvalContext, *parts: Any) -> str:
    """``a ~ b``: the parts joined as Jinja2 joins them, refused when the result would pass
    the limit (a part that is a list repeating a long string is short to hold)."""
    _joined("~", "", list(parts))
    if eval_ctx.autoescape or eval_ctx.volatile:
        return jinja_runtime.markup_join(parts)  # Markup when a part is: kept unescaped
    return jinja_runtime.str_join(parts)


def joined(parts: Iterable[str]) -> str:
    """What a ``{% set %}`` block, a macro or a ``{% call %}`` makes of its output (Jinja2's
    ``environment.concat``), refused when it would pass the limit: a block printing a value
    twice doubles it, and blocks can nest."""
    items = list(parts)
    if sum(len(item) for item in items) > MAX_RESULT:
        raise Exceeded(Limit.RESULT_SIZE, f"a block or macro is limited to {MAX_RESULT} characters")
    return "".join(items)


def checked_range(*args: int) -> range:
    """``range`` of at most :data:`MAX_RANGE` items."""
    found = range(*args)
    if len(found) > MAX_RANGE:
        raise Exceeded(Limit.RANGE, f"range is limited to {MAX_RANGE} items")
    return found


#: Filters that make text of their value first: a list repeating a long string is refused.
_PRINTING: Final = [
    "capitalize",
    "e",
    "escape",
    "forceescape",
    "lower",
    "pprint",
    "safe",
    "string",
    "striptags",
    "title",
    "trim",
    "truncate",
    "upper",
    "urlencode",
    "urlize",
    "wordcount",
]
_CHECKED: Final[Mapping[str, Callable[..., Any]]] = {
    "center": _center,
    "indent": _indent,
    "format": _format,
    "replace": _replace,
    "join": _join,
    "wordwrap": pass_environment(_wordwrap),
    "tojson": _tojson,
    "batch": _pieces("batch", jinja_filters.do_batch),
    "slice": _pieces("slice", jinja_filters.sync_do_slice),
}
#: The filters replaced by checked ones.
FILTERS: Final[Mapping[str, Callable[..., Any]]] = {
    **{name: _printing(jinja_filters.FILTERS[name]) for name in _PRINTING},
    **{name: _printing(cut) if name != "join" else cut for name, cut in _CHECKED.items()},
}
