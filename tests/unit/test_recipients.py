"""How recipients are identified and read from a chunk's stored rows (pure)."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime

import orjson
import pytest
from cassandra.util import uuid_from_time

from shared.delivery import precedence
from shared.delivery.recipients import (
    CHUNK_ROW,
    Selection,
    decode_recipients,
    encode_recipients,
    log_id_for,
    merged_chunk,
    merged_one,
    timeuuid_order,
)
from shared.delivery.validation import RecipientInput

BATCH = uuid_from_time(datetime(2026, 11, 25, 12, 0, tzinfo=UTC))
A, B, C = "a@example.org", "b@example.org", "c@example.org"


def v1_log_id(batch_id: uuid.UUID, email: str) -> uuid.UUID:
    """The formula of release v1 (``shared.delivery.batchstore.log_id_for`` before data model
    v2)."""
    digest = hashlib.sha256(batch_id.bytes + email.lower().encode()).digest()
    clock_seq = int.from_bytes(digest[:2], "big") & 0x3FFF
    node = int.from_bytes(digest[2:8], "big")
    return uuid.UUID(
        fields=(
            batch_id.time_low,
            batch_id.time_mid,
            batch_id.time_hi_version,
            0x80 | (clock_seq >> 8),
            clock_seq & 0xFF,
            node,
        )
    )


# -- log ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize("email", [A, "Ann.Lee+news@Example.ORG", "ü@例え.jp", ""])
def test_a_log_id_is_the_one_release_v1_stored(email: str) -> None:
    for batch_id in (BATCH, uuid.uuid1(), uuid_from_time(0.0), uuid.UUID(int=(1 << 128) - 1)):
        assert log_id_for(batch_id, email) == v1_log_id(batch_id, email)


def test_a_log_id_has_the_batchs_time_and_an_address_derived_clock_and_node() -> None:
    log_id = log_id_for(BATCH, A)
    digest = hashlib.sha256(BATCH.bytes + A.encode()).digest()
    assert (log_id.version, log_id.variant) == (1, uuid.RFC_4122)
    assert log_id.time == BATCH.time
    assert log_id.clock_seq == int.from_bytes(digest[:2], "big") & 0x3FFF
    assert log_id.node == int.from_bytes(digest[2:8], "big")
    assert log_id_for(BATCH, "A@EXAMPLE.org") == log_id  # case-insensitive
    assert log_id_for(BATCH, B) != log_id
    assert log_id_for(uuid.uuid1(), A) != log_id


def test_the_chunk_row_sorts_before_every_recipient_in_cassandras_order() -> None:
    ids = [log_id_for(BATCH, f"r{n}@example.org") for n in range(200)]
    assert min([CHUNK_ROW, *ids], key=timeuuid_order) == CHUNK_ROW
    assert min([CHUNK_ROW, uuid_from_time(0.0)], key=timeuuid_order) == CHUNK_ROW


def test_cassandras_order_compares_clock_and_node_as_signed_bytes() -> None:
    low = uuid.UUID(fields=(1, 2, 0x1003, 0x80, 0x01, 1))
    high = uuid.UUID(fields=(1, 2, 0x1003, 0x80, 0x81, 1))  # 0x81 is negative as a signed byte
    assert high > low  # Python: unsigned
    assert timeuuid_order(high) < timeuuid_order(low)
    later = uuid.UUID(fields=(2, 2, 0x1003, 0x80, 0x81, 1))
    assert timeuuid_order(later) > timeuuid_order(low)  # time first


def test_a_chunks_list_keeps_names_and_substitutions_only_where_given() -> None:
    people = [RecipientInput(A, "Ann", {"k": "v"}), RecipientInput(B, "Bob"), RecipientInput(C)]
    raw = encode_recipients(people)
    assert orjson.loads(raw) == [[A, "Ann", {"k": "v"}], [B, "Bob"], [C]]
    assert decode_recipients(raw) == [(A, "Ann", {"k": "v"}), (B, "Bob", {}), (C, None, {})]
    subs_only = encode_recipients([RecipientInput(A, None, {"k": "v"})])
    assert decode_recipients(subs_only) == [(A, None, {"k": "v"})]


# -- reading a chunk ---------------------------------------------------------------------------


def stored(log_id: uuid.UUID, **cells: object) -> dict[str, object]:
    """A ``batches`` row as a read returns it; ``cells`` as ``name=(value, stamp)``."""
    row: dict[str, object] = {
        "chunk": 0,
        "log_id": log_id,
        "recipients": None,
        "email": None,
        "name": None,
        "substitutions": None,
    }
    for cell in precedence.STATE_CELLS:
        row[cell], row[precedence.stamp_column(cell)] = None, None
    for name, value in cells.items():
        if name in precedence.STATE_CELLS:
            row[name], row[precedence.stamp_column(name)] = value  # type: ignore[misc]
        else:
            row[name] = value
    return row


def chunk_row(*people: RecipientInput, **cells: object) -> dict[str, object]:
    return stored(CHUNK_ROW, recipients=encode_recipients(people), **cells)


def test_a_chunk_without_own_rows_is_its_list_with_the_chunks_state() -> None:
    rows = [chunk_row(RecipientInput(B, "Bob"), RecipientInput(A), event=("sent", 10))]
    b, a = merged_chunk(BATCH, 3, rows)
    assert (b["email"], b["name"], b["log_id"], b["chunk"]) == (B, "Bob", log_id_for(BATCH, B), 3)
    assert (a["email"], a["name"], a["substitutions"]) == (A, None, {})
    for r in (a, b):
        assert (r["event"], r["w_event"], r["own"], r["layout"]) == ("sent", 10, False, "chunk")
        assert precedence.visible(r).state == "queued"


def test_a_recipients_own_row_is_merged_with_its_chunks_row() -> None:
    mine = stored(
        log_id_for(BATCH, B),
        event=("delivered", 30),
        state=("success", 30),
        providers=({"sg": "delivered"}, [30]),
    )
    rows = [
        chunk_row(
            RecipientInput(A),
            RecipientInput(B),
            event=("sent", 10),
            providers=({"mg": "failed: 500", "sg": "sent"}, [5, 10]),
            evidence=(["c.1"], [10]),
        ),
        mine,
    ]
    a, b = merged_chunk(BATCH, 0, rows)
    assert (a["own"], a["event"], a["providers"]) == (
        False,
        "sent",
        {"mg": "failed: 500", "sg": "sent"},
    )
    assert (b["own"], b["event"], b["state"], b["w_state"]) == (True, "delivered", "success", 30)
    assert b["providers"] == {"mg": "failed: 500", "sg": "delivered"}
    assert b["evidence"] == {"c.1"}
    assert b["email"] == B and b["layout"] == "chunk"


def test_one_recipient_merges_its_own_row_over_its_chunks_without_its_address() -> None:
    mine = stored(log_id_for(BATCH, B), event=("delivered", 30), state=("success", 30))
    rows = [chunk_row(RecipientInput(A), RecipientInput(B), event=("sent", 10)), mine]
    b = merged_one(BATCH, 0, log_id_for(BATCH, B), rows)
    a = merged_one(BATCH, 0, log_id_for(BATCH, A), rows)
    assert b is not None and a is not None
    assert (b["event"], b["own"], b["email"]) == ("delivered", True, None)
    assert (a["event"], a["own"]) == ("sent", False)


def test_one_recipient_of_no_stored_chunk_is_nobody() -> None:
    assert merged_one(BATCH, 0, log_id_for(BATCH, A), []) is None


def test_an_own_row_of_no_listed_recipient_is_nobody() -> None:
    stray = stored(log_id_for(BATCH, C), event=("delivered", 30))
    rows = merged_chunk(BATCH, 0, [chunk_row(RecipientInput(A)), stray])
    assert [(r["email"], r["own"]) for r in rows] == [(A, False)]


def test_a_chunk_row_without_a_list_has_no_recipients() -> None:
    assert merged_chunk(BATCH, 0, [stored(CHUNK_ROW, event=("sent", 1))]) == []
    assert merged_chunk(BATCH, 0, []) == []


def test_a_legacy_chunk_is_its_recipient_rows_as_stored() -> None:
    """Batches stored before v2 have one row per recipient and no chunk row."""
    a = stored(log_id_for(BATCH, A), email=A, name="Ann", substitutions='{"k": "v"}')
    b = stored(log_id_for(BATCH, B), email=B, state=("queued", 1), event=("sent", 9))
    static_only = {**stored(CHUNK_ROW), "log_id": None}
    rows = merged_chunk(BATCH, 0, [a, b, static_only])
    assert [(r["email"], r["own"], r["layout"]) for r in rows] == [
        (A, True, "rows"),
        (B, True, "rows"),
    ]
    assert (rows[0]["name"], rows[0]["substitutions"]) == ("Ann", {"k": "v"})
    assert (rows[1]["substitutions"], rows[1]["event"], rows[1]["w_event"]) == ({}, "sent", 9)


# -- selections ----------------------------------------------------------------------------


def everyone(*emails: str, layout: str = "chunk") -> list[dict[str, object]]:
    return [{"log_id": log_id_for(BATCH, e), "email": e, "layout": layout} for e in emails]


def test_a_selection_of_every_recipient_of_a_chunk_row_is_whole() -> None:
    rows = everyone(A, B, C)
    chosen = Selection.of(2, rows, rows)
    assert chosen == Selection(2, tuple(log_id_for(BATCH, e) for e in (A, B, C)), whole=True)


def test_a_selection_of_some_recipients_is_by_their_own_rows() -> None:
    rows = everyone(A, B, C)
    chosen = Selection.of(0, rows, [rows[2], rows[0]])
    assert (chosen.log_ids, chosen.whole) == ((log_id_for(BATCH, C), log_id_for(BATCH, A)), False)


def test_a_selection_of_nobody_is_not_whole() -> None:
    assert Selection.of(0, everyone(A), []) == Selection(0, (), whole=False)
    assert not Selection.of(0, [], []).whole


def test_a_selection_in_a_legacy_batch_is_never_whole() -> None:
    rows = everyone(A, B, layout="rows")
    assert not Selection.of(0, rows, rows).whole
    mixed = [*everyone(A), *everyone(B, layout="rows")]
    assert not Selection.of(0, mixed, mixed).whole


def test_one_recipient_is_selected_by_its_own_row() -> None:
    assert Selection.one(4, log_id_for(BATCH, A)) == Selection(4, (log_id_for(BATCH, A),))
    assert not Selection.one(4, log_id_for(BATCH, A)).whole
