"""Rewriting the links of an HTML message for click tracking, and finding them.

Only ``href`` values of ``<a>`` and ``<area>`` tags that are absolute ``http(s)`` URLs are
rewritten; ``mailto:``, ``tel:``, in-page anchors, relative URLs and any link holding a
substitution key (it differs per recipient: it cannot be one stored link) stay as they are,
as does every other byte of the message. Each absolute link gets the index of its place
among them, whether it is rewritten or not, so the numbering depends on the message alone,
never on whose substitution keys it is sent with (two occurrences of one URL are two links:
a click is attributed to the one clicked). The stored link is the URL as the browser would
have followed it (HTML entities decoded); the redirect goes there and nowhere else
(``engagement_tokens``).

A tag is ``<a`` or ``<area`` (any case, then a non-word character) up to the first ``>``, and
tags do not overlap. That is all the parsing there is, and it must not change: the tracking
endpoint numbers the links of messages sent before it was deployed with the same rules
(:func:`tags`). The scan reads each character at most twice, once looking for ``<`` and once
looking for the ``>`` that closes a tag: when no ``>`` is left, no tag is, and it stops (a
regular expression rescans the rest of the text for each unclosed ``<a``: quadratic).

Pure.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from shared.core.substitution import Substitution

_NAME: Final = re.compile(r"(?:a|area)\b", re.IGNORECASE)
_HREF: Final = re.compile(
    r"""((?<![\w-])href\s*=\s*)("([^"]*)"|'([^']*)'|([^\s"'>]+))""", re.IGNORECASE
)
_TRACKABLE: Final = re.compile(r"^https?://[^\s/?#]+", re.IGNORECASE)
#: Links one message may have tracked (beyond these, links stay as they are).
MAX_LINKS: Final = 500


def trackable(url: str, keys: Sequence[str] = ()) -> bool:
    """Whether a (decoded) link is rewritten: absolute http(s), no substitution key."""
    return bool(_TRACKABLE.match(url)) and not any(k and k in url for k in keys)


def tags(source: str) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` of each ``<a>`` and ``<area>`` tag of ``source``, in order."""
    at = source.find("<")
    while at >= 0:
        if _NAME.match(source, at + 1) is None:
            at = source.find("<", at + 1)
            continue
        end = source.find(">", at + 2)
        if end < 0:
            return  # no tag can close after here
        yield at, end + 1
        at = source.find("<", end + 1)


def _holding_none_of(keys: Sequence[str]) -> Callable[[str], bool]:
    """Whether a link holds none of ``keys``: one scan of it finds any of them (a chunk has
    up to 100,000), where a search per key took keys x link."""
    holding = Substitution(dict.fromkeys(keys, ""))
    return lambda url: not holding.found_in(url)


def rewrite(
    source: str,
    tracked_url: Callable[[int], str],
    keys: Sequence[str] = (),
    limit: int = MAX_LINKS,
    rewritable: Callable[[str], bool] | None = None,
) -> tuple[str, list[str]]:
    """``source`` with each trackable link (the first ``limit`` absolute ones, less those
    holding one of ``keys``; or those ``rewritable`` says) replaced by ``tracked_url(index)``,
    and every absolute link among the first ``limit`` in index order."""
    replaced = rewritable or _holding_none_of(keys)
    links: list[str] = []

    def tag(text: str) -> str:
        found = _HREF.search(text)
        if found is None:
            return text
        raw = next(g for g in found.group(3, 4, 5) if g is not None)
        url = html.unescape(raw).strip()
        if not trackable(url):
            return text
        index = len(links)
        links.append(url)
        if not replaced(url):
            return text
        replacement = f'{found.group(1)}"{html.escape(tracked_url(index), quote=True)}"'
        return text[: found.start()] + replacement + text[found.end() :]

    parts: list[str] = []
    done = 0
    for start, end in tags(source):
        if len(links) >= limit:
            break  # no later tag changes
        parts += (source[done:start], tag(source[start:end]))
        done = end
    parts.append(source[done:])
    return "".join(parts), links
