"""Reading unsigned decimal numbers out of untrusted text (headers, query strings, routing
keys, webhook fields): ASCII digits only, bounded in length.

``str.isdigit()`` is not that check: it accepts "²" and other Unicode digits that ``int()``
then refuses (a ValueError where a 400 was meant), and ``int()`` itself accepts "٣", " 3",
"+3" and "3_000". Every such field goes through :func:`natural` instead.
"""

from __future__ import annotations

#: Longer than any count, size or Unix time we read (and short enough to convert in no time).
MAX_DIGITS = 18


def natural(text: str | None, *, max_digits: int = MAX_DIGITS) -> int | None:
    """``text`` as a non-negative integer when it is 1 to ``max_digits`` ASCII digits, else
    None."""
    if not text or len(text) > max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)
