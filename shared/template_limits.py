"""What a user's template may ask of the sandbox in one step: the size checks on operators,
formats, string methods and filters whose result can be far larger than what they are given.

A render's output and time are limited by ``shared.template_render`` between steps, but one
step (``"x" * n``, ``"{:>n}".format(...)``, ``s.ljust(n)``, ``sep.join(items)``,
``s|replace(a, b)``, ``s|center(n)``) runs in C and can ask for gigabytes before any check
runs again. These refuse such a step *before* it runs, with
:class:`jinja2.exceptions.SecurityError` naming it; what they let through is at most about
:data:`MAX_RESULT` characters (or list items). A format whose width is itself a replacement
field (``'{0:{1}}'``) is refused outright: its width is only known once it is formatted. A
list that repeats a long string is small to hold and huge as text, so printing a value
(``{{ v }}``), ``~`` and the filters that make text of their value count its text first.

Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from types import BuiltinMethodType
from typing import Any, Final

from jinja2 import filters as jinja_filters
from jinja2 import pass_environment, pass_eval_context
from jinja2 import runtime as jinja_runtime
from jinja2.exceptions import SecurityError
from jinja2.nodes import EvalContext

#: Largest result of one step.
MAX_RESULT: Final = 1_000_000
#: Widest field (or longest precision) a format may pad to.
MAX_WIDTH: Final = 10_000
#: Largest integer ``**`` may compute, in bits.
MAX_POWER_BITS: Final = 100_000
#: Most pieces ``batch`` and ``slice`` may cut a sequence into.
MAX_PIECES: Final = 10_000
#: Widest indent ``tojson`` may use.
MAX_JSON_INDENT: Final = 8
#: How deep :func:`text_size` looks into nested containers before it gives up.
_MAX_DEPTH: Final = 20

#: A printf-style conversion: its width and precision (``*``: taken from the arguments).
_PERCENT: Final = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
#: A ``str.format`` replacement field's spec, nested fields included.
_BRACES: Final = re.compile(r"\{[^{}:]*:((?:[^{}]|\{[^{}]*\})*)\}")
#: A ``str.format`` replacement field (escaped braces are taken out first).
_FIELD: Final = re.compile(r"\{[^{}]*\}")
_NUMBER: Final = re.compile(r"\d+")


def _too_wide(numbers: Iterable[int], what: str) -> None:
    if any(n > MAX_WIDTH for n in numbers):
        raise SecurityError(f"{what}: widths and precisions are limited to {MAX_WIDTH}")


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
        raise SecurityError(f"{what}: the result would pass {MAX_RESULT} characters")


def check_percent_format(fmt: str, args: Iterable[Any]) -> None:
    """``fmt % args`` (and the ``format`` filter) pads to no more than :data:`MAX_WIDTH`,
    and its result is no longer than about :data:`MAX_RESULT`."""
    given = list(args)
    specs = _PERCENT.findall(fmt)
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
        raise SecurityError("a format: a width or precision cannot be another field")
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
    """Refuse ``*``, ``**`` and ``%`` whose result would pass the limits."""
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            repeated = isinstance(seq, str | bytes | list | tuple) and isinstance(times, int)
            if repeated and len(seq) * times > MAX_RESULT:
                raise SecurityError(f"repeating {len(seq)} items {times} times is too much")
    elif operator == "**":
        powers = isinstance(left, int) and isinstance(right, int) and right > 0
        if powers and left.bit_length() * right > MAX_POWER_BITS:
            raise SecurityError("the power is too large")
    elif operator == "%" and isinstance(left, str | bytes):
        fmt = left if isinstance(left, str) else left.decode("latin-1")
        check_percent_format(fmt, _values(right))


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
    """Refuse a call of a ``str`` or ``bytes`` method whose result would pass
    :data:`MAX_RESULT` (``ljust``, ``rjust``, ``center``, ``zfill``, ``expandtabs``,
    ``replace``, ``translate``, ``join``); the arguments to call it with (``join``'s items
    listed, to be counted before they are joined)."""
    text = getattr(method, "__self__", None)
    if not isinstance(method, BuiltinMethodType) or not isinstance(text, str | bytes):
        return args
    name = method.__name__
    if name == "join" and len(args) == 1 and not kwargs:
        items = list(args[0])
        _joined(name, text, items)
        return (items,)
    if _width_of(name, text, args, kwargs) > MAX_RESULT:
        raise SecurityError(f"{name} is limited to {MAX_RESULT} characters")
    return args


def _joined(what: str, sep: str | bytes, items: list[Any]) -> None:
    size = len(sep) * max(0, len(items) - 1)
    for item in items:
        size += text_size(item)
        if size > MAX_RESULT:
            raise SecurityError(f"{what} is limited to {MAX_RESULT} characters")


def check_printed(value: Any) -> Any:
    """``value`` as it is, unless printing it (``{{ value }}``) would pass the limit: a list
    repeating one long string is small to hold and huge as text."""
    if not isinstance(value, str) and text_size(value) > MAX_RESULT:
        raise SecurityError(f"printing this value would pass {MAX_RESULT} characters")
    return value


def _center(value: Any, width: int = 80) -> str:
    if isinstance(width, int) and width > MAX_RESULT:
        raise SecurityError(f"center is limited to {MAX_RESULT} characters")
    return jinja_filters.do_center(value, width)


def _indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    step = width if isinstance(width, int) else len(str(width))
    if step * (str(s).count("\n") + 1) > MAX_RESULT:
        raise SecurityError(f"indent is limited to {MAX_RESULT} characters")
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
        raise SecurityError(f"wordwrap is limited to {MAX_RESULT} characters")
    return jinja_filters.do_wordwrap(environment, s, width, *args, **kwargs)


@pass_eval_context
def _tojson(eval_ctx: EvalContext, value: Any, indent: Any = None) -> Any:
    wide = isinstance(indent, int) and indent > MAX_JSON_INDENT
    if wide or (isinstance(indent, str) and len(indent) > MAX_JSON_INDENT):
        raise SecurityError(f"tojson's indent is limited to {MAX_JSON_INDENT}")
    return jinja_filters.do_tojson(eval_ctx, value, indent)


def _format(value: Any, *args: Any, **kwargs: Any) -> str:
    check_percent_format(str(value), [*args, *kwargs.values()])
    return jinja_filters.do_format(value, *args, **kwargs)


@pass_eval_context
def _replace(eval_ctx: EvalContext, s: Any, old: Any, new: Any, count: int | None = None) -> str:
    text, found = str(s), str(old)
    times = text.count(found) if count is None else min(count, text.count(found))
    if len(text) + times * len(str(new)) > MAX_RESULT:
        raise SecurityError(f"replace is limited to {MAX_RESULT} characters")
    return jinja_filters.do_replace(eval_ctx, s, old, new, count)


def _pieces(name: str, cut: Callable[..., Any]) -> Callable[..., Any]:
    def cut_at_most(value: Any, pieces: int, fill_with: Any = None) -> Any:
        if isinstance(pieces, int) and pieces > MAX_PIECES:
            raise SecurityError(f"{name} is limited to {MAX_PIECES} pieces")
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
