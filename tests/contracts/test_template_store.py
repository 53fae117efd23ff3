"""The template store's contract, asserted identically of the in-memory twin
(``tests/fakes/templates.py``) and of the real store on Cassandra: versions numbered in
turn and immutable, listed newest first; publishing moves the live version or starts a canary
beside it, only from what its caller read; a user sees only their own templates."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.infra.db import Database
from shared.templates.templates import Template, TemplateChanged, TemplateGone, TemplateStore
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.templates import FakeTemplates


@pytest.fixture(params=IMPLEMENTATIONS)
def store(request: pytest.FixtureRequest) -> Any:
    if request.param == "fake":
        return FakeTemplates()
    db: Database = request.getfixturevalue("db")
    return TemplateStore(db)


async def made(store: Any, user: uuid.UUID, **sample: Any) -> Template:
    template_id = await store.create(user, "welcome", "Hi {{ n }}", "<p>{{ n }}</p>", None, sample)
    found: Template | None = await store.get(user, template_id)
    assert found is not None
    return found


async def test_a_new_template_has_version_1_and_nothing_live(store: Any) -> None:
    """A new template is version 1, unpublished, its sample kept as JSON."""
    template = await made(store, uuid.uuid4(), n="Ann", tags=["a", "é"], depth={"x": [1, 2.5]})

    first = await store.version(template.template_id, 1)

    assert (template.name, template.live_version, template.canary_version) == (
        "welcome",
        None,
        None,
    )
    assert first is not None
    assert (first.subject, first.html, first.text) == ("Hi {{ n }}", "<p>{{ n }}</p>", None)
    assert first.sample == {"n": "Ann", "tags": ["a", "é"], "depth": {"x": [1, 2.5]}}
    assert first.created_at.tzinfo is not None


async def test_concurrent_versions_take_distinct_numbers_in_turn(store: Any) -> None:
    """Concurrent new versions never share a number; headers match the versions."""
    template = await made(store, uuid.uuid4())

    numbers = await asyncio.gather(
        *(store.add_version(template, f"v{i}", None, "t", {}) for i in range(5))
    )

    assert sorted(numbers) == [2, 3, 4, 5, 6]
    headers = await store.version_headers(template.template_id)
    versions = await store.versions(template.template_id)
    assert [h.version for h in headers] == [v.version for v in versions] == [6, 5, 4, 3, 2, 1]
    assert [(h.subject, h.created_at) for h in headers] == [
        (v.subject, v.created_at) for v in versions
    ]


async def test_a_version_the_template_lacks_is_none(store: Any) -> None:
    """An unknown version, or a template without versions, reads as nothing."""
    template = await made(store, uuid.uuid4())

    assert await store.version(template.template_id, 2) is None
    assert await store.version_headers(uuid.uuid1()) == []


async def test_publishing_moves_the_live_version_and_a_canary_sits_beside_it(store: Any) -> None:
    """Live, then a canary beside it, then a rollback that ends the canary."""
    user = uuid.uuid4()
    template = await made(store, user)
    second = await store.add_version(template, "S2", None, "t2", {})

    live = await store.publish(template, 1)
    canary = await store.publish(live, second, canary_percent=12.5)
    during = await store.get(user, template.template_id)
    back = await store.publish(canary, 1)
    after = await store.get(user, template.template_id)

    assert (live.live_version, live.canary_version) == (1, None)
    assert during is not None
    assert (during.live_version, during.canary_version, during.canary_percent) == (1, 2, 12.5)
    assert during.canary_since is not None and canary.canary_since is not None
    assert abs((during.canary_since - canary.canary_since).total_seconds()) < 0.001
    assert (back.live_version, back.canary_version, back.canary_since) == (1, None, None)
    assert after == back


async def test_a_canary_with_nothing_live_is_published_live(store: Any) -> None:
    """The store leaves refusing it to its caller; what it does is make the version live."""
    user = uuid.uuid4()
    template = await made(store, user)

    published = await store.publish(template, 1, canary_percent=10)

    assert (published.live_version, published.canary_version) == (1, None)
    assert await store.get(user, template.template_id) == published


async def test_a_users_templates_are_theirs_only_in_the_order_they_were_made(store: Any) -> None:
    """Each user lists only their own templates, oldest first."""
    ann, bob = uuid.uuid4(), uuid.uuid4()
    first = await made(store, ann)
    second = await made(store, ann)

    assert [t.template_id for t in await store.templates(ann)] == [
        first.template_id,
        second.template_id,
    ]
    assert await store.templates(bob) == []
    assert await store.get(bob, first.template_id) is None


async def test_a_rollout_is_concluded_only_if_it_is_still_the_one_running(store: Any) -> None:
    """The canary judge's verdict lands on its own rollout, never on one published since."""
    template = await made(store, uuid.uuid4())
    await store.add_version(template, "v2", None, "t", {})
    await store.add_version(template, "v3", None, "t", {})
    await store.publish(template, 1)
    live = await store.get(template.user_id, template.template_id)
    first = await store.publish(live, 2, canary_percent=10)
    stale = await store.get(template.user_id, template.template_id)
    assert stale is not None and stale.canary_since is not None
    await asyncio.sleep(0.01)
    await store.publish(stale, 3, canary_percent=20)  # the user starts another rollout

    too_late = await store.conclude(stale, stale.canary_since, 2, '{"v": 2}')
    current = await store.get(template.user_id, template.template_id)
    assert current is not None and current.canary_since is not None
    concluded = await store.conclude(current, current.canary_since, 3, '{"v": 3}')
    after = await store.get(template.user_id, template.template_id)

    assert first.canary_version == 2
    assert not too_late
    assert concluded
    assert after is not None
    assert (after.live_version, after.canary_version, after.canary_since) == (3, None, None)
    assert after.verdict == '{"v": 3}'


async def test_a_publish_from_a_stale_read_changes_nothing(store: Any) -> None:
    """Two publishes from the same read: the second finds the template changed and raises,
    writing nothing (it never silently puts back the live version it read)."""
    template = await made(store, uuid.uuid4())
    await store.add_version(template, "v2", None, "t", {})
    await store.add_version(template, "v3", None, "t", {})
    read = await store.publish(template, 1)
    first = await store.publish(read, 2)

    with pytest.raises(TemplateChanged):
        await store.publish(read, 3)

    assert await store.get(template.user_id, template.template_id) == first


async def test_a_publish_racing_a_promotion_does_not_undo_it(store: Any) -> None:
    """The judge promotes the canary while the user publishes from an earlier read: the
    publish is refused and the promoted version stays live."""
    template = await made(store, uuid.uuid4())
    await store.add_version(template, "v2", None, "t", {})
    await store.add_version(template, "v3", None, "t", {})
    live = await store.publish(template, 1)
    canary = await store.publish(live, 2, canary_percent=10)
    assert canary.canary_since is not None
    assert await store.conclude(canary, canary.canary_since, 2, "{}")

    with pytest.raises(TemplateChanged):
        await store.publish(canary, 3, canary_percent=20)

    after = await store.get(template.user_id, template.template_id)
    assert after is not None
    assert (after.live_version, after.canary_version) == (2, None)


async def test_a_template_is_made_with_the_id_it_is_given(store: Any) -> None:
    """The id its place under the cap was claimed for."""
    user, template_id = uuid.uuid4(), uuid.uuid1()

    made = await store.create(user, "w", "S", None, "t", {}, template_id=template_id)

    assert made == template_id
    assert await store.get(user, template_id) is not None


async def test_a_number_taken_and_its_version_written_apart_are_as_add_version(
    store: Any,
) -> None:
    """A number taken but never written (a refused place) is a gap: the next is after it."""
    template = await made(store, uuid.uuid4())

    gap = await store.take_number(template)
    number = await store.take_number(template)
    await store.write_version(template.template_id, number, "S3", None, "t", {}, datetime.now(UTC))

    assert (gap, number) == (2, 3)
    assert [h.version for h in await store.version_headers(template.template_id)] == [3, 1]


async def test_a_deleted_template_takes_its_versions_with_it(store: Any) -> None:
    """Another template is untouched; deleting again answers False; no number can be taken
    of it any more."""
    user = uuid.uuid4()
    gone, kept = await made(store, user), await made(store, user)
    await store.add_version(gone, "S2", None, "t", {})

    assert await store.delete(gone)
    assert not await store.delete(gone)
    assert await store.get(user, gone.template_id) is None
    assert await store.version_headers(gone.template_id) == []
    assert [t.template_id for t in await store.templates(user)] == [kept.template_id]
    with pytest.raises(TemplateGone):
        await store.take_number(gone)


async def test_a_publish_racing_a_deletion_brings_no_template_back(store: Any) -> None:
    """The publish read an unpublished template (its conditions hold of a missing row)."""
    user = uuid.uuid4()
    template = await made(store, user)
    await store.delete(template)

    with contextlib.suppress(TemplateChanged):
        await store.publish(template, 1)

    assert await store.get(user, template.template_id) is None
    assert await store.templates(user) == []


async def test_a_deleted_version_is_gone_and_the_others_stay(store: Any) -> None:
    template = await made(store, uuid.uuid4())
    await store.add_version(template, "S2", None, "t", {})

    await store.delete_version(template.template_id, 1)
    await store.delete_version(template.template_id, 1)

    assert await store.version(template.template_id, 1) is None
    assert [h.version for h in await store.version_headers(template.template_id)] == [2]


async def test_a_template_deleted_at_once_after_its_creation_stays_gone(store: Any) -> None:
    """A deletion right after the creation wins, every time: both writes of the row are
    ordered by the store, not by two clocks (a plain insert stamped in microseconds by the
    client outlived a transaction stamped in milliseconds by the server, 46 of 300 times)."""
    user = uuid.uuid4()
    for _ in range(40):
        template_id = await store.create(user, "t", "s", None, "x", {})
        made = Template(user, template_id, "t", None, None, None, None, datetime.now(UTC))
        assert await store.delete(made)
        assert await store.get(user, template_id) is None
