"""The one precedence rule of recipient state: which write wins, and what a reader sees (pure).

Every write of a recipient's state (and of the stats marks that mirror it) carries a Cassandra
write timestamp from this module, so replays, duplicates and out-of-order arrivals converge by
last-write-wins without reading first:

* ``queued`` (acceptance) is lowest: just below the second the batch was accepted;
* our own give-up ("every provider and retry failed") comes next, still below the acceptance
  second, so *any* provider evidence outranks it, however late it arrives: a ``delivered``
  event that turns up after we gave up makes the recipient ``success``;
* everything a provider said (and our record of a provider accepting a request) is stamped
  with its own time in whole seconds, never earlier than the acceptance second (a provider
  clock running behind ours must not lose to ``queued``), plus the kind's rank so the later
  stage wins a tie within one second.

Give-ups are written to columns of their own; :func:`visible` merges them with the provider
columns for every reader: a provider outcome if there is one, else ``failed`` if we gave up,
else ``queued``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: Microseconds per second.
_US = 1_000_000
#: Below the acceptance second: ``queued`` at acceptance.
_QUEUED_OFFSET = -1000
#: Below the acceptance second too, above ``queued``: our give-up.
_GIVE_UP_OFFSET = -500

#: RFC 4122 time of a time-based UUID: 100 ns intervals since 1582-10-15.
_UUID_EPOCH = 0x01B21DD213814000


def accepted_at(batch_id: uuid.UUID) -> datetime:
    """When a batch was accepted: the time inside its time-based id (UTC)."""
    return datetime.fromtimestamp((batch_id.time - _UUID_EPOCH) / 1e7, UTC)


def _accepted_second(batch_id: uuid.UUID) -> int:
    return (batch_id.time - _UUID_EPOCH) // 10_000_000


def queued_stamp(batch_id: uuid.UUID) -> int:
    """The write timestamp of a recipient's ``queued`` state."""
    return _accepted_second(batch_id) * _US + _QUEUED_OFFSET


def give_up_stamp(batch_id: uuid.UUID) -> int:
    """The write timestamp of our give-up: above ``queued``, below any provider evidence."""
    return _accepted_second(batch_id) * _US + _GIVE_UP_OFFSET


def provider_stamp(batch_id: uuid.UUID, when: datetime, rank: int) -> int:
    """The write timestamp of something a provider said (or accepted) at ``when``.

    Whole seconds, never before the acceptance second, plus ``rank`` (0-999) to order kinds
    within one second.
    """
    if not 0 <= rank < 1000:
        raise ValueError(f"rank must be in 0..999, not {rank}")
    second = max(int(when.timestamp()), _accepted_second(batch_id))
    return second * _US + rank


@dataclass(frozen=True, slots=True)
class Visible:
    """A recipient as every reader sees it."""

    state: str
    """``queued``, ``success`` or ``failed``."""
    event: str
    """The latest detailed event (``failed`` when we gave up and no provider spoke since)."""
    reason: str | None


def visible(row: Mapping[str, Any]) -> Visible:
    """Merge a recipient row's provider columns with our give-up columns.

    ``row`` needs ``state``, ``event``, ``reason_detail`` and ``gave_up_reason``.
    """
    state = row.get("state") or (
        # Any other fallback is an equivalent mutant: it is only compared with success/failed.
        "queued"  # pragma: no mutate
    )
    if state in ("success", "failed"):
        return Visible(state, row.get("event") or state, row.get("reason_detail"))
    gave_up = row.get("gave_up_reason")
    if gave_up:
        return Visible("failed", "failed", gave_up)
    return Visible("queued", row.get("event") or "queued", None)
