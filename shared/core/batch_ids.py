"""What a batch id says: the moment its batch was accepted, held in the time-based UUID
(Cassandra orders and buckets batches by it). Pure."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

#: RFC 4122 time of a time-based UUID: 100 ns intervals since 1582-10-15.
_UUID_EPOCH = 0x01B21DD213814000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def accepted_at(batch_id: uuid.UUID) -> datetime:
    """When a batch was accepted: the time inside its time-based id (UTC)."""
    # Integer arithmetic, floored to the microsecond: a float rounds the last 100 ns ticks of
    # a day into the next one.
    micros = (batch_id.time - _UUID_EPOCH) // 10
    return _EPOCH + timedelta(microseconds=micros)


def accepted_second(batch_id: uuid.UUID) -> int:
    """The Unix second in which a batch was accepted (floored)."""
    return (batch_id.time - _UUID_EPOCH) // 10_000_000
