"""Batches larger than Cassandra takes in one batch of statements, accepted over the twins
(``tests/unit/sending_desk``), whose Cassandra refuses what the real one refuses for its size:
stored whole, content first and header last; refused with a 413 naming the limit before
anything is charged or written when the store cannot hold them; and a process that dies
between the content's statements leaves no batch, for its retry to store whole, once."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from shared.delivery.batchstore import STATEMENT_BYTES, most_stored
from shared.delivery.recipients import decode_recipients
from shared.infra.config import CassandraSettings
from shared.infra.db import slices
from shared.infra.http import ApiError
from tests.fakes.wire import LOOPBACK, Kind, Trip
from tests.unit.sending_desk import Desk, new_desk

#: A substitution value of this many characters makes a recipient's substitutions about
#: 10 kB as JSON, the API's most.
VALUE = 9_900


class Killed(BaseException):
    """The process died: nothing in the services handles it."""


class _Dies:
    def landed(self) -> None:
        raise Killed("killed after the write landed")


class _Lives:
    def landed(self) -> None:
        return None


@dataclass
class KillAfter:
    """A wire that kills the process once the ``nth`` round trip ``op`` has landed."""

    op: str
    nth: int
    seen: int = 0

    async def trip(self, op: str, kind: Kind) -> Trip:
        await LOOPBACK.trip(op, kind)
        if op != self.op:
            return _Lives()
        self.seen += 1
        return _Dies() if self.seen == self.nth else _Lives()


def personal(recipients: int, value: int = VALUE, **more: Any) -> dict[str, Any]:
    """``recipients`` recipients with ``value`` characters of substitutions each."""
    return {
        "from": "shop@example.com",
        "to": [
            {"email": f"r{i}@example.com", "substitutions": {"-v-": f"{i:05d}" + "x" * value}}
            for i in range(recipients)
        ],
        "subject": "Yours",
        "text": "Here: -v-",
        **more,
    }


def stored(desk: Desk, batch_id: str) -> dict[str, dict[str, str]]:
    """Every recipient in the stored chunks' lists, with their substitutions."""
    rows = desk.db.stored(uuid.UUID(batch_id))
    return {
        e: subs
        for r in rows
        if r["recipients"]
        for e, _, subs in decode_recipients(r["recipients"])
    }


@pytest.fixture
async def desk() -> AsyncIterator[Desk]:
    made = await new_desk(lease=0.0)
    made.quota.daily_limit = 100_000
    yield made
    await made.sending.background.drain()


async def test_a_batch_many_times_the_batch_threshold_is_accepted_and_stored_whole(
    desk: Desk,
) -> None:
    """300 recipients with 10 kB of substitutions each and 800 kB of html (some 4 MB, six
    times Cassandra's batch size threshold): accepted, stored whole, published once."""
    body = personal(300, html="<p>" + "y" * 800_000 + "</p>")

    answer = await desk.accept(body, "big")

    assert answer["accepted"] == 300
    header = await desk.batches.header(uuid.UUID(answer["batch_id"]))
    assert header is not None and header.status == "accepted"
    assert header.message.html == body["html"]
    everyone = stored(desk, answer["batch_id"])
    assert len(everyone) == 300
    assert everyone["r299@example.com"]["-v-"] == "00299" + "x" * VALUE
    assert desk.published() == [answer["batch_id"]]


@pytest.mark.parametrize("key", ["k", None], ids=["keyed", "keyless"])
async def test_a_batch_the_store_cannot_hold_is_a_413_before_anything_is_charged(
    key: str | None,
) -> None:
    """Told that a batch may store 1 MiB less its headroom, the API refuses 1.5 MB of
    substitutions with 413 ``batch_too_large`` naming that limit: no quota charged, nothing
    written, and the key free for the corrected request."""
    limit = 1024 * 1024
    desk = await new_desk(lease=30.0, cassandra=CassandraSettings(max_mutation_bytes=limit))
    desk.quota.daily_limit = 100_000

    with pytest.raises(ApiError) as refused:
        await desk.accept(personal(150), key)
    fixed = await desk.accept(personal(50), key)

    assert (refused.value.status, refused.value.code) == (413, "batch_too_large")
    assert f"at most {most_stored(limit):,} bytes" in refused.value.message
    assert refused.value.limit == ("batch_bytes", most_stored(limit))
    assert list(desk.db.headers) == [uuid.UUID(fixed["batch_id"])]
    assert await desk.used() == 50
    await desk.sending.background.drain()


@pytest.mark.parametrize("key", ["k", None], ids=["keyed", "keyless"])
async def test_a_write_cassandra_refuses_for_its_size_is_a_413_and_gives_the_quota_back(
    desk: Desk, key: str | None
) -> None:
    """The cluster's max_mutation_size is below what the API was told (512 KiB): Cassandra
    refuses the content, and the answer is still a 413, with nothing stored or published and
    the quota given back, never a 500."""
    desk.db.max_mutation_bytes = 512 * 1024

    with pytest.raises(ApiError) as refused:
        await desk.accept(personal(100), key)

    assert (refused.value.status, refused.value.code) == (413, "batch_too_large")
    assert all(h.get("created_at") is None for h in desk.db.headers.values())
    assert await desk.used() == 0
    assert await desk.relay(after=600) == 0
    assert desk.published() == []


async def test_a_process_killed_between_content_statements_leaves_no_batch_for_its_retry(
    desk: Desk,
) -> None:
    """Killed once the first chunk's list landed and before the second's (and the header):
    no batch exists, so the relay sends nothing; the client's retry with its key stores the
    same batch id whole and it is sent once."""
    body = personal(1_200, value=300)
    desk.db.wire = KillAfter("batches.content", 2)
    with pytest.raises(Killed):
        await desk.accept(body, "killed")
    desk.db.wire = LOOPBACK
    assert all(h.get("created_at") is None for h in desk.db.headers.values())
    assert await desk.relay(after=600) == 0
    assert desk.published() == []

    answer = await desk.accept(body, "killed")

    assert [answer["batch_id"]] == [str(b) for b in desk.db.headers]
    header = await desk.batches.header(uuid.UUID(answer["batch_id"]))
    assert header is not None and (header.recipient_count, header.chunk_count) == (1_200, 2)
    assert len(stored(desk, answer["batch_id"])) == 1_200
    await desk.sending.background.drain()
    assert await desk.relay(after=600) == 0
    assert desk.published() == [answer["batch_id"]]


async def test_a_keyless_request_killed_between_content_and_header_is_never_sent(
    desk: Desk,
) -> None:
    """Without a key the client never heard back; no batch exists, so the relay, past the
    time its request could have committed it, finds nothing to send or cancel."""
    desk.db.wire = KillAfter("batches.content", 2)

    with pytest.raises(Killed):
        await desk.accept(personal(1_200, value=300), None)

    desk.db.wire = LOOPBACK
    assert await desk.relay(after=600) == 0
    assert desk.outbox.pending() == set()
    assert desk.published() == []


@pytest.mark.parametrize(
    ("sizes", "count", "expected"),
    [
        ([], None, []),
        ([10, 20, 30], None, [range(3)]),
        ([10, STATEMENT_BYTES, 10, 10], None, [range(1), range(1, 2), range(2, 4)]),
        ([STATEMENT_BYTES * 40], None, [range(1)]),
        ([STATEMENT_BYTES // 2 + 1] * 3, None, [range(1), range(1, 2), range(2, 3)]),
        ([1] * 5, 2, [range(2), range(2, 4), range(4, 5)]),
    ],
)
def test_writes_are_cut_in_order_within_a_byte_budget_and_a_count(
    sizes: list[int], count: int | None, expected: list[range]
) -> None:
    """Runs of at most STATEMENT_BYTES (a larger write alone) and of at most ``count``
    writes, in the order given."""
    assert slices(sizes, STATEMENT_BYTES, count=count) == expected
