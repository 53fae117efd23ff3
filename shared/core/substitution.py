"""Literal substitution of keys in a text, SendGrid's way: scanning from the start, the longest
key found at a position is replaced by its value and the scan goes on after it (a value is
never scanned again); where no key starts, the character stays.

Keys are any non-empty strings (``-name-``, ``{{first}}``, ``%a%``, ``a``), up to 100,000 of
them in a Mailgun chunk, so the text has no marker syntax to look for: the keys themselves
are what is looked for. One alternation of every key, as a regular expression, tried each key
at each position (text x keys). Here:

* the keys are sorted once, and each gets the longest other key that is a prefix of it (its
  parent) and a skip pointer up that chain (Myers' skew-binary jump pointers), so that the
  longest of a key's prefixes no longer than a given length takes a few steps;
* a text position is looked at only where some key starts with its character (found by a
  character class, in C), and there the longest key starting at it is found by one binary
  search among the sorted keys for the text ahead: the greatest key not above that text is
  either the key wanted, or the key wanted is the longest of that key's prefixes no longer
  than what it shares with the text.

So the time is the keys' length once, and per position looked at, a binary search and a few
steps: the text x log(keys), each step reading at most the longest key's length of it (128
characters for the API's keys). The structure holds one entry per key.

Pure.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping
from typing import Final

#: Distinct first characters up to which candidate positions are found by a character class
#: (beyond, compiling the class costs more than looking at every character).
CLASS_LIMIT: Final = 512


class Substitution:
    """Keys and their values, prepared once to be replaced in any number of texts."""

    __slots__ = ("_jump", "_keys", "_length", "_longest", "_parent", "_starts", "_values")

    def __init__(self, replacements: Mapping[str, str]) -> None:
        self._values = replacements
        # Index 0 is the root: the empty prefix every chain ends at.
        self._keys = ["", *sorted(k for k in replacements if k)]
        self._length = [len(k) for k in self._keys]
        self._longest = max(self._length)
        self._parent = [0] * len(self._keys)
        self._jump = [0] * len(self._keys)
        self._link()
        firsts = {k[0] for k in self._keys[1:]}
        self._starts: re.Pattern[str] | set[str] = (
            re.compile("[" + "".join(re.escape(c) for c in sorted(firsts)) + "]")
            if 0 < len(firsts) <= CLASS_LIMIT
            else firsts
        )

    @property
    def size(self) -> int:
        """Entries of the prepared structure: one per key (and the root)."""
        return len(self._keys)

    def apply(self, text: str, used: set[str] | None = None) -> str:
        """``text`` with the keys replaced; the keys replaced are added to ``used``."""
        if len(self._keys) == 1 or not text:
            return text
        parts: list[str] = []
        done = 0
        at = self._next_start(text, 0)
        while at >= 0:
            found = self._longest_at(text, at)
            if found == 0:
                at = self._next_start(text, at + 1)
                continue
            key = self._keys[found]
            parts += (text[done:at], self._values[key])
            if used is not None:
                used.add(key)
            done = at + len(key)
            at = self._next_start(text, done)
        if not parts:
            return text
        parts.append(text[done:])
        return "".join(parts)

    def found_in(self, text: str) -> bool:
        """Whether any key occurs in ``text`` (the scan finds one wherever one occurs: it
        either reaches its position or passed it by replacing one that started earlier)."""
        at = self._next_start(text, 0) if len(self._keys) > 1 else -1
        while at >= 0:
            if self._longest_at(text, at):
                return True
            at = self._next_start(text, at + 1)
        return False

    def occurring(self, texts: Iterable[str]) -> set[str]:
        """Every key that occurs anywhere in ``texts``, overlapping ones included: at each
        position, the longest key there and its chain of prefixes (each key marked once)."""
        seen = [True] + [False] * (len(self._keys) - 1)
        for text in texts:
            at = self._next_start(text, 0) if len(self._keys) > 1 else -1
            while at >= 0:
                index = self._longest_at(text, at)
                while not seen[index]:
                    seen[index] = True
                    index = self._parent[index]
                at = self._next_start(text, at + 1)
        return {key for key, found in zip(self._keys, seen, strict=True) if found and key}

    def _next_start(self, text: str, at: int) -> int:
        """The first position from ``at`` where some key starts with the character; -1 if none."""
        starts = self._starts
        if isinstance(starts, re.Pattern):
            found = starts.search(text, at)
            return -1 if found is None else found.start()
        for index in range(at, len(text)):
            if text[index] in starts:
                return index
        return -1

    def _longest_at(self, text: str, at: int) -> int:
        """The index of the longest key starting at ``at`` (0, the root, if none)."""
        ahead = text[at : at + self._longest]
        below = bisect.bisect_right(self._keys, ahead) - 1
        key = self._keys[below]
        if ahead.startswith(key):
            return below  # every key that is a prefix of ahead sorts at or before it
        # Keys that are prefixes of ahead and longer than what key shares with it would sort
        # after key, yet not after ahead: none is; the one wanted is a prefix of key.
        return self._ancestor(below, _shared_length(key, ahead))

    def _ancestor(self, index: int, length: int) -> int:
        """The longest key on ``index``'s chain of prefixes (itself included) no longer than
        ``length``."""
        lengths, jump, parent = self._length, self._jump, self._parent
        while lengths[index] > length:
            index = jump[index] if lengths[jump[index]] > length else parent[index]
        return index

    def _link(self) -> None:
        """Each key's parent and skip pointer, from the keys in sorted order: the keys that
        are prefixes of a key sort before it, and every key between one of them and it
        starts with that one, so a stack holds the chain."""
        keys, parent, jump = self._keys, self._parent, self._jump
        depth = [0] * len(keys)
        chain = [0]
        for index in range(1, len(keys)):
            key = keys[index]
            while not key.startswith(keys[chain[-1]]):
                chain.pop()
            up = chain[-1]
            parent[index], depth[index] = up, depth[up] + 1
            far = jump[up]
            # Myers: skip as far as the parent's skip reaches when its two skips are equal.
            even = depth[up] - depth[far] == depth[far] - depth[jump[far]]
            jump[index] = jump[far] if even else up
            chain.append(index)


def _shared_length(key: str, text: str) -> int:
    """How many leading characters ``key`` (not a prefix of ``text``) shares with ``text``."""
    low, high = 0, len(key)  # key[:low] is a prefix of text; key[:high] is not
    while high - low > 1:
        middle = (low + high) // 2
        if text.startswith(key[low:middle], low):
            low = middle
        else:
            high = middle
    return low
