"""Listing a user's lists with their latest imports (``services.api.lists.Lists.overview``)
over the store's twin: every list is answered, with a bounded number of import reads in
flight (a user with thousands of lists must not fan out thousands of queries at once)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import cast

from services.api.capping import Caps
from services.api.list_import import ImportJob
from services.api.lists import LATEST_WINDOW, Lists
from shared.audience.suppressions import SuppressionStore
from shared.infra.background import Background
from shared.infra.config import ListSettings
from shared.infra.gil import CpuLane
from tests.fakes.api import FakeContactLists


class Counting(FakeContactLists):
    """Remembers the most import reads it ever had in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most = 0

    async def get_import(self, list_id: uuid.UUID, import_id: uuid.UUID) -> ImportJob | None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.001)
            return await super().get_import(list_id, import_id)
        finally:
            self.in_flight -= 1


async def test_every_lists_latest_import_is_read_a_window_at_a_time() -> None:
    store, user, now = Counting(), uuid.uuid4(), datetime.now(UTC)
    for i in range(LATEST_WINDOW * 4):
        made = await store.create(user, f"l{i}")
        assert await store.begin_import(
            ImportJob(made.list_id, uuid.uuid1(), user, "done", now, now), None
        )
    lists = Lists(
        store,
        cast(SuppressionStore, None),
        cast(Background, None),
        ListSettings(),
        cast(Caps, None),
        CpuLane(),
    )

    found = await lists.overview(user)

    assert len(found) == LATEST_WINDOW * 4
    assert all(job is not None and job.list_id == x.list_id for x, job in found)
    assert 1 < store.most <= LATEST_WINDOW
