"""The one precedence rule of recipient state: which write wins, and what a reader sees (pure).

Every write of a recipient's state (and of the stats marks that mirror it) carries a Cassandra
write timestamp from this module, so replays, duplicates and out-of-order arrivals converge by
last-write-wins without reading first:

* ``queued`` (acceptance) is lowest: just below the second the batch was accepted;
* our own give-up ("every provider and retry failed") comes next, still below the acceptance
  second, so *any* provider evidence outranks it, however late it arrives: a ``delivered``
  event that turns up after we gave up makes the recipient ``success``;
* our own drop of a recipient found on the suppression list at send time comes next, also
  below the acceptance second: it says only that *this* attempt did not mail the address, so
  whatever a provider says about an earlier attempt (one whose outcome was unknown when the
  drop was decided) still outranks it; and being fixed per batch, a rerun of the drop (a
  redelivered job) writes the very same cells;
* everything a provider said (and our record of a provider accepting a request) is stamped
  with its own time in whole seconds, never earlier than the acceptance second (a provider
  clock running behind ours must not lose to ``queued``), plus the kind's rank so the later
  stage wins a tie within one second.

Give-ups are written to columns of their own; :func:`visible` merges them with the provider
columns for every reader: a provider outcome if there is one, else ``failed`` if we gave up,
else ``queued``. A drop at send time is written to the provider columns (``dropped``,
``failed``), as the outcome it is, at its own stamp.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.core.batch_ids import accepted_second

#: Microseconds per second.
_US = 1_000_000
#: Below the acceptance second: ``queued`` at acceptance.
_QUEUED_OFFSET = -1000
#: Below the acceptance second too, above ``queued``: our give-up.
_GIVE_UP_OFFSET = -500
#: Above the give-up, still below the acceptance second: our drop at send time (suppressed).
_SUPPRESSED_OFFSET = -250


def queued_stamp(batch_id: uuid.UUID) -> int:
    """The write timestamp of a recipient's ``queued`` state."""
    return accepted_second(batch_id) * _US + _QUEUED_OFFSET


def give_up_stamp(batch_id: uuid.UUID) -> int:
    """The write timestamp of our give-up: above ``queued``, below any provider evidence."""
    return accepted_second(batch_id) * _US + _GIVE_UP_OFFSET


def suppressed_stamp(batch_id: uuid.UUID) -> int:
    """The write timestamp of our drop of a suppressed recipient at send time: above
    ``queued`` and the give-up, below any provider evidence."""
    return accepted_second(batch_id) * _US + _SUPPRESSED_OFFSET


def provider_stamp(batch_id: uuid.UUID, when: datetime, rank: int) -> int:
    """The write timestamp of something a provider said (or accepted) at ``when``.

    Whole seconds, never before the acceptance second, plus ``rank`` (0-999) to order kinds
    within one second.
    """
    if not 0 <= rank < 1000:
        raise ValueError(f"rank must be in 0..999, not {rank}")
    second = max(int(when.timestamp()), accepted_second(batch_id))
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


def queued(row: Mapping[str, Any]) -> bool:
    """Whether ``visible(row).state`` is ``queued``, without building the :class:`Visible`:
    the send path asks it of every recipient of a chunk, twice per call."""
    state = row.get("state")
    return state not in ("success", "failed") and not row.get("gave_up_reason")


#: Recipient cells that hold one value, and those that hold elements (maps, sets).
SCALAR_CELLS = ("state", "event", "reason_detail", "last_update", "gave_up_reason", "gave_up_at")
MAP_CELLS = ("providers", "message_ids")
SET_CELLS = ("evidence", "superseded")
STATE_CELLS = SCALAR_CELLS + MAP_CELLS + SET_CELLS


def stamp_column(cell: str) -> str:
    """The name under which a read returns a cell's write timestamp(s)."""
    return f"w_{cell}"


def _later(a: tuple[int, Any], b: tuple[int, Any]) -> tuple[int, Any]:
    """Cassandra's last-write-wins between two cells: the later write timestamp, and on a tie
    the larger value."""
    return max(a, b)


def _cells(row: Mapping[str, Any], column: str) -> dict[Any, tuple[int, Any]]:
    """A map or set column's elements with each one's write timestamp."""
    value = row.get(column)
    if not value:
        return {}
    stamps = row.get(stamp_column(column)) or []
    if isinstance(value, Mapping):
        return {k: (t, v) for (k, v), t in zip(value.items(), stamps, strict=True)}
    return {k: (t, k) for k, t in zip(value, stamps, strict=True)}


def merge(shared: Mapping[str, Any], own: Mapping[str, Any] | None) -> dict[str, Any]:
    """A recipient's state from its chunk's row (``shared``, the state every recipient of the
    chunk has) and its own row, cell by cell, exactly as Cassandra would have merged the
    writes of both had they gone to one row: by write timestamp (``w_<cell>``), map and set
    elements one by one.

    Returns the state cells with their merged write timestamps (``w_state`` is what the stats
    reconcile compares with).
    """
    out: dict[str, Any] = {}
    for cell in SCALAR_CELLS:
        w = stamp_column(cell)
        best: tuple[int, Any] | None = None
        for row in (shared, own):
            if row is not None and row.get(cell) is not None:
                here = (row[w], row[cell])
                best = here if best is None else _later(best, here)
        out[cell], out[w] = (best[1], best[0]) if best else (None, None)
    for cell in MAP_CELLS + SET_CELLS:
        merged = _cells(shared, cell)
        for key, here in (_cells(own, cell) if own is not None else {}).items():
            merged[key] = _later(merged[key], here) if key in merged else here
        if cell in MAP_CELLS:
            out[cell] = {k: v for k, (_, v) in sorted(merged.items())} if merged else None
        else:
            out[cell] = set(merged) if merged else None
        out[stamp_column(cell)] = [t for _, (t, _) in sorted(merged.items())] or None
    return out
