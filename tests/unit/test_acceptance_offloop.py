"""A large batch is built for storing off the API's event loop (turns counted, never time)."""

from __future__ import annotations

import uuid

import orjson
import pytest

from services.api.sending import Extra
from shared.delivery.validation import parse_batch_request
from tests.unit.loop_turns import MANY, turns_during
from tests.unit.sending_desk import body_of, new_desk


@pytest.mark.offloop
async def test_a_large_batch_and_its_answer_are_built_off_the_event_loop() -> None:
    """The loop goes on with other work while 5,000 recipients and 2,000 rejected entries
    (a client sets both) become the batch to store and its 202, which holds them all."""
    desk = await new_desk(lease=30.0)
    to = [f"r{i}@example.org" for i in range(5_000)] + [f"bad {i}" for i in range(2_000)]
    parsed = parse_batch_request(body_of(*to), max_recipients=10_000)

    batch, turns = await turns_during(
        desk.sending.built(desk.user, uuid.uuid1(), parsed, Extra(), pending=False)
    )

    assert len(batch.recipients) == 5_000
    assert len(orjson.loads(batch.response)["rejected"]) == 2_000
    assert turns >= MANY
