"""What a user's template may ask of the sandbox in one step: the size checks on operators,
formats and filters whose result can be far larger than what they are given.

A render's output and time are limited by ``shared.template_render`` between steps, but one
step (``"x" * n``, ``"{:>n}".format(...)``, ``s|replace(a, b)``, ``s|center(n)``) runs in C
and can ask for gigabytes before any check runs again. These refuse such a step *before* it
runs, with :class:`jinja2.exceptions.SecurityError` naming it; what they let through is at
most :data:`MAX_RESULT` characters (or list items).

Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from jinja2 import filters as jinja_filters
from jinja2 import pass_eval_context
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

#: A printf-style conversion: its width and precision (``*``: taken from the arguments).
_PERCENT: Final = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
#: A ``str.format`` replacement field's spec, nested fields included.
_BRACES: Final = re.compile(r"\{[^{}:]*:((?:[^{}]|\{[^{}]*\})*)\}")
_NUMBER: Final = re.compile(r"\d+")


def _too_wide(numbers: Iterable[int], what: str) -> None:
    if any(n > MAX_WIDTH for n in numbers):
        raise SecurityError(f"{what}: widths and precisions are limited to {MAX_WIDTH}")


def _ints(values: Iterable[Any]) -> list[int]:
    return [v for v in values if isinstance(v, int)]


def check_percent_format(fmt: str, args: Iterable[Any]) -> None:
    """``fmt % args`` (and the ``format`` filter) pads to no more than :data:`MAX_WIDTH`."""
    specs = _PERCENT.findall(fmt)
    _too_wide((int(n) for spec in specs for n in spec if n.isdigit()), "a % format")
    if any("*" in spec for spec in specs):
        _too_wide(_ints(args), "a % format")


def check_brace_format(fmt: str, args: Iterable[Any]) -> None:
    """``fmt.format(...)`` pads to no more than :data:`MAX_WIDTH`."""
    specs = _BRACES.findall(fmt)
    _too_wide((int(n) for spec in specs for n in _NUMBER.findall(spec)), "a format")
    if any("{" in spec for spec in specs):
        _too_wide(_ints(args), "a format")


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
            repeated = isinstance(seq, str | list | tuple) and isinstance(times, int)
            if repeated and len(seq) * times > MAX_RESULT:
                raise SecurityError(f"repeating {len(seq)} items {times} times is too much")
    elif operator == "**":
        powers = isinstance(left, int) and isinstance(right, int) and right > 0
        if powers and left.bit_length() * right > MAX_POWER_BITS:
            raise SecurityError("the power is too large")
    elif operator == "%" and isinstance(left, str):
        check_percent_format(left, _values(right))


def _center(value: Any, width: int = 80) -> str:
    if isinstance(width, int) and width > MAX_RESULT:
        raise SecurityError(f"center is limited to {MAX_RESULT} characters")
    return jinja_filters.do_center(value, width)


def _indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    step = width if isinstance(width, int) else len(str(width))
    if step * (str(s).count("\n") + 1) > MAX_RESULT:
        raise SecurityError(f"indent is limited to {MAX_RESULT} characters")
    return jinja_filters.do_indent(s, width, first, blank)


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


#: The filters replaced by checked ones.
FILTERS: Final[Mapping[str, Callable[..., Any]]] = {
    "center": _center,
    "indent": _indent,
    "format": _format,
    "replace": _replace,
    "batch": _pieces("batch", jinja_filters.do_batch),
    "slice": _pieces("slice", jinja_filters.sync_do_slice),
}
