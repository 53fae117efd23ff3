"""A canary chunk's copy is chosen when it is sent (``services.consumers.dispatch`` with
``services.consumers.template_rollouts``), over the in-memory twins: while the canary is the
template's canary its chunks carry it; once it is rolled back, those not sent yet carry the
live copy; a chunk whose first call may have reached the provider keeps that call's copy;
each attempt records the version it was sent with."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest

from services.consumers import protocol
from services.consumers.template_rollouts import LiveRollouts
from shared.core.errors import DependencyUnavailable
from shared.core.models import TemplateCopy, TemplateUse
from shared.delivery.attempts import chunk_line
from shared.delivery.batchstore import NewBatch
from shared.templates.templates import Template
from tests.fakes.templates import FakeTemplates
from tests.fakes.world import World, answered, new_batch

EMAILS = [f"r{i}@example.org" for i in range(4)]


async def _template(templates: FakeTemplates, user_id: uuid.UUID) -> Template:
    """A template with version 1 live and 2 in canary."""
    tid = await templates.create(user_id, "t", "live", None, "live", {})
    template = await templates.get(user_id, tid)
    assert template is not None
    await templates.add_version(template, "canary", None, "canary", {})
    template = await templates.publish(template, 1)
    return await templates.publish(template, 2, canary_percent=50.0)


def _batch(template: Template) -> NewBatch:
    """Four chunks of one recipient: the first two carry the canary."""
    batch = new_batch(*EMAILS, chunk_size=1, user_id=template.user_id)
    use = TemplateUse(
        id=template.template_id,
        version=1,
        canary=TemplateCopy(version=2, subject="canary", text="canary"),
        canary_chunks=2,
        canary_since=template.canary_since,
    )
    message = batch.message.model_copy(update={"subject": "live", "text": "live", "template": use})
    return replace(batch, message=message)


async def _setting() -> tuple[World, FakeTemplates, Template]:
    templates = FakeTemplates()
    w = World(rollouts=LiveRollouts(templates, keep_for=0.0))
    return w, templates, await _template(templates, uuid.uuid4())


def _subjects(w: World, code: str = "sg") -> dict[str, str]:
    return {r.email: c.message.subject for c in w.providers[code].sent for r in c.recipients}


async def _recorded(w: World, batch: NewBatch) -> list[list[int | None]]:
    return [
        [a.template_version for a in await w.attempts.line(batch.batch_id, chunk_line(c))]
        for c in range(4)
    ]


async def test_canary_chunks_carry_the_canary_while_it_runs() -> None:
    w, _, template = await _setting()
    batch = await w.accept_batch(_batch(template))
    await w.settle()

    assert _subjects(w) == dict(zip(EMAILS, ["canary", "canary", "live", "live"], strict=True))
    assert await _recorded(w, batch) == [[2], [2], [1], [1]]


async def test_canary_chunks_not_sent_when_it_is_rolled_back_carry_the_live_copy() -> None:
    w, templates, template = await _setting()
    batch = await w.accept_batch(_batch(template))
    await w.step()  # the splitter
    await w.step()  # chunk 0, with the canary
    assert template.canary_since is not None
    assert await templates.conclude(template, template.canary_since, 1, "rolled back")
    await w.settle()

    assert _subjects(w) == dict(zip(EMAILS, ["canary", "live", "live", "live"], strict=True))
    assert await _recorded(w, batch) == [[2], [1], [1], [1]]


async def test_a_chunk_whose_call_may_have_reached_the_provider_keeps_its_copy() -> None:
    """Chunk 0's call ends unknown (a 5xx); the canary is rolled back meanwhile; the query
    API finds nothing, so the chunk goes to the next provider, with the same copy."""
    w, templates, template = await _setting()
    batch = await w.accept_batch(_batch(template))
    w.providers["sg"].answers.append(answered("sg", 503))
    assert template.canary_since is not None
    since = template.canary_since

    async def roll_back(point: str, job: protocol.Job) -> None:
        if job.chunk == 0:
            await templates.conclude(template, since, 1, "rolled back")

    w.fault_points["answered"] = roll_back
    await w.settle()

    assert _subjects(w, "mg") == {EMAILS[0]: "canary"}
    assert _subjects(w)[EMAILS[1]] == "live"
    assert (await _recorded(w, batch))[:2] == [[2, 2], [1]]


@pytest.mark.parametrize(
    ("rolled_back", "subject", "version"),
    [("before the claim", "live", 1), ("after the claim", "canary", 2)],
)
async def test_a_call_after_its_claim_seemed_to_fail_goes_with_the_version_claimed(
    rolled_back: str, subject: str, version: int
) -> None:
    """The write that claims chunk 0 applies but reports an outage; the delivery's retry
    finds the attempt calling as its own and calls with the version that write recorded,
    whatever the template did since."""
    w, templates, template = await _setting()
    batch = await w.accept_batch(_batch(template))
    assert template.canary_since is not None
    since = template.canary_since
    if rolled_back == "before the claim":
        await templates.conclude(template, since, 1, "rolled back")
    failed: list[int] = []

    async def outage(point: str, job: protocol.Job) -> None:
        if job.chunk == 0 and not failed:
            failed.append(job.chunk)
            await templates.conclude(template, since, 1, "rolled back")
            raise DependencyUnavailable("cassandra", "timed out")

    w.fault_points["calling"] = outage
    await w.settle()

    assert failed == [0]
    assert _subjects(w)[EMAILS[0]] == subject
    assert (await _recorded(w, batch))[0] == [version]


async def test_the_template_is_read_once_for_chunks_sent_together() -> None:
    templates = FakeTemplates()
    template = await _template(templates, uuid.uuid4())
    reads = 0
    get = templates.get

    async def counted(user_id: uuid.UUID, template_id: uuid.UUID) -> Template | None:
        nonlocal reads
        reads += 1
        await asyncio.sleep(0)
        return await get(user_id, template_id)

    templates.get = counted  # type: ignore[method-assign]
    rollouts = LiveRollouts(templates, keep_for=60.0)
    found = await asyncio.gather(
        *(rollouts.rollout(template.user_id, template.template_id) for _ in range(5))
    )

    assert reads == 1
    assert {(r.live, r.canary) if r else None for r in found} == {(1, 2)}


async def test_a_template_forgotten_is_read_again() -> None:
    templates = FakeTemplates()
    template = await _template(templates, uuid.uuid4())
    rollouts = LiveRollouts(templates, keep_for=60.0)
    assert (await rollouts.rollout(template.user_id, template.template_id)) is not None
    assert template.canary_since is not None
    await templates.conclude(template, template.canary_since, 1, "rolled back")

    kept = await rollouts.rollout(template.user_id, template.template_id)
    rollouts.forget(template.template_id)
    read = await rollouts.rollout(template.user_id, template.template_id)

    assert kept is not None and kept.canary == 2
    assert read is not None and (read.live, read.canary) == (1, None)


async def test_a_read_that_fails_is_not_kept() -> None:
    templates = FakeTemplates()
    template = await _template(templates, uuid.uuid4())
    get = templates.get
    calls = 0

    async def failing_once(user_id: uuid.UUID, template_id: uuid.UUID) -> Template | None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        if calls == 1:
            raise DependencyUnavailable("cassandra", "timed out")
        return await get(user_id, template_id)

    templates.get = failing_once  # type: ignore[method-assign]
    rollouts = LiveRollouts(templates, keep_for=60.0)
    first = await asyncio.gather(
        *(rollouts.rollout(template.user_id, template.template_id) for _ in range(2)),
        return_exceptions=True,
    )
    read = await rollouts.rollout(template.user_id, template.template_id)

    assert [type(r) for r in first] == [DependencyUnavailable, DependencyUnavailable]
    assert read is not None and read.canary == 2
    assert calls == 2
