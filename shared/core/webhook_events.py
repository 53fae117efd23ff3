"""Provider webhook events, normalised: the model every provider parser produces, and the
small pure helpers those parsers share.

Owns:

* :class:`ProviderEvent` -- one thing a provider said happened to one recipient, in our terms
  (``kind``), with the provider's own name kept in ``raw_event``, our correlation ids
  (``batch_id``, ``chunk``, ``log_id``, the ``attempt`` tag), whether a failure is the
  provider's own (``provider_side``: try another provider) or the recipient's (``suppress``:
  final, and the address joins the user's suppression list);
* :data:`KIND_RANK` -- the order that breaks timestamp ties between events of one recipient,
  and :func:`is_outcome`, the kinds that settle a recipient's summary state;
* :class:`ParseResult` and :class:`MalformedPayload`, what parsers return and raise;
* lenient field readers (:func:`parse_uuid`, :func:`parse_chunk`, :func:`parse_tag`,
  :func:`parse_time`, :func:`parse_email`, :func:`text`): a garbage value becomes ``None``,
  never an exception, because one odd field must not make a provider retry a whole signed
  delivery for a day;
* :func:`timestamp_fresh`, the replay window check for signed timestamps.

Nothing here does I/O; provider specifics live in ``shared.providers.*_events``.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import orjson

from shared.core.addresses import address_key
from shared.core.digits import natural
from shared.core.errors import SafedelivrError
from shared.core.models import ATTEMPT_ARG, OUTCOME_STATE, Reported, State

#: What happened to a recipient, in our terms; ``unknown`` for events we do not interpret.
Kind = Literal[Reported, "unknown"]

#: Every kind, in declaration order.
KINDS: tuple[Kind, ...] = get_args(Kind)

#: Tie-break order for events of one recipient with the same timestamp: the later in this
#: order is taken as the later event (a bounce reported in the same second as ``sent`` wins).
KIND_RANK: dict[Kind, int] = {
    "unknown": 0,
    "sent": 1,
    "deferred": 2,
    "delivered": 3,
    "opened": 4,
    "clicked": 5,
    "dropped": 6,
    "bounced": 7,
    "unsubscribed": 8,
    "complained": 9,
}

#: Engagement kinds: recorded beside the outcome, never changing it.
ENGAGEMENT: frozenset[Kind] = frozenset({"opened", "clicked"})

#: Longest free text (reasons, urls, event names) kept from an event.
MAX_TEXT = 1000
#: Longest numeric string accepted as a timestamp or chunk index.
_MAX_DIGITS = 15
#: The largest chunk index a batch can have (``chunk`` columns are CQL ``int``).
MAX_CHUNK = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Verdict:
    """How a parser classifies one provider event before building the ProviderEvent."""

    kind: Kind
    raw_event: str
    reason: str | None = None
    provider_side: bool = False
    suppress: bool = False


def build_event(
    verdict: Verdict,
    *,
    provider: str,
    event_id: str,
    email: str,
    occurred_at: datetime,
    ids: Mapping[str, Any],
    message_id: str | None,
    url: object = None,
) -> ProviderEvent:
    """The normalised event of a classified provider event; ``ids`` holds our correlation
    ids as the provider echoed them (``batch_id``, ``chunk``, ``log_id``)."""
    return ProviderEvent(
        provider=provider,
        event_id=event_id,
        kind=verdict.kind,
        raw_event=verdict.raw_event,
        email=email,
        occurred_at=occurred_at,
        batch_id=parse_uuid(ids.get("batch_id")),
        chunk=parse_chunk(ids.get("chunk")),
        log_id=parse_uuid(ids.get("log_id")),
        attempt=parse_tag(ids.get(ATTEMPT_ARG)),
        message_id=message_id,
        reason=verdict.reason,
        provider_side=verdict.provider_side,
        suppress=verdict.suppress,
        url=text(url) if verdict.kind == "clicked" else None,
    )


class MalformedPayload(SafedelivrError, ValueError):
    """A webhook body is not in the provider's format at all (HTTP 400)."""


def is_outcome(kind: str) -> bool:
    """Whether ``kind`` settles a recipient's summary state (``delivered`` or a failure)."""
    return kind in OUTCOME_STATE


@dataclass(frozen=True, slots=True)
class ProviderEvent:
    """One provider event about one recipient, normalised."""

    provider: str
    """Our provider code: ``sg`` or ``mg``."""
    event_id: str
    """Dedupe key, stable across the provider's redeliveries of this event."""
    kind: Kind
    raw_event: str
    """The provider's own name with its subtype, e.g. ``bounce/blocked``."""
    email: str
    """The recipient, lower-cased."""
    occurred_at: datetime
    """When it happened (UTC-aware), from the event's own timestamp."""
    batch_id: uuid.UUID | None
    chunk: int | None
    log_id: uuid.UUID | None
    attempt: str | None
    """The tag of our attempt the event reports on (``c.<n>``, ``r.<n>``), as echoed."""
    message_id: str | None
    """The provider's message id as its send API returned it (X-Message-Id, Mailgun ``id``)."""
    reason: str | None
    """Why, in words: bounce reason, deferral response, drop reason."""
    provider_side: bool
    """The failure is the provider's own: another provider may succeed."""
    suppress: bool
    """The address must not be mailed again (hard bounce, complaint, unsubscribe...)."""
    url: str | None = None
    """The link of a ``clicked`` event."""
    machine: str | None = None
    """Who made an open or click when it was a machine (``shared.engagement.prefetch``), not a
    reader."""

    @property
    def final(self) -> bool:
        """Whether this settles the recipient for good (an outcome that is not the provider's
        own failure: those are retried through another provider)."""
        return is_outcome(self.kind) and not self.provider_side

    @property
    def state(self) -> State | None:
        """The summary state this event settles, or None if it settles nothing."""
        return OUTCOME_STATE[self.kind] if self.final else None

    @property
    def engagement(self) -> bool:
        """Whether this is an open or a click."""
        return self.kind in ENGAGEMENT


@dataclass(frozen=True, slots=True)
class ParseResult:
    """The events of one webhook delivery, and how many were skipped (no recipient)."""

    events: tuple[ProviderEvent, ...]
    skipped: int = 0


def text(value: object, limit: int = MAX_TEXT) -> str | None:
    """``value`` stripped and cut to ``limit`` characters if it is a non-empty string."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value[:limit] or None


def parse_email(value: object) -> str | None:
    """A lower-cased recipient address, or None when ``value`` is not a plausible one."""
    address = text(value, limit=320)
    if address is None or "@" not in address:
        return None
    return address_key(address)


def parse_uuid(value: object) -> uuid.UUID | None:
    """One of our ids (batch and log ids are time UUIDs) from its string form; None for
    anything else, other UUID versions included: Cassandra refuses to compare them with a
    timeuuid column, so a forged one would fail the whole delivery."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = uuid.UUID(value.strip())
    except ValueError:
        return None
    return parsed if parsed.version == 1 else None


def parse_tag(value: object) -> str | None:
    """An attempt tag (``c.<n>`` or ``r.<n>``) as we send it; None for anything else."""
    if not isinstance(value, str) or len(value) > 12:
        return None
    kind, dot, number = value.partition(".")
    count = natural(number)
    if kind in ("c", "r") and dot and count is not None:
        return f"{kind}.{count}"
    return None


def parse_chunk(value: object) -> int | None:
    """A chunk index from an int or a string of digits; None for anything else, and for an
    index no batch can have (chunks are a 32-bit CQL int)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = natural(value.strip(), max_digits=_MAX_DIGITS)
    if isinstance(value, int) and 0 <= value <= MAX_CHUNK:
        return value
    return None


def _seconds(value: object) -> float | None:
    """Unix seconds from a JSON number or a numeric string; None if not finite."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip()) if len(value) <= 32 else None
        except ValueError:
            return None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def parse_time(value: object) -> datetime | None:
    """A UTC-aware datetime from unix seconds (sub-second kept); None if unusable."""
    seconds = _seconds(value)
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def event_key(value: object) -> str | None:
    """Unix seconds formatted to microseconds, for composite dedupe keys; None if unusable."""
    seconds = _seconds(value)
    if seconds is None or parse_time(seconds) is None:
        return None
    return f"{seconds:.6f}"


def content_id(document: Mapping[str, Any]) -> str:
    """A dedupe key derived from an event's content, for events without a usable id."""
    try:
        canonical = orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:
        # orjson reads 1024 levels of nesting but writes only 255: such an event is hostile.
        raise MalformedPayload(f"an event cannot be identified: {exc}") from exc
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def timestamp_fresh(timestamp: str, now: float, tolerance: int) -> bool:
    """Whether a signed unix ``timestamp`` (integer seconds) is within ``tolerance`` of ``now``.

    Anything that is not a plain integer string is not fresh.
    """
    stamp = natural(timestamp.strip(), max_digits=_MAX_DIGITS)
    return stamp is not None and abs(now - stamp) <= tolerance
