"""What the providers remember about accepted mail, as their query APIs show it.

* SendGrid's Email Activity Feed (``GET /v3/messages?query=...&limit=N``): one message per
  recipient, found by a small query language (``field="value"`` clauses joined by ``AND``,
  ``unique_args['key']="value"`` for custom args, ``last_event_time BETWEEN TIMESTAMP "a" AND
  TIMESTAMP "b"``, parentheses). It needs the Email Activity History add-on: without it the
  answer is 400 ``authorization required``, as SendGrid answers.
* Mailgun's Events API (``GET /v3/<domain>/events``): ``accepted`` events with their
  ``user-variables``, filtered by ``event``, ``recipient``, ``begin``/``end`` (epoch seconds),
  ``ascending`` and ``limit`` (at most 300), paged through opaque ``paging.next`` URLs until a
  page comes back empty. Mailgun has no filter on user variables: clients filter those.
  Mailgun's other filters (``tags``, ``message-id``, ``from``, ...) are refused with 400
  rather than ignored, so a filter the sandbox does not apply never reads as "every event".

Both index a message only :attr:`MessageIndex.delay` seconds after accepting it, as real
providers do. Pure parsing here; the index is bounded, and kept per recipient too so that a
``recipient`` query costs what that address received, not what the account did.
"""

from __future__ import annotations

import base64
import math
import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from shared.core.digits import natural


@dataclass(frozen=True, slots=True)
class Indexed:
    """One recipient of one accepted message."""

    provider: str
    message_id: str
    recipient: str
    accepted_at: float
    args: Mapping[str, str]
    """SendGrid ``custom_args`` (shown as ``unique_args``) or Mailgun ``user-variables``."""
    subject: str
    sender: str
    domain: str = ""
    """Mailgun: the sending domain it was posted to (its Events API shows only its own)."""


class MessageIndex:
    """Accepted recipients per provider, visible ``delay`` seconds after acceptance; the
    ``capacity`` most recent are kept."""

    def __init__(self, *, delay: float, capacity: int) -> None:
        self.delay = delay
        self._capacity = capacity
        self._entries: dict[str, deque[Indexed]] = {"sendgrid": deque(), "mailgun": deque()}
        self._by_recipient: dict[str, dict[str, deque[Indexed]]] = {
            "sendgrid": {},
            "mailgun": {},
        }

    def add(self, entries: Iterable[Indexed]) -> None:
        if self._capacity <= 0:
            return
        for entry in entries:
            kept = self._entries[entry.provider]
            if len(kept) >= self._capacity:
                self._forget(kept.popleft())
            kept.append(entry)
            self._by_recipient[entry.provider].setdefault(entry.recipient, deque()).append(entry)

    def _forget(self, entry: Indexed) -> None:
        by_recipient = self._by_recipient[entry.provider]
        own = by_recipient[entry.recipient]
        own.popleft()  # the oldest entry of all is the oldest of its recipient too
        if not own:
            del by_recipient[entry.recipient]

    def visible(self, provider: str, now: float, recipient: str | None = None) -> list[Indexed]:
        """The entries old enough to be shown, all or only ``recipient``'s (lower case)."""
        cutoff = now - self.delay
        if recipient is None:
            source: Iterable[Indexed] = self._entries[provider]
        else:
            source = self._by_recipient[provider].get(recipient, ())
        return [e for e in source if e.accepted_at <= cutoff]


# -- SendGrid's query language --------------------------------------------------------------


class QueryError(ValueError):
    """The ``query`` is not one we understand (SendGrid answers 400 ``invalid syntax``)."""


@dataclass(frozen=True, slots=True)
class Clause:
    field: str
    key: str | None
    value: str
    upper: str | None = None
    """The end of a ``BETWEEN`` range (``value`` is its start)."""


_FIELDS = frozenset({"msg_id", "to_email", "from_email", "subject", "status", "unique_args"})
_CLAUSE = re.compile(
    r"^\(?\s*(?P<field>[a-z_]+)(?:\['(?P<key>[^']{1,100})'\])?"
    r'\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*\)?$'
)
_BETWEEN = re.compile(
    r'^\(?\s*last_event_time\s+BETWEEN\s+TIMESTAMP\s+"(?P<a>[^"]+)"'
    r'\s+AND\s+TIMESTAMP\s+"(?P<b>[^"]+)"\s*\)?$'
)
_AND = re.compile(r"\s+AND\s+(?=\(?\s*[a-z_]+(?:\[|\s*=|\s+BETWEEN))")


def parse_query(query: str) -> list[Clause]:
    """``query``'s clauses (all must hold); raises QueryError for anything else."""
    if len(query) > 4000:
        raise QueryError("invalid syntax: the query is too long")
    if not query.strip():
        return []  # the most recent messages
    clauses = []
    for part in _AND.split(query.strip()):
        between = _BETWEEN.match(part.strip())
        if between:
            clauses.append(Clause("last_event_time", None, between["a"], between["b"]))
            continue
        match = _CLAUSE.match(part.strip())
        if match is None:
            raise QueryError(f"invalid syntax: cannot parse {part.strip()[:80]!r}")
        field, key = match["field"], match["key"]
        if field not in _FIELDS:
            raise QueryError(f"invalid syntax: '{field}' is not a known field")
        if (field == "unique_args") != (key is not None):
            raise QueryError(
                "operator = is incompatible with MAP<STRING,STRING>, STRING"
                if field == "unique_args"
                else f"invalid syntax: '{field}' takes no key"
            )
        clauses.append(Clause(field, key, match["value"].replace('\\"', '"')))
    return clauses


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _matches(entry: Indexed, clause: Clause) -> bool:
    if clause.field == "unique_args":
        return entry.args.get(clause.key or "") == clause.value
    if clause.field == "last_event_time":
        return clause.value <= _iso(entry.accepted_at) <= (clause.upper or "")
    actual = {
        "msg_id": entry.message_id,
        "to_email": entry.recipient,
        "from_email": entry.sender,
        "subject": entry.subject,
        "status": "delivered",
    }[clause.field]
    if clause.field == "msg_id":
        return actual == clause.value or actual.startswith(clause.value + ".")
    if clause.field.endswith("email"):
        return actual.lower() == clause.value.lower()
    return actual == clause.value


def search_messages(
    entries: Iterable[Indexed], clauses: list[Clause], limit: int
) -> list[dict[str, Any]]:
    """The ``messages`` of an Email Activity answer, newest first."""
    found = [e for e in entries if all(_matches(e, c) for c in clauses)]
    found.sort(key=lambda e: e.accepted_at, reverse=True)
    return [
        {
            "from_email": e.sender,
            "msg_id": e.message_id,
            "subject": e.subject,
            "to_email": e.recipient,
            "status": "delivered",
            "opens_count": 0,
            "clicks_count": 0,
            "last_event_time": _iso(e.accepted_at),
        }
        for e in found[:limit]
    ]


# -- Mailgun's Events API -------------------------------------------------------------------

#: Most events in one page.
MAILGUN_MAX_LIMIT = 300
#: The query parameters the sandbox applies (``pretty`` only formats the answer).
MAILGUN_PARAMETERS = frozenset(
    {"begin", "end", "ascending", "limit", "event", "recipient", "pretty"}
)


@dataclass(frozen=True, slots=True)
class EventsQuery:
    begin: float
    end: float | None
    ascending: bool
    limit: int
    event: str | None
    recipient: str | None
    offset: int = 0

    def token(self, offset: int) -> str:
        """An opaque page token for the same query at ``offset``."""
        data = {
            "b": self.begin,
            "e": self.end,
            "a": self.ascending,
            "l": self.limit,
            "ev": self.event,
            "r": self.recipient,
            "o": offset,
        }
        return base64.urlsafe_b64encode(orjson.dumps(data)).decode().rstrip("=")

    @classmethod
    def from_token(cls, token: str) -> EventsQuery:
        try:
            d = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            query = cls(d["b"], d["e"], bool(d["a"]), int(d["l"]), d["ev"], d["r"], int(d["o"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise QueryError("invalid page token") from exc
        if not query.well_formed():
            raise QueryError("invalid page token")
        return query

    def well_formed(self) -> bool:
        """Whether every field has its type and range (a token is client input)."""
        times = (self.begin,) if self.end is None else (self.begin, self.end)
        return (
            all(isinstance(t, (int, float)) and math.isfinite(t) for t in times)
            and 1 <= self.limit <= MAILGUN_MAX_LIMIT
            and self.offset >= 0
            and (self.event is None or isinstance(self.event, str))
            and (self.recipient is None or isinstance(self.recipient, str))
        )


def parse_events_query(params: Mapping[str, str], now: float) -> EventsQuery:
    """The query of ``GET /v3/<domain>/events``; raises QueryError with Mailgun's message."""
    unapplied = sorted(set(params) - MAILGUN_PARAMETERS)
    if unapplied:
        raise QueryError(f"the sandbox does not filter on {unapplied[0]!r}")
    begin, end = _epoch(params.get("begin")), _epoch(params.get("end"))
    ascending_raw = params.get("ascending")
    if ascending_raw not in (None, "yes", "no"):
        raise QueryError("ascending must be yes or no")
    if end is None and ascending_raw is None and begin is not None:
        raise QueryError("ascending is required when end is not given")
    if ascending_raw is None and begin is not None and end is not None:
        ascending = begin < end  # Mailgun deduces the direction from the range
    else:
        ascending = ascending_raw == "yes"
    if begin is not None and end is not None and (begin < end) != ascending and begin != end:
        raise QueryError(f"Inconsistent range: begin={begin}, end={end}, ascending={ascending}")
    if begin is not None and end is not None and begin == end:
        raise QueryError(f"Inconsistent range: begin={begin}, end={end}, ascending={ascending}")
    limit = natural(params.get("limit", "100"))
    if limit is None or not 1 <= limit <= MAILGUN_MAX_LIMIT:
        raise QueryError(f"limit must be between 1 and {MAILGUN_MAX_LIMIT}")
    return EventsQuery(
        begin=begin if begin is not None else (0.0 if ascending else now),
        end=end,
        ascending=ascending,
        limit=limit,
        event=params.get("event"),
        recipient=(params.get("recipient") or "").lower() or None,
    )


def _epoch(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise QueryError(f"cannot parse {value!r} as epoch seconds") from None
    if not math.isfinite(seconds):  # nan and inf parse, then break every comparison
        raise QueryError(f"cannot parse {value!r} as epoch seconds")
    return seconds


def events_page(entries: Iterable[Indexed], query: EventsQuery) -> tuple[list[Indexed], int]:
    """One page of ``accepted`` events and the offset of the next page."""
    if query.event not in (None, "accepted"):
        return [], query.offset
    lo, hi = sorted((query.begin, query.end if query.end is not None else query.begin))
    if query.end is None:
        lo, hi = (query.begin, float("inf")) if query.ascending else (float("-inf"), query.begin)
    found = [
        e for e in entries if lo <= e.accepted_at <= hi and (query.recipient in (None, e.recipient))
    ]
    found.sort(key=lambda e: e.accepted_at, reverse=not query.ascending)
    page = found[query.offset : query.offset + query.limit]
    return page, query.offset + len(page)
