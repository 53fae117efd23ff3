"""The raw webhook loop (L_webhook) writes a post's events grouped as the ingest groups them
(``RecipientStore.reported_many``), so it never does more requests than the pipeline."""

from __future__ import annotations

import time

from cassandra.util import uuid_from_time

from bench.hooks import plan_post, posted
from shared.delivery.recipients import log_id_for
from shared.delivery.stats import DEFAULT_BUCKETS, bucket_of


def test_a_post_is_one_request_per_stat_partition_plus_the_marks_and_the_states() -> None:
    """A 100-event post: each recipient's outcome row in its own bucket's group, one group
    per bucket, then one request for the dirty marks and one for the batch's states."""
    batch_id = uuid_from_time(time.time())
    ids = [log_id_for(batch_id, f"r{i}@example.com") for i in range(100)]

    plan = plan_post(ids)

    buckets = {bucket_of(i, DEFAULT_BUCKETS) for i in ids}
    assert set(plan.stats) == buckets
    assert {(b, i) for b, group in plan.stats.items() for i in group} == {
        (bucket_of(i, DEFAULT_BUCKETS), i) for i in ids
    }
    assert plan.states == ids
    assert plan.requests == len(buckets) + 2 < len(ids)


def test_the_raw_loop_and_the_signed_posts_write_the_same_recipients() -> None:
    """Post n covers the same slice of the seeded recipients in both, wrapping at the end."""
    targets = list(range(1000))

    assert posted(targets, 100, 3) == list(range(300, 400))
    assert posted(targets, 100, 12) == list(range(200, 300))
