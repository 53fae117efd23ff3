"""The consumers' cache of batch headers (``services.consumers.followup``): bounded by count
and by the bytes of content (bodies and files) its headers hold."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from services.consumers import followup
from services.consumers.followup import FollowUps, content_bytes
from shared.core.models import Message
from shared.delivery.batchstore import BatchHeader


class _Headers:
    """Batch headers by id, counting the reads that reach the store."""

    def __init__(self, files: int) -> None:
        self.files = files
        self.reads = 0

    async def header(self, batch_id: uuid.UUID) -> BatchHeader:
        self.reads += 1
        file = {"filename": "a", "content_type": "a/b", "content": "QUJD" * self.files}
        message = Message.model_validate(
            {"from": {"email": "a@x.org"}, "subject": "s", "text": "t", "attachments": [file]}
        )
        return BatchHeader(
            batch_id, uuid.UUID(int=0), datetime.now(UTC), message, 1, 1, 1, "", None
        )


def _follow(store: _Headers) -> FollowUps:
    unused = cast(Any, None)
    return FollowUps(
        batches=cast(Any, store),
        recipients=unused,
        broker=unused,
        metrics=unused,
        fault_points=unused,
        user_hooks=None,
    )


async def test_headers_holding_more_content_than_the_bound_are_not_all_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With room for two headers' files, a third read evicts the oldest; the newer are kept."""
    store = _Headers(files=1000)
    each = content_bytes(await store.header(uuid.uuid4()))
    monkeypatch.setattr(followup, "HEADER_CACHE_BYTES", 2 * each)
    follow = _follow(store)
    first, second, third = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for batch_id in (first, second, third):
        await follow.header(batch_id)
    store.reads = 0

    await follow.header(third)
    await follow.header(second)
    assert store.reads == 0
    await follow.header(first)
    assert store.reads == 1


async def test_a_header_larger_than_the_bound_is_still_kept_while_newest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(followup, "HEADER_CACHE_BYTES", 10)
    store = _Headers(files=1000)
    follow = _follow(store)
    batch_id = uuid.uuid4()
    await follow.header(batch_id)
    await follow.header(batch_id)
    assert store.reads == 1
