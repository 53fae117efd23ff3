"""The tracking endpoint's links of a batch (``services.tracking.app``): read from the
stored message, away from the event loop."""

from __future__ import annotations

import dataclasses

import pytest

from services.tracking.app import Tracking
from shared.core.keyring import KeyRing
from shared.core.models import Engagement
from tests.fakes.world import World, new_batch
from tests.unit.loop_turns import MANY, turns_during

RING = KeyRing((("k1", b"k" * 32),))


@pytest.mark.offloop
async def test_a_large_messages_links_are_found_off_the_event_loop() -> None:
    """The event loop goes on with other work while a megabyte of tags is read for links,
    and the links found are the message's."""
    w = World()
    batch = new_batch("a@example.org")
    html = '<a href="https://shop.example/">x</a>' + "<a>" * 350_000
    message = batch.message.model_copy(
        update={"html": html, "bulk": True, "engagement": Engagement(clicks=True)}
    )
    batch = dataclasses.replace(batch, message=message)
    await w.batches.write(batch)

    links, turns = await turns_during(Tracking(w.ingest, RING).links(batch.batch_id, 0))

    assert links == ["https://shop.example/"]
    assert turns >= MANY
