"""The template store on real Cassandra: versions are numbered without gaps or doubles
under concurrency, immutable, and publishing moves the live version or starts a canary."""

from __future__ import annotations

import asyncio
import uuid

from shared.infra.db import Database
from shared.templates.templates import TemplateStore


async def test_concurrent_new_versions_get_distinct_numbers(db: Database) -> None:
    store = TemplateStore(db)
    user = uuid.uuid4()
    template_id = await store.create(user, "welcome", "Hi {{ name }}", "<p>Hi</p>", None, {})
    template = await store.get(user, template_id)
    assert template is not None

    numbers = await asyncio.gather(
        *(store.add_version(template, f"v{i}", None, "t", {"i": i}) for i in range(8))
    )

    assert sorted(numbers) == list(range(2, 10))
    versions = await store.versions(template_id)
    assert [v.version for v in versions] == list(range(9, 0, -1))
    assert {v.subject for v in versions[:-1]} == {f"v{i}" for i in range(8)}


async def test_publishing_moves_the_live_version_and_a_canary_sits_beside_it(
    db: Database,
) -> None:
    store = TemplateStore(db)
    user = uuid.uuid4()
    template_id = await store.create(user, "news", "S", None, "t", {"name": "Ann"})
    template = await store.get(user, template_id)
    assert template is not None and template.live_version is None
    second = await store.add_version(template, "S2", None, "t2", {})

    live = await store.publish(template, 1)
    canary = await store.publish(live, second, canary_percent=10)
    rolled_back = await store.publish(canary, 1)

    assert (live.live_version, live.canary_version) == (1, None)
    assert (canary.live_version, canary.canary_version, canary.canary_percent) == (1, 2, 10)
    stored = await store.get(user, template_id)
    assert stored is not None
    assert (
        (stored.live_version, stored.canary_version)
        == (1, None)
        == (
            rolled_back.live_version,
            rolled_back.canary_version,
        )
    )
    first = await store.version(template_id, 1)
    assert first is not None and first.sample == {"name": "Ann"}


async def test_a_users_templates_are_theirs_only(db: Database) -> None:
    store = TemplateStore(db)
    ann, bob = uuid.uuid4(), uuid.uuid4()
    made = await store.create(ann, "a", "S", None, "t", {})

    assert [t.template_id for t in await store.templates(ann)] == [made]
    assert await store.templates(bob) == []
    assert await store.get(bob, made) is None
