"""The consumers' work budget (``services.consumers.calls``): a chunk's provider call is
built and sent only with room for its recipients' bytes, which it gives back however the call
ends; a chunk that waited a whole call's length goes anyway."""

from __future__ import annotations

import asyncio
from typing import Any

from services.consumers.calls import weigh, weigh_files
from shared.core.models import Attachment, Message
from shared.infra.byte_budget import ByteBudget
from tests.fakes.world import World, refused

BUDGET = 1024 * 1024


async def _until_waiting(budget: ByteBudget) -> None:
    while not budget.waiting:  # noqa: ASYNC110 - a waiter arriving sets no event
        await asyncio.sleep(0)


def test_a_chunk_weighs_its_recipients_addresses_names_and_substitutions() -> None:
    """Every address, name, substitution key and value counts by its length."""
    rows: list[dict[str, Any]] = [
        {"email": "ann@example.org", "name": "Ann", "substitutions": {"-k-": "v" * 10}},
        {"email": "bob@example.org", "name": None, "substitutions": None},
    ]
    assert weigh(rows) == 15 + 3 + 3 + 10 + 15


def test_a_chunks_files_weigh_twice_their_base64_text() -> None:
    """The payload holds a message's files as base64, and Mailgun's form a decoded copy."""
    file = Attachment(filename="a.bin", content_type="application/octet-stream", content="QUJD")
    message = Message.model_validate(
        {"from": {"email": "a@x.org"}, "subject": "s", "attachments": [file, file]}
    )
    assert weigh_files(message) == 2 * (4 + 4)
    assert weigh_files(message.model_copy(update={"attachments": ()})) == 0


async def test_a_chunk_waits_for_room_in_the_work_budget_then_is_sent() -> None:
    """With the budget all taken, a chunk is not sent; once room is given back it is."""
    budget = ByteBudget(BUDGET)
    w = World(work=budget)
    held = await budget.take(BUDGET, wait=0)
    await w.accept("ann@example.org")
    settling = asyncio.create_task(w.settle())

    await asyncio.wait_for(_until_waiting(budget), 5)
    assert w.providers["sg"].sent == []

    budget.give(held)
    await asyncio.wait_for(settling, 5)
    assert w.providers["sg"].emails() == ["ann@example.org"]
    assert budget.free == BUDGET


async def test_the_work_budget_is_given_back_after_a_refused_call() -> None:
    """A call the provider refuses gives back what its chunk took, as an accepted one does."""
    budget = ByteBudget(BUDGET)
    w = World(work=budget)
    w.providers["sg"].answers.append(refused("sg"))
    await w.accept("ann@example.org", "bob@example.org")

    await asyncio.wait_for(w.settle(), 5)

    assert sorted(w.providers["mg"].emails()) == ["ann@example.org", "bob@example.org"]
    assert budget.free == BUDGET


async def test_a_chunk_that_waited_a_whole_call_goes_over_budget() -> None:
    """Past a call's length of waiting, the chunk is sent anyway (the attempt it holds as
    calling must not outlive its lease waiting for room), and takes nothing."""
    budget = ByteBudget(BUDGET)
    w = World(timeout=0.01, work=budget)
    await budget.take(BUDGET, wait=0)
    await w.accept("ann@example.org")

    await asyncio.wait_for(w.settle(), 5)

    assert w.providers["sg"].emails() == ["ann@example.org"]
    assert budget.free == 0
