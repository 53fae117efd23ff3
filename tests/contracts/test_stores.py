"""The store contract: what the consumers and the webhook service rely on from each store,
asserted identically of the in-memory twin and of the real store on Cassandra."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from shared.audience.suppressions import SEND_LOOKUP
from shared.core.batch_ids import accepted_at
from shared.core.errors import DependencyUnavailable, TooLargeToStore
from shared.core.models import Recipient
from shared.core.webhook_events import ProviderEvent
from shared.delivery.batchstore import NewBatch, content_of, month_of
from shared.delivery.outbox import Outbox
from shared.delivery.precedence import STATE_CELLS, provider_stamp, stamp_column, visible
from shared.delivery.recipients import (
    CHUNK_ROW,
    RecipientStore,
    Report,
    Selection,
    log_id_for,
    merged_chunk,
)
from shared.delivery.stats import StatsStore, batch_day
from shared.delivery.validation import RecipientInput
from shared.infra.db import Database
from tests.conftest import unique
from tests.contracts.conftest import Stores
from tests.fakes.cassandra import OPERATION_KINDS, FakeCassandra
from tests.fakes.delivery import FakeOutbox
from tests.fakes.world import new_batch

A, B, C, D = "a@example.org", "b@example.org", "c@example.org", "d@example.org"


def _batch(*emails: str, chunk_size: int = 2, batch_id: uuid.UUID | None = None) -> NewBatch:
    return new_batch(*emails, chunk_size=chunk_size, batch_id=batch_id)


async def _stored(stores: Stores, *emails: str, chunk_size: int = 2) -> NewBatch:
    batch = _batch(*emails, chunk_size=chunk_size)
    await stores.batches.write(batch)
    await stores.batches.index(batch)
    return batch


def _at(batch: NewBatch, seconds: float) -> datetime:
    """A moment ``seconds`` after the batch was accepted."""
    return accepted_at(batch.batch_id) + timedelta(seconds=seconds)


def _log(batch: NewBatch, email: str) -> uuid.UUID:
    return log_id_for(batch.batch_id, email)


def _state(row: dict[str, Any]) -> dict[str, Any]:
    """A recipient's state cells and their write timestamps, as comparable values."""
    out: dict[str, Any] = {}
    for cell in STATE_CELLS:
        value = row[cell]
        if isinstance(value, datetime):
            value = value.replace(tzinfo=None)
        out[cell] = dict(value) if cell in ("providers", "message_ids") and value else value
        out[stamp_column(cell)] = row[stamp_column(cell)]
    return out


def _event(batch: NewBatch, kind: str = "delivered", **fields: object) -> ProviderEvent:
    values: dict[str, object] = {
        "provider": "sg",
        "event_id": uuid.uuid4().hex,
        "kind": kind,
        "raw_event": kind,
        "email": A,
        "occurred_at": _at(batch, 5),
        "batch_id": batch.batch_id,
        "chunk": 0,
        "log_id": _log(batch, A),
        "attempt": "c.0",
        "message_id": None,
        "reason": None,
        "provider_side": False,
        "suppress": False,
    }
    values.update(fields)
    return ProviderEvent(**values)  # type: ignore[arg-type]


async def _reported(
    stores: Stores, batch: NewBatch, email: str = A, *, chunk: int = 0, **fields: Any
) -> None:
    """A provider's ``delivered`` for ``email`` (``fields`` change what it reports)."""
    values: dict[str, Any] = {
        "provider": "sg",
        "provider_result": "delivered",
        "message_id": None,
        "stage_rank": 3,
        "rank": 3,
        "when": _at(batch, 2),
        "event": "delivered",
        "state": "success",
        "reason": None,
        "evidence": "c.0",
    }
    values.update(fields)
    await stores.recipients.reported(
        Report(batch.batch_id, batch.user_id, chunk, _log(batch, email), **values)
    )


async def _whole(stores: Stores, batch: NewBatch, chunk: int) -> Selection:
    """Every recipient of a chunk, as a write selects them."""
    everyone = await stores.recipients.chunk_rows(batch.batch_id, chunk)
    return Selection.of(chunk, everyone, everyone)


async def _counts(stores: Stores, batch: NewBatch) -> dict[str, int]:
    counts: dict[str, int] = await stores.stats.day(batch.user_id, batch_day(batch.batch_id))
    return counts


# -- batches -------------------------------------------------------------------------------


async def test_a_written_batch_has_a_header_and_an_owner(stores: Stores) -> None:
    batch = await _stored(stores, A, B, C)
    header = await stores.batches.header(batch.batch_id)
    assert header is not None
    assert (header.user_id, header.recipient_count, header.chunk_size, header.chunk_count) == (
        batch.user_id,
        3,
        2,
        2,
    )
    assert (header.status, header.reason, header.response) == ("accepted", None, None)
    assert header.message == batch.message
    assert abs(header.created_at - accepted_at(batch.batch_id)) < timedelta(milliseconds=1)
    assert await stores.batches.owner(batch.batch_id) == batch.user_id
    assert await stores.batches.status(batch.batch_id) == "accepted"


async def test_an_unknown_batch_has_no_header_owner_or_recipient(stores: Stores) -> None:
    unknown = uuid.uuid1()
    assert await stores.batches.header(unknown) is None
    assert await stores.batches.owner(unknown) is None
    assert await stores.batches.status(unknown) is None
    assert await stores.recipients.locate(unknown, A) is None
    assert await stores.recipients.batch_rows(unknown) == []
    assert await stores.recipients.chunk_rows(unknown, 0) == []
    assert await stores.recipients.one(unknown, 0, log_id_for(unknown, A)) is None


# -- batches larger than one batch of statements over several partitions may be -----------

#: A substitution value of this many characters makes a recipient's substitutions about
#: 10 kB, the API's most.
VALUE = 9_900


def _large(recipients: int, *, html: int, chunk_size: int = 50) -> NewBatch:
    """A batch of ``recipients`` recipients with 10 kB of substitutions each and ``html``
    characters of html."""
    batch = _batch(*(f"r{i}@example.org" for i in range(recipients)), chunk_size=chunk_size)
    return replace(
        batch,
        message=batch.message.model_copy(update={"html": "<p>" + "y" * html + "</p>"}),
        recipients=[
            Recipient(
                log_id=log_id_for(batch.batch_id, r.email),
                email=r.email,
                substitutions={"-v-": f"{i:05d}" + "x" * (VALUE - 5)},
            )
            for i, r in enumerate(batch.recipients)
        ],
    )


def _outbox(stores: Stores) -> Any:
    if isinstance(stores.db, FakeCassandra):
        return FakeOutbox(stores.db, unique("ns"))
    return Outbox(stores.db, unique("ns"))


async def test_a_batch_of_megabytes_is_stored_whole_with_its_outbox_row(stores: Stores) -> None:
    """800 kB of html and 1 MB of substitutions, with its outbox row (another partition):
    past Cassandra's batch size threshold as one request, it is stored whole all the same:
    its message, every recipient with their substitutions, the row the relay reads."""
    batch = _large(100, html=800_000)
    outbox = _outbox(stores)

    await stores.batches.write(batch, also=[await outbox.statement(batch.batch_id, batch.user_id)])

    header = await stores.batches.header(batch.batch_id)
    assert header is not None
    assert (header.message, header.recipient_count, header.chunk_count) == (batch.message, 100, 2)
    rows = await stores.recipients.batch_rows(batch.batch_id)
    assert [(r["email"], r["substitutions"]) for r in rows] == [
        (r.email, r.substitutions) for r in batch.recipients
    ]
    assert batch.batch_id in await outbox.unpublished(*Outbox.bucket(batch.batch_id))


async def test_a_small_batch_written_indexed_is_whole_listed_and_counted(stores: Stores) -> None:
    """A small batch written with its outbox row and its indexes (one logged batch): its
    header and recipients, its place in the user's list of the month, its ``queued`` count,
    its day among the user's stats days and its outbox row are all there."""
    batch = _batch(A, B, C)
    outbox = _outbox(stores)

    await stores.batches.write(
        batch, also=[await outbox.statement(batch.batch_id, batch.user_id)], indexed=True
    )

    header = await stores.batches.header(batch.batch_id)
    assert header is not None and header.recipient_count == 3
    assert len(await stores.recipients.batch_rows(batch.batch_id)) == 3
    assert batch.batch_id in await _listed(stores, batch)
    assert await _counts(stores, batch) == {"queued": 3}
    assert batch_day(batch.batch_id) in await stores.stats.user_days(batch.user_id)
    assert batch.batch_id in await outbox.unpublished(*Outbox.bucket(batch.batch_id))


async def _listed(stores: Stores, batch: NewBatch) -> set[uuid.UUID]:
    """The batches in the user's list of the batch's month."""
    month = month_of(batch.batch_id)
    if isinstance(stores.db, FakeCassandra):
        return set(stores.db.by_user.get((batch.user_id, month), {}))
    rows = await stores.db.rows(
        "SELECT batch_id FROM batches_by_user WHERE user_id = ? AND month = ?",
        (batch.user_id, month),
    )
    return {r["batch_id"] for r in rows}


async def test_content_past_the_mutation_limit_is_refused_and_leaves_no_batch(
    stores: Stores,
) -> None:
    """A message of 17 MB, past ``max_mutation_size`` (16 MiB): refused as too large to
    store, and nothing of the batch exists, nor its outbox row."""
    batch = _large(1, html=17 * 1024 * 1024)
    outbox = _outbox(stores)

    with pytest.raises(TooLargeToStore):
        await stores.batches.write(
            batch, also=[await outbox.statement(batch.batch_id, batch.user_id)]
        )

    assert await stores.batches.header(batch.batch_id) is None
    assert await stores.batches.status(batch.batch_id) is None
    assert await stores.batches.owner(batch.batch_id) is None
    assert batch.batch_id not in await outbox.unpublished(*Outbox.bucket(batch.batch_id))


async def test_content_whose_header_never_came_is_no_batch_until_written_again(
    stores: Stores,
) -> None:
    """Its writer stopped between the content and the header: the batch does not exist (no
    header, owner or status); writing it again stores it whole."""
    batch = _large(60, html=1_000)
    if isinstance(stores.db, FakeCassandra):
        stores.db.fail("batches.write", DependencyUnavailable("cassandra", "WriteTimeout"))
        with pytest.raises(DependencyUnavailable):
            await stores.batches.write(batch)
    else:
        await stores.batches._write_content(batch, content_of(batch))

    assert await stores.batches.header(batch.batch_id) is None
    assert await stores.batches.owner(batch.batch_id) is None
    assert await stores.batches.status(batch.batch_id) is None

    await stores.batches.write(batch)

    header = await stores.batches.header(batch.batch_id)
    assert header is not None and header.recipient_count == 60
    assert len(await stores.recipients.batch_rows(batch.batch_id)) == 60


async def test_a_dispatched_mark_shows_as_the_status_of_an_accepted_batch(
    stores: Stores,
) -> None:
    batch = await _stored(stores, A)
    await stores.batches.mark_dispatched(batch.batch_id)
    await stores.batches.mark_dispatched(batch.batch_id)  # a redelivery marks it again
    header = await stores.batches.header(batch.batch_id)
    assert header is not None and (header.status, header.reason) == ("dispatched", None)
    assert await stores.batches.status(batch.batch_id) == "dispatched"


@pytest.mark.parametrize("cancel_first", [True, False])
async def test_a_cancelled_batch_stays_cancelled_and_counts_nothing(
    stores: Stores, cancel_first: bool
) -> None:
    """A pending batch whose storing failed is cancelled, however late its failed writes
    land, and counts nothing once uncounted."""
    batch = replace(_batch(A, B), pending=True)
    if cancel_first:
        assert await stores.batches.cancel(batch.batch_id) == "cancelled"
    await stores.batches.write(batch)
    await stores.batches.index(batch)
    if not cancel_first:
        assert await stores.batches.cancel(batch.batch_id) == "cancelled"
    await stores.batches.uncount(batch.user_id, batch.batch_id)
    header = await stores.batches.header(batch.batch_id)
    assert header is not None and header.status == "cancelled"
    assert await stores.batches.commit(batch.batch_id, "accepted") == "cancelled"
    assert await _counts(stores, batch) == {}


async def test_acceptance_counts_a_batchs_recipients_queued_once(stores: Stores) -> None:
    batch = await _stored(stores, A, B, C)
    await stores.batches.index(batch)  # finishing an acceptance again
    header = await stores.batches.header(batch.batch_id)
    assert header is not None
    await stores.batches.index_stored(header)
    day = batch_day(batch.batch_id)
    assert await _counts(stores, batch) == {"queued": 3}
    assert batch.user_id in await stores.stats.active_users(day)
    assert day in await stores.stats.user_days(batch.user_id)


# -- recipients: reads ---------------------------------------------------------------------


async def test_recipients_are_located_by_address_case_insensitively(stores: Stores) -> None:
    batch = await _stored(stores, A, "B@Example.org", C)
    assert await stores.recipients.locate(batch.batch_id, "b@EXAMPLE.org") == (0, _log(batch, B))
    assert await stores.recipients.locate(batch.batch_id, C) == (1, _log(batch, C))
    assert await stores.recipients.locate(batch.batch_id, D) is None


async def test_a_log_id_is_a_member_only_of_its_own_chunk(stores: Stores) -> None:
    batch = await _stored(stores, A, B, C)
    for _ in range(2):  # the second time from what the store remembers
        assert await stores.recipients.member(batch.batch_id, 0, _log(batch, B))
        assert not await stores.recipients.member(batch.batch_id, 0, _log(batch, C))
        assert not await stores.recipients.member(batch.batch_id, 0, _log(batch, D))
    assert await stores.recipients.member(batch.batch_id, 1, _log(batch, C))
    assert not await stores.recipients.member(batch.batch_id, 2, _log(batch, C))


async def test_a_legacy_batchs_members_are_its_recipient_rows(stores: Stores) -> None:
    batch = replace(_batch(), recipients=[RecipientInput(A), RecipientInput(B)])
    await stores.legacy(batch)
    assert await stores.recipients.member(batch.batch_id, 0, _log(batch, A))
    assert not await stores.recipients.member(batch.batch_id, 0, _log(batch, D))


async def test_recipients_start_queued_in_their_chunks_in_the_order_given(stores: Stores) -> None:
    batch = await _stored(stores, C, A, B)
    first = await stores.recipients.chunk_rows(batch.batch_id, 0)
    assert [r["email"] for r in first] == [C, A]
    assert [r["log_id"] for r in first] == [_log(batch, C), _log(batch, A)]
    assert {(visible(r).state, visible(r).event) for r in first} == {("queued", "queued")}
    assert {(r["chunk"], r["own"], r["layout"]) for r in first} == {(0, False, "chunk")}
    assert [r["email"] for r in await stores.recipients.batch_rows(batch.batch_id)] == [C, A, B]
    (last,) = await stores.recipients.chunk_rows(batch.batch_id, 1)
    assert (last["email"], last["chunk"]) == (B, 1)


async def test_names_and_substitutions_are_kept_with_their_recipient(stores: Stores) -> None:
    batch = replace(
        _batch(),
        recipients=[
            RecipientInput(A, "Ann", {"first": "Ann", "code": "x1"}),
            RecipientInput(B, "Bob"),
            RecipientInput(C),
        ],
        chunk_size=3,
    )
    await stores.batches.write(batch)
    rows = await stores.recipients.chunk_rows(batch.batch_id, 0)
    assert [(r["email"], r["name"], r["substitutions"]) for r in rows] == [
        (A, "Ann", {"first": "Ann", "code": "x1"}),
        (B, "Bob", {}),
        (C, None, {}),
    ]
    found = await stores.recipients.one(batch.batch_id, 0, _log(batch, A), addresses=True)
    assert found is not None and (found["email"], found["name"]) == (A, "Ann")


async def test_a_large_chunk_reads_back_as_a_small_one_does(stores: Stores) -> None:
    """A chunk whose stored list passes LARGE_CHUNK_ROW (read in a worker thread) reads back
    every recipient with its log id, name and substitutions, the first read and the next."""
    people = [
        RecipientInput(f"r{i}@example.org", f"R {i}", {"-v-": "x" * 1000}) for i in range(300)
    ]
    batch = replace(_batch(), recipients=people, chunk_size=300)
    await stores.batches.write(batch)

    for _ in range(2):
        rows = await stores.recipients.chunk_rows(batch.batch_id, 0)
        assert [(r["email"], r["name"], r["substitutions"], r["log_id"]) for r in rows] == [
            (p.email, p.name, p.substitutions, _log(batch, p.email)) for p in people
        ]


async def test_one_finds_a_recipient_only_in_a_chunk_that_lists_it(stores: Stores) -> None:
    batch = await _stored(stores, A, B, C)
    mine = await stores.recipients.one(batch.batch_id, 0, _log(batch, B), addresses=True)
    assert mine is not None and (mine["email"], mine["log_id"]) == (B, _log(batch, B))
    stranger = log_id_for(batch.batch_id, D)
    assert await stores.recipients.one(batch.batch_id, 0, stranger, addresses=True) is None
    assert await stores.recipients.one(batch.batch_id, 0, _log(batch, C), addresses=True) is None
    assert await stores.recipients.one(batch.batch_id, 7, _log(batch, A)) is None  # no chunk 7


async def test_one_without_addresses_reads_the_recipients_state(stores: Stores) -> None:
    batch = await _stored(stores, A, B)
    await _reported(stores, batch, B)
    for email in (A, B):
        fast = await stores.recipients.one(batch.batch_id, 0, _log(batch, email))
        full = await stores.recipients.one(batch.batch_id, 0, _log(batch, email), addresses=True)
        assert fast is not None and full is not None
        assert _state(fast) == _state(full)
        assert (fast["log_id"], fast["own"], fast["layout"]) == (
            full["log_id"],
            full["own"],
            "chunk",
        )
    b = await stores.recipients.one(batch.batch_id, 0, _log(batch, B))
    assert b is not None and visible(b).state == "success"


def _sign_bit_pair() -> tuple[uuid.UUID, str, str]:
    """A batch id and two addresses whose log ids differ first in the sign bit of a byte of
    their clock sequence, so that Cassandra's order (signed bytes) and Python's (unsigned)
    disagree."""
    for n in range(10_000):
        batch_id = uuid.uuid1()
        a, b = f"s{n}a@example.org", f"s{n}b@example.org"
        x, y = log_id_for(batch_id, a).bytes[8:], log_id_for(batch_id, b).bytes[8:]
        first = next((i for i in range(8) if x[i] != y[i]), None)
        if first is not None and (x[first] ^ y[first]) & 0x80:
            return batch_id, a, b
    raise AssertionError("no such pair")


async def test_a_legacy_batchs_recipients_come_in_cassandras_timeuuid_order(
    stores: Stores,
) -> None:
    """A batch stored before v2 (a row per recipient, no chunk rows) reads from its rows, in
    their clustering order."""
    batch_id, a, b = _sign_bit_pair()
    batch = _batch(a, b, batch_id=batch_id)
    await stores.legacy(batch)
    rows = await stores.recipients.chunk_rows(batch_id, 0)
    # Same time: ordered by the clock sequence and node as *signed* bytes.
    signed = sorted(
        (a, b), key=lambda e: [int.from_bytes([x], signed=True) for x in _log(batch, e).bytes[8:]]
    )
    assert [r["email"] for r in rows] == signed
    assert signed != sorted((a, b), key=lambda e: _log(batch, e))  # Python's order
    assert {(r["own"], r["layout"], visible(r).state) for r in rows} == {(True, "rows", "queued")}


async def test_a_legacy_batch_is_located_read_and_written_through_its_own_rows(
    stores: Stores,
) -> None:
    batch = replace(_batch(), recipients=[RecipientInput(A, "Ann", {"k": "v"}), RecipientInput(B)])
    await stores.legacy(batch)
    assert await stores.recipients.locate(batch.batch_id, "A@EXAMPLE.ORG") == (0, _log(batch, A))
    chosen = await _whole(stores, batch, 0)
    assert not chosen.whole  # no chunk row to write
    await stores.recipients.accepted(
        batch.batch_id, chosen, provider="sg", tag="c.0", when=_at(batch, 1), message_id="m-1"
    )
    rows = await stores.recipients.chunk_rows(batch.batch_id, 0)
    assert [(r["email"], r["name"], r["substitutions"]) for r in rows if r["email"] == A] == [
        (A, "Ann", {"k": "v"})
    ]
    assert {(r["event"], visible(r).state) for r in rows} == {("sent", "queued")}
    assert [dict(r["providers"]) for r in rows] == [{"sg": "sent"}] * 2
    one = await stores.recipients.one(batch.batch_id, 0, _log(batch, B))
    assert one is not None and one["email"] == B and set(one["evidence"]) == {"c.0"}


# -- recipients: writes --------------------------------------------------------------------


async def test_a_selection_is_whole_only_for_all_of_a_stored_chunk(stores: Stores) -> None:
    batch = await _stored(stores, A, B)
    everyone = await stores.recipients.chunk_rows(batch.batch_id, 0)
    assert Selection.of(0, everyone, everyone).whole
    assert not Selection.of(0, everyone, everyone[:1]).whole
    assert not Selection.of(0, everyone, []).whole


async def test_a_whole_chunk_write_reads_back_as_writes_to_each_recipient(stores: Stores) -> None:
    """Chunk 0 is written once, to its chunk row; chunk 1 recipient by recipient: readers see
    the same recipients, and the stats count each recipient once either way."""
    batch = await _stored(stores, A, B, C, D)
    whole = await _whole(stores, batch, 0)
    each = [Selection.one(1, _log(batch, e)) for e in (C, D)]
    assert whole.whole and whole.log_ids == (_log(batch, A), _log(batch, B))
    for _ in range(2):  # a replay writes the same cells
        for chosen in (whole, *each):
            await stores.recipients.call_failed(
                batch.batch_id, chosen, provider="sg", result="failed: 500", when=_at(batch, 1)
            )
            await stores.recipients.accepted(
                batch.batch_id, chosen, provider="mg", tag="c.1", when=_at(batch, 2),
                message_id="m-1",
            )  # fmt: skip
            await stores.recipients.give_up(
                batch.batch_id, batch.user_id, chosen, reason="all failed", when=_at(batch, 3)
            )
    first = await stores.recipients.chunk_rows(batch.batch_id, 0)
    second = await stores.recipients.chunk_rows(batch.batch_id, 1)
    assert [_state(r) for r in first] == [_state(r) for r in second]
    assert ([r["own"] for r in first], [r["own"] for r in second]) == ([False] * 2, [True] * 2)
    row = first[0]
    assert visible(row) == visible({"state": None, "gave_up_reason": "all failed"})
    assert (dict(row["providers"]), set(row["evidence"])) == (
        {"sg": "failed: 500", "mg": "sent"},
        {"c.1"},
    )
    assert await _counts(stores, batch) == {"queued": 4, "failed": 4}


async def test_a_recipient_diverging_from_its_chunk_keeps_what_the_chunk_said(
    stores: Stores,
) -> None:
    batch = await _stored(stores, A, B)
    await stores.recipients.accepted(
        batch.batch_id, await _whole(stores, batch, 0), provider="sg", tag="c.0",
        when=_at(batch, 1), message_id="m-1",
    )  # fmt: skip
    await _reported(stores, batch, B, when=_at(batch, 3))
    a, b = await stores.recipients.chunk_rows(batch.batch_id, 0)
    assert (a["own"], a["event"], visible(a).state) == (False, "sent", "queued")
    assert (b["own"], b["event"], visible(b).state) == (True, "delivered", "success")
    assert dict(a["providers"]) == {"sg": "sent"}
    assert dict(b["providers"]) == {"sg": "delivered"}  # the later stage wins the entry
    assert dict(b["message_ids"]) == {"sg": "m-1"}  # what the chunk said, kept
    assert set(b["evidence"]) == {"c.0"}
    stored = await stores.recipients.stored_chunk(batch.batch_id, 0)
    assert [r["log_id"] for r in stored] == [CHUNK_ROW, _log(batch, B)]
    assert merged_chunk(batch.batch_id, 0, stored) == [a, b]


async def test_each_map_entry_and_set_element_keeps_its_own_write_time(stores: Stores) -> None:
    """What a reader merges: every element of a recipient's maps and sets with the write
    timestamp of the write that put it there, in element order."""
    batch = await _stored(stores, A)
    log_id = _log(batch, A)
    stamp = partial(provider_stamp, batch.batch_id)
    await stores.recipients.accepted(
        batch.batch_id, await _whole(stores, batch, 0), provider="zz", tag="r.9",
        when=_at(batch, 1), message_id=None,
    )  # fmt: skip
    for tag, provider, seconds in (("r.0", "sg", 9), ("c.0", "mg", 4), ("c.1", "ab", 6)):
        await stores.recipients.accepted(
            batch.batch_id, Selection.one(0, log_id), provider=provider, tag=tag,
            when=_at(batch, seconds), message_id=None,
        )  # fmt: skip
    chunk_row, own = await stores.recipients.stored_chunk(batch.batch_id, 0)
    assert (list(chunk_row["evidence"]), chunk_row["w_evidence"]) == (
        ["r.9"],
        [stamp(_at(batch, 1), 0)],
    )
    assert (list(own["evidence"]), own["w_evidence"]) == (
        ["c.0", "c.1", "r.0"],
        [stamp(_at(batch, s), 0) for s in (4, 6, 9)],
    )
    assert (list(own["providers"]), own["w_providers"]) == (
        ["ab", "mg", "sg"],
        [stamp(_at(batch, s), 0) for s in (6, 4, 9)],
    )
    (row,) = await stores.recipients.chunk_rows(batch.batch_id, 0)
    assert (sorted(row["evidence"]), row["w_evidence"]) == (
        ["c.0", "c.1", "r.0", "r.9"],
        [stamp(_at(batch, s), 0) for s in (4, 6, 9, 1)],
    )
    assert (row["event"], row["w_event"]) == ("sent", stamp(_at(batch, 9), 0))


@pytest.mark.parametrize("whole", [True, False])
async def test_acceptance_records_evidence_and_the_provider(stores: Stores, whole: bool) -> None:
    batch = await _stored(stores, A)
    chosen = await _whole(stores, batch, 0) if whole else Selection.one(0, _log(batch, A))
    assert chosen.whole is whole
    for _ in range(2):  # a replay writes the same cells
        await stores.recipients.accepted(
            batch.batch_id, chosen, provider="sg", tag="c.0", when=_at(batch, 1), message_id="m-1"
        )
    row = await stores.recipients.one(batch.batch_id, 0, _log(batch, A))
    assert row is not None
    assert (row["event"], visible(row).state, row["own"]) == ("sent", "queued", not whole)
    assert dict(row["providers"]) == {"sg": "sent"}
    assert dict(row["message_ids"]) == {"sg": "m-1"}
    assert set(row["evidence"]) == {"c.0"}
    assert await _counts(stores, batch) == {"queued": 1}  # no outcome yet


async def test_a_failed_call_changes_only_the_providers_map(stores: Stores) -> None:
    batch = await _stored(stores, A)
    await stores.recipients.call_failed(
        batch.batch_id,
        Selection.one(0, _log(batch, A)),
        provider="sg",
        result="failed: 500",
        when=_at(batch, 1),
    )
    row = await stores.recipients.one(batch.batch_id, 0, _log(batch, A))
    assert row is not None
    assert (visible(row).event, visible(row).state) == ("queued", "queued")
    assert dict(row["providers"]) == {"sg": "failed: 500"}
    assert row["evidence"] is None


@pytest.mark.parametrize("give_up_first", [True, False])
@pytest.mark.parametrize("whole", [True, False])
async def test_provider_evidence_outranks_a_give_up_in_either_order(
    stores: Stores, give_up_first: bool, whole: bool
) -> None:
    batch = await _stored(stores, A, B)
    chosen = await _whole(stores, batch, 0) if whole else Selection.one(0, _log(batch, A))

    async def give_up() -> None:
        await stores.recipients.give_up(
            batch.batch_id, batch.user_id, chosen, reason="all failed", when=_at(batch, 9)
        )

    async def delivered() -> None:
        await _reported(stores, batch, A, provider="mg", evidence="c.1")

    first, second = (give_up, delivered) if give_up_first else (delivered, give_up)
    await first()
    await second()
    a, b = await stores.recipients.chunk_rows(batch.batch_id, 0)
    assert visible(a).state == "success"
    assert visible(b).state == ("failed" if whole else "queued")
    assert await _counts(stores, batch) == (
        {"queued": 2, "success": 1, "failed": 1} if whole else {"queued": 2, "success": 1}
    )


async def test_a_give_up_alone_fails_the_recipient_and_counts_it_once(stores: Stores) -> None:
    batch = await _stored(stores, A)
    for _ in range(2):  # a replay writes the same rows
        await stores.recipients.give_up(
            batch.batch_id,
            batch.user_id,
            Selection.one(0, _log(batch, A)),
            reason="all failed",
            when=_at(batch, 9),
        )
    row = await stores.recipients.one(batch.batch_id, 0, _log(batch, A))
    assert row is not None
    assert (visible(row).state, visible(row).reason) == ("failed", "all failed")
    assert await _counts(stores, batch) == {"queued": 1, "failed": 1}


async def test_a_give_up_of_nobody_writes_nothing(stores: Stores) -> None:
    batch = await _stored(stores, A)
    await stores.recipients.give_up(
        batch.batch_id, batch.user_id, Selection(0, ()), reason="x", when=_at(batch, 9)
    )
    (row,) = await stores.recipients.chunk_rows(batch.batch_id, 0)
    assert visible(row).state == "queued"
    assert await _counts(stores, batch) == {"queued": 1}


@pytest.mark.parametrize("legacy", [False, True])
async def test_a_drop_at_send_time_fails_each_recipient_on_its_own_row_once(
    stores: Stores, legacy: bool
) -> None:
    """One recipient alone (one logged batch) and two at once (outcome rows, then states):
    each ends dropped and failed with its own reason, the others stay queued, and a replay
    writes the same cells and counts nothing more."""
    if legacy:
        batch = _batch(A, B, C, D)
        await stores.legacy(batch)
        await stores.stats.accepted(batch.user_id, batch.batch_id, 4, 0)
    else:
        batch = await _stored(stores, A, B, C, D)
    for _ in range(2):
        await stores.recipients.suppressed(
            batch.batch_id, batch.user_id, 0, {_log(batch, A): "suppressed: bounced"},
            when=_at(batch, 5),
        )  # fmt: skip
        await stores.recipients.suppressed(
            batch.batch_id, batch.user_id, 1,
            {_log(batch, C): "suppressed: bounced", _log(batch, D): "suppressed: complained"},
            when=_at(batch, 6),
        )  # fmt: skip
    await stores.recipients.suppressed(batch.batch_id, batch.user_id, 1, {}, when=_at(batch, 7))
    rows = {r["email"]: r for r in await stores.recipients.batch_rows(batch.batch_id)}
    shown = {e: (visible(r).state, visible(r).event, visible(r).reason) for e, r in rows.items()}
    assert shown == {
        A: ("failed", "dropped", "suppressed: bounced"),
        B: ("queued", "queued", None),
        C: ("failed", "dropped", "suppressed: bounced"),
        D: ("failed", "dropped", "suppressed: complained"),
    }
    assert rows[A]["own"] and rows[A]["providers"] is None
    assert await _counts(stores, batch) == {"queued": 4, "failed": 3}


@pytest.mark.parametrize("whole", [True, False])
async def test_provider_evidence_outranks_a_drop_at_send_time(stores: Stores, whole: bool) -> None:
    """A delivery a provider reports (even stamped at the acceptance second) wins over our
    drop, and the stats follow it; a give-up of the chunk does not undo the drop."""
    batch = await _stored(stores, A, B)
    await stores.recipients.suppressed(
        batch.batch_id, batch.user_id, 0, {_log(batch, A): "suppressed: bounced"},
        when=_at(batch, 9),
    )  # fmt: skip
    await stores.recipients.suppressed(
        batch.batch_id, batch.user_id, 0, {_log(batch, B): "suppressed: bounced"},
        when=_at(batch, 9),
    )  # fmt: skip
    await _reported(stores, batch, A, when=_at(batch, 0))
    chosen = await _whole(stores, batch, 0) if whole else Selection.one(0, _log(batch, B))
    await stores.recipients.give_up(
        batch.batch_id, batch.user_id, chosen, reason="all failed", when=_at(batch, 10)
    )
    a, b = await stores.recipients.chunk_rows(batch.batch_id, 0)
    assert (visible(a).state, visible(a).event) == ("success", "delivered")
    assert (visible(b).state, visible(b).event, visible(b).reason) == (
        "failed",
        "dropped",
        "suppressed: bounced",
    )
    assert await _counts(stores, batch) == {"queued": 2, "success": 1, "failed": 1}


async def test_at_the_same_moment_the_higher_rank_decides(stores: Stores) -> None:
    batch = await _stored(stores, A)
    common: dict[str, Any] = {"when": _at(batch, 3), "reason": "mailbox full"}
    await _reported(
        stores, batch, provider_result="bounced", stage_rank=4, rank=4, event="bounced",
        state="failed", metrics=("bounced",), **common,
    )  # fmt: skip
    await _reported(stores, batch, stage_rank=3, rank=3, **common)
    row = await stores.recipients.one(batch.batch_id, 0, _log(batch, A))
    assert row is not None
    assert (row["event"], visible(row).state, row["reason_detail"]) == (
        "bounced",
        "failed",
        "mailbox full",
    )
    assert dict(row["providers"]) == {"sg": "bounced"}
    assert await _counts(stores, batch) == {"queued": 1, "failed": 1, "bounced": 1}


async def test_a_replayed_report_and_its_metrics_count_once(stores: Stores) -> None:
    batch = await _stored(stores, A, B)
    for _ in range(3):  # the provider retried its webhooks
        await _reported(stores, batch, A)
        await _reported(
            stores, batch, A, provider_result="opened", stage_rank=0, rank=0,
            event=None, state=None, evidence=None, metrics=("opened", "clicked"),
        )  # fmt: skip
    assert await _counts(stores, batch) == {"queued": 2, "success": 1, "opened": 1, "clicked": 1}
    row = await stores.recipients.one(batch.batch_id, 0, _log(batch, A))
    assert row is not None and (row["event"], visible(row).state) == ("delivered", "success")


async def test_a_report_earns_only_event_metrics(stores: Stores) -> None:
    batch = await _stored(stores, A)
    with pytest.raises(ValueError, match="not an event metric"):
        await _reported(stores, batch, metrics=("success",))
    (row,) = await stores.recipients.chunk_rows(batch.batch_id, 0)
    assert visible(row).state == "queued"


async def test_supersede_marks_the_attempt_and_keeps_the_recipient_queued(stores: Stores) -> None:
    batch = await _stored(stores, A)
    log_id = _log(batch, A)
    await stores.recipients.supersede(
        batch.batch_id, 0, log_id, tag="c.0", provider="sg", result="dropped", when=_at(batch, 4)
    )
    row = await stores.recipients.one(batch.batch_id, 0, log_id)
    assert row is not None
    assert set(row["superseded"]) == {"c.0"}
    assert dict(row["providers"]) == {"sg": "dropped"}
    assert (visible(row).state, row["own"]) == ("queued", True)


async def test_of_two_writes_at_the_same_moment_the_larger_value_wins(stores: Stores) -> None:
    """Cassandra breaks a write-timestamp tie by the larger serialized value (whatever the
    order the writes arrived in); stamps are whole seconds, so ties happen. Readers merging a
    chunk's row with a recipient's own row break it the same way."""
    batch = await _stored(stores, A)
    log_id = _log(batch, A)
    own, whole = Selection.one(0, log_id), await _whole(stores, batch, 0)
    for result, chosen in (("failed: X's", own), ("failed: A", own), ("failed: B", whole)):
        await stores.recipients.call_failed(
            batch.batch_id, chosen, provider="sg", result=result, when=_at(batch, 1)
        )
    for seconds, chosen in ((2.3, own), (2.0, own), (2.1, whole)):
        # The same second, so the same stamp; last_update differs.
        await stores.recipients.accepted(
            batch.batch_id, chosen, provider="mg", tag="c.1", when=_at(batch, seconds),
            message_id=None,
        )  # fmt: skip
    row = await stores.recipients.one(batch.batch_id, 0, log_id)
    assert row is not None
    assert dict(row["providers"])["sg"] == "failed: X's"
    assert row["last_update"].replace(tzinfo=None) == _at(batch, 2.3).replace(
        tzinfo=None, microsecond=_at(batch, 2.3).microsecond // 1000 * 1000
    )


# -- attempts, suppressions, timeline, tokens ------------------------------------------------


async def test_an_attempt_is_created_once(stores: Stores) -> None:
    batch_id, owner = uuid.uuid1(), uuid.uuid4()
    first = await stores.attempts.create(
        batch_id, "c0", 0, chunk=0, provider="sg", state="claimed", owner=owner
    )
    second = await stores.attempts.create(
        batch_id, "c0", 0, chunk=0, provider="mg", state="claimed", owner=uuid.uuid4()
    )
    assert (first, second) == (True, False)
    (attempt,) = await stores.attempts.line(batch_id, "c0")
    assert (attempt.provider, attempt.state, attempt.owner, attempt.checks) == (
        "sg",
        "claimed",
        owner,
        0,
    )
    assert attempt.created_at.tzinfo is not None


async def test_an_attempt_created_calling_keeps_its_owner_and_call_start(stores: Stores) -> None:
    batch_id, owner, now = uuid.uuid1(), uuid.uuid4(), datetime.now(UTC)
    assert await stores.attempts.create(
        batch_id, "c0", 0, chunk=0, provider="sg", state="calling", owner=owner, calling_at=now
    )
    (attempt,) = await stores.attempts.line(batch_id, "c0", serial=True)
    assert (attempt.state, attempt.owner, attempt.checks) == ("calling", owner, 0)
    assert attempt.calling_at is not None
    assert abs((attempt.calling_at - now).total_seconds()) < 0.002


async def test_an_attempt_keeps_the_template_version_its_call_was_made_with(
    stores: Stores,
) -> None:
    batch_id, owner = uuid.uuid1(), uuid.uuid4()
    assert await stores.attempts.create(
        batch_id, "c0", 0, chunk=0, provider="sg", state="calling", owner=owner,
        calling_at=datetime.now(UTC), template_version=3,
    )  # fmt: skip
    await stores.attempts.create(batch_id, "c1", 0, chunk=1, provider="sg", state="planned")
    assert await stores.attempts.transition(
        batch_id, "c1", 0, expect={"state": "planned"},
        values={"state": "calling", "owner": owner, "template_version": 2},
    )  # fmt: skip
    await stores.attempts.create(batch_id, "c2", 0, chunk=2, provider="sg", state="calling")

    lines = await stores.attempts.lines(batch_id)
    assert [lines[f"c{n}"][0].template_version for n in range(3)] == [3, 2, None]


async def test_a_transition_applies_only_when_its_condition_holds(stores: Stores) -> None:
    batch_id, owner = uuid.uuid1(), uuid.uuid4()
    await stores.attempts.create(
        batch_id, "c0", 0, chunk=0, provider="sg", state="claimed", owner=owner
    )
    now = datetime.now(UTC)
    wrong = await stores.attempts.transition(
        batch_id, "c0", 0, expect={"state": "claimed", "owner": uuid.uuid4()},
        values={"state": "calling"},
    )  # fmt: skip
    right = await stores.attempts.transition(
        batch_id, "c0", 0, expect={"state": "claimed", "owner": owner},
        values={"state": "calling", "calling_at": now, "checks": 2},
    )  # fmt: skip
    missing = await stores.attempts.transition(
        batch_id, "c0", 1, expect={"state": "claimed"}, values={"state": "calling"}
    )
    assert (wrong, right, missing) == (False, True, False)
    (attempt,) = await stores.attempts.line(batch_id, "c0", serial=True)
    assert (attempt.state, attempt.checks) == ("calling", 2)
    assert attempt.calling_at is not None
    assert abs((attempt.calling_at - now).total_seconds()) < 0.002


async def test_a_new_attempt_has_had_no_checks(stores: Stores) -> None:
    batch_id = uuid.uuid1()
    await stores.attempts.create(batch_id, "c0", 0, chunk=0, provider="sg", state="claimed")
    assert await stores.attempts.transition(
        batch_id, "c0", 0, expect={"checks": 0}, values={"checks": 1}
    )
    (attempt,) = await stores.attempts.line(batch_id, "c0")
    assert attempt.checks == 1


async def test_an_attempt_keeps_the_answers_recorded_with_its_outcome(stores: Stores) -> None:
    batch_id, owner = uuid.uuid1(), uuid.uuid4()
    await stores.attempts.create(
        batch_id, "c0", 0, chunk=0, provider="sg", state="calling", owner=owner
    )
    answers = '{"final":false,"recipients":[]}'
    assert await stores.attempts.transition(
        batch_id, "c0", 0, expect={"state": "calling", "owner": owner},
        values={"state": "accepted", "answers": answers},
    )  # fmt: skip
    await stores.attempts.create(batch_id, "c1", 0, chunk=1, provider="sg", state="calling")
    lines = await stores.attempts.lines(batch_id)
    assert [lines[c][0].answers for c in ("c0", "c1")] == [answers, None]


async def test_lines_are_read_in_attempt_order_and_grouped(stores: Stores) -> None:
    batch_id = uuid.uuid1()
    for line, n, provider in (("c0", 1, "mg"), ("c0", 0, "sg"), ("c1", 0, "sg")):
        await stores.attempts.create(
            batch_id, line, n, chunk=int(line[1:]), provider=provider, state="planned"
        )
    assert [a.attempt for a in await stores.attempts.line(batch_id, "c0")] == [0, 1]
    lines = await stores.attempts.lines(batch_id)
    assert {k: [a.provider for a in v] for k, v in lines.items()} == {
        "c0": ["sg", "mg"],
        "c1": ["sg"],
    }
    assert await stores.attempts.line(uuid.uuid1(), "c0") == []


async def test_suppressions_are_found_case_insensitively(stores: Stores) -> None:
    user = uuid.uuid4()
    await stores.suppressions.add(user, "Ann@Example.org", reason="bounce", source="sg")
    found = await stores.suppressions.suppressed(user, ["ANN@example.org", "bob@example.org"])
    assert found == {"ann@example.org": "bounce"}
    assert await stores.suppressions.suppressed(uuid.uuid4(), ["ann@example.org"]) == {}


async def test_a_send_time_lookup_reads_a_whole_request_and_its_list_at_once(
    stores: Stores,
) -> None:
    """A provider request's most addresses in one query (and one of the list's own):
    found whichever table lists them, the user's list first."""
    user = uuid.uuid4()
    wanted = [f"r{i:04d}@example.org" for i in range(SEND_LOOKUP)]
    await stores.suppressions.add(user, wanted[0], reason="bounced", source="sg")
    await stores.suppressions.add(user, wanted[-1], reason="manual", source="api")
    for email in (wanted[-1], wanted[500]):
        await stores.suppressions.add(
            user, email, reason="unsubscribed", source="tracker", scope="news"
        )
    found = await stores.suppressions.suppressed(
        user, [e.upper() for e in wanted], "news", per_query=SEND_LOOKUP
    )
    assert found == {
        wanted[0]: "bounced",
        wanted[500]: "unsubscribed (news)",
        wanted[-1]: "manual",
    }


async def test_a_replayed_event_is_one_timeline_entry(stores: Stores) -> None:
    batch = _batch("a@example.org")
    ev = _event(batch)
    await stores.timeline.record(batch.batch_id, _log(batch, A), ev, counted=True)
    await stores.timeline.record(batch.batch_id, _log(batch, A), ev, counted=False)
    assert await stores.events(batch.batch_id, _log(batch, A)) == [(ev.event_id, False)]


async def test_the_same_event_at_another_time_is_another_timeline_entry(stores: Stores) -> None:
    """An event without its own timestamp takes the time it was received: a provider's
    retry of it is then a second entry."""
    batch = _batch("a@example.org")
    log_id = _log(batch, A)
    first = _event(batch)
    again = replace(first, occurred_at=first.occurred_at + timedelta(seconds=30))
    await stores.timeline.record(batch.batch_id, log_id, first, counted=True)
    await stores.timeline.record(batch.batch_id, log_id, again, counted=False)
    assert await stores.events(batch.batch_id, log_id) == [
        (first.event_id, True),
        (first.event_id, False),
    ]


async def test_an_orphan_event_is_kept(stores: Stores) -> None:
    ev = _event(_batch("a@example.org"), provider="mg", event_id=uuid.uuid4().hex)
    await stores.timeline.orphan(ev)
    day = ev.occurred_at.date()
    assert await stores.orphaned("mg", day, ev.event_id)
    assert not await stores.orphaned("mg", day, uuid.uuid4().hex)


async def test_a_webhook_token_goes_with_one_body(stores: Stores) -> None:
    token = uuid.uuid4().hex
    assert await stores.tokens.accept_once(token, b"body-1")
    assert await stores.tokens.accept_once(token, b"body-1")  # a replay
    assert not await stores.tokens.accept_once(token, b"body-2")  # a forgery


def _report(batch: NewBatch, email: str, **fields: Any) -> Report:
    """A provider's ``delivered`` for ``email`` of chunk 0 (``fields`` change it)."""
    values: dict[str, Any] = {
        "provider": "sg",
        "provider_result": "delivered",
        "message_id": "sg-1",
        "stage_rank": 3,
        "rank": 3,
        "when": _at(batch, 2),
        "event": "delivered",
        "state": "success",
        "reason": None,
        "evidence": "c.0",
    }
    values.update(fields)
    return Report(batch.batch_id, batch.user_id, 0, _log(batch, email), **values)


async def test_many_reports_over_several_batches_land_and_count_once(stores: Stores) -> None:
    first, second = await _stored(stores, A, B), await _stored(stores, C, D)
    ev = _event(first, "delivered")
    line = await stores.timeline.statement(first.batch_id, _log(first, A), ev, counted=True)
    reports = [
        _report(first, A, also=[line]),
        _report(first, B, provider_result="bounced: 550", event="bounced", state="failed",
                reason="550", metrics=("bounced",)),
        _report(second, C),
        _report(second, D, provider_result="opened", stage_rank=0, rank=0, event=None,
                state=None, evidence=None, metrics=("opened",)),
    ]  # fmt: skip
    for _ in range(3):  # the provider retried the delivery
        await stores.recipients.reported_many(reports)
    states = {
        e: visible(row).state
        for b, emails in ((first, (A, B)), (second, (C, D)))
        for e in emails
        if (row := await stores.recipients.one(b.batch_id, 0, _log(b, e))) is not None
    }
    assert states == {A: "success", B: "failed", C: "success", D: "queued"}
    assert await _counts(stores, first) == {"queued": 2, "success": 1, "failed": 1, "bounced": 1}
    assert await _counts(stores, second) == {"queued": 2, "success": 1, "opened": 1}
    assert await stores.events(first.batch_id, _log(first, A)) == [(ev.event_id, True)]
    b = await stores.recipients.one(first.batch_id, 0, _log(first, B))
    assert b is not None and b["reason_detail"] == "550"


class _Counting(Database):
    """The contract's real session, counting the requests it sends (each a round trip)."""

    sent = 0

    async def execute(self, *args: Any, **kw: Any) -> Any:
        self.sent += 1
        return await super().execute(*args, **kw)


async def test_a_report_alone_is_one_request_with_its_stat_and_timeline_rows(
    stores: Stores,
) -> None:
    """A delivery of one report (a Mailgun post) writes its state, its stat row and its
    timeline row in one request (one logged batch), as :meth:`reported` does."""
    batch = await _stored(stores, A, B)
    ev = _event(batch, "delivered")
    line = await stores.timeline.statement(batch.batch_id, _log(batch, A), ev, counted=True)
    report = _report(batch, A, also=[line])
    if isinstance(stores.db, FakeCassandra):
        recipients, before = stores.recipients, len(stores.db.calls)
        await recipients.reported_many([report])
        sent = sum(OPERATION_KINDS[op] != "read" for op in stores.db.calls[before:])
    else:
        counting = _Counting(stores.db.cluster, stores.db.session, stores.db.keyspace)
        stats = StatsStore(counting, stores.stats.buckets)
        await stats.activity(batch.user_id, batch.batch_id)  # remembered, as after acceptance
        counting.sent = 0
        await RecipientStore(counting, stats).reported_many([report])
        sent = counting.sent
    assert sent == 1
    assert await _counts(stores, batch) == {"queued": 2, "success": 1}
    assert await stores.events(batch.batch_id, _log(batch, A)) == [(ev.event_id, True)]


async def test_many_reports_write_what_one_report_at_a_time_writes(stores: Stores) -> None:
    one_by_one, together = await _stored(stores, A, B), await _stored(stores, A, B)
    fields: dict[str, Any] = {"when": _at(one_by_one, 2)}
    await _reported(stores, one_by_one, A, **fields)
    await stores.recipients.reported_many([_report(together, A, message_id=None, **fields)])
    mine = await stores.recipients.one(one_by_one.batch_id, 0, _log(one_by_one, A))
    theirs = await stores.recipients.one(together.batch_id, 0, _log(together, A))
    assert mine is not None and theirs is not None
    cells = set(STATE_CELLS)
    assert {k: v for k, v in _state(mine).items() if k in cells} == {
        k: v for k, v in _state(theirs).items() if k in cells
    }
    assert await _counts(stores, one_by_one) == await _counts(stores, together)
