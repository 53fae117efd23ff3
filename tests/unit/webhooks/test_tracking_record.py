"""Recording an open or click (``services.tracking.app.Tracking.record``) within its
budget: given up (logged, never raised) when Cassandra is slow, and cancelled when its request
is, even in the turn Cassandra answers."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from starlette.requests import Request

from services.tracking import app as tracking
from services.tracking.app import Tracking
from shared.core.keyring import KeyRing
from shared.engagement.engagement_tokens import Claim
from tests.fakes.wire import Held
from tests.fakes.world import World

RING = KeyRing((("k1", b"k" * 32),))


def _request() -> Request:
    return Request({"type": "http", "method": "GET", "headers": [], "client": ("192.0.2.7", 1)})


async def test_an_open_cassandra_does_not_record_within_the_budget_is_given_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An open still waiting on Cassandra when the budget runs out is logged as not recorded,
    and the reader is answered (nothing is raised)."""
    monkeypatch.setattr(tracking, "RECORD_BUDGET", 0.05)
    w = World()
    w.db.wire = Held("recipients.chunk_rows")  # never answered
    claim = Claim("open", uuid.uuid4(), uuid.uuid4())

    await Tracking(w.ingest, RING).record(claim, _request(), "opened", None)

    assert f"opened of {claim.batch_id}/{claim.log_id} not recorded" in caplog.text


async def test_a_hit_cancelled_as_cassandra_answers_its_last_query_is_cancelled() -> None:
    """A repeated open whose request is cancelled (a shutdown) in the turn Cassandra answers
    its last query ends cancelled, instead of going on as if nobody had asked it to stop."""
    w = World()
    hits = Tracking(w.ingest, RING)
    claim = Claim("open", uuid.uuid4(), uuid.uuid4())  # a batch unknown here: never cached
    await hits.record(claim, _request(), "opened", None)
    held = Held("batches.owner")  # the repeat's only query
    w.db.wire = held
    recording = asyncio.create_task(hits.record(claim, _request(), "opened", None))
    await held.reached.wait()

    held.release()
    recording.cancel()
    await asyncio.wait({recording}, timeout=5.0)

    assert recording.cancelled()
