"""Batch ids: time UUIDs (Cassandra orders and buckets batches by them) whose random parts
come from the OS's cryptographic source, not the predictable ``random`` module."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime

from shared.core.batch_ids import accepted_at
from shared.delivery.batchstore import new_batch_id


def test_a_batch_id_is_a_time_uuid_of_its_moment() -> None:
    now = time.time()

    batch_id = new_batch_id(now)

    assert batch_id.version == 1
    assert abs(accepted_at(batch_id) - datetime.fromtimestamp(now, UTC)).total_seconds() < 1e-5


def test_its_random_parts_do_not_follow_the_random_module() -> None:
    """Reseeding ``random`` the same way twice gives the same ``uuid_from_time`` ids; ours
    differ, and their node never claims to be a real network card."""
    ids = []
    for _ in range(2):
        random.seed(7)
        ids.append(new_batch_id(1_700_000_000.0))

    assert ids[0] != ids[1]
    assert all(i.node & 0x010000000000 for i in ids)
