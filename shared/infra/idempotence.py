"""Which CQL statements the driver may run twice: retried on the next replica, or run on a
second one speculatively while the first is slow (pure).

The driver treats every statement as unsafe to repeat unless it is marked, and only marked
statements are retried after a timeout or sent to a second host. A read is always safe to
repeat. A plain write is safe when its values are fixed (our callers mark those: they know
whether a timestamp or a TTL is computed once). Some statements are never safe, whatever the
caller says: a lightweight transaction (``IF ...``), whose repeat after it applied answers
"not applied" with our own value, so its outcome is resolved by a SERIAL read instead; a
counter or list append (``c = c + ?``), which adds twice; ``now()``/``uuid()``, which write a
new value each time; and schema changes, which are never raced against themselves. A SERIAL
read is not repeated either: two Paxos rounds on one partition at once only contend.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Iterable


class Kind(enum.Enum):
    """What a statement does, as far as repeating it is concerned."""

    READ = "read"
    WRITE = "write"
    CONDITIONAL = "conditional"
    ACCUMULATING = "accumulating"
    SCHEMA = "schema"


#: A condition of a lightweight transaction: ``IF NOT EXISTS``, ``IF EXISTS``, ``IF col ...``
#: (after the statement's body, so a column named ``if_...`` does not match).
_CONDITION = re.compile(
    r"\bIF\s+(?:NOT\s+EXISTS|EXISTS|\w+(?:\[[^\]]*\])?\s*(?:[=<>!]|IN\b))", re.I
)
#: ``c = c + ?`` / ``c = c - ?``: counter increments and list appends or removals.
_ACCUMULATE = re.compile(r"\b(\w+)\s*=\s*\1\s*[+-]", re.I)
#: ``l = ? + l``: list prepends.
_PREPEND = re.compile(r"\b(\w+)\s*=\s*[^,;]*\+\s*\1\b", re.I)
#: Functions that give a new value on every run.
_FRESH = re.compile(
    r"\b(?:now|uuid|currenttimestamp|currenttime|currentdate|currenttimeuuid)\s*\(", re.I
)
_SCHEMA_VERBS = ("CREATE", "ALTER", "DROP", "TRUNCATE", "GRANT", "REVOKE", "USE")


@functools.lru_cache(maxsize=1024)
def kind(cql: str) -> Kind:
    """The kind of one CQL statement (or of the statements of a ``BEGIN BATCH``); cached, as
    the same few hundred statements run over and over."""
    verb = cql.lstrip().split(None, 1)[0].upper() if cql.strip() else ""
    if verb in _SCHEMA_VERBS:
        return Kind.SCHEMA
    if verb == "SELECT":
        return Kind.READ
    body = _without_literals(cql)
    if _CONDITION.search(body):
        return Kind.CONDITIONAL
    if _ACCUMULATE.search(body) or _PREPEND.search(body) or _FRESH.search(body):
        return Kind.ACCUMULATING
    return Kind.WRITE


def repeatable(cql: str, *, marked: bool, serial: bool = False) -> bool:
    """Whether the driver may run ``cql`` twice: reads always (SERIAL reads never), plain
    writes when the caller ``marked`` them, the other kinds never."""
    found = kind(cql)
    if found is Kind.READ:
        return not serial
    return found is Kind.WRITE and marked


def all_repeatable(statements: Iterable[tuple[str, bool]]) -> bool:
    """Whether a batch of ``(cql, marked)`` statements may run twice: every one of them must
    (a batch is one request, repeated whole)."""
    return all(repeatable(cql, marked=marked) for cql, marked in statements)


def _without_literals(cql: str) -> str:
    """``cql`` with its string literals emptied, so that text inside quotes never reads as
    a condition or a function call."""
    return re.sub(r"'(?:[^']|'')*'", "''", cql)
