"""Where a user's daily activity is recorded: a bucket from the user id alone."""

from __future__ import annotations

import uuid

from shared.delivery.stats import ACTIVE_BUCKETS, user_bucket


def test_a_users_bucket_is_stable_and_in_range() -> None:
    user = uuid.uuid4()
    assert user_bucket(user) == user_bucket(uuid.UUID(str(user)))
    assert 0 <= user_bucket(user) < ACTIVE_BUCKETS


def test_users_spread_over_every_bucket() -> None:
    buckets = {user_bucket(uuid.UUID(int=n * 7919 + 3)) for n in range(ACTIVE_BUCKETS * 8)}
    assert buckets == set(range(ACTIVE_BUCKETS))
