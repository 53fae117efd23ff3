"""Properties of the webhook parsers (``shared.providers.sendgrid_events``,
``shared.providers.mailgun_events`` over ``shared.core.webhook_events``) under hostile input.

Whatever bytes arrive, the parsers either answer or raise their documented
:class:`~shared.core.webhook_events.MalformedPayload`; garbage never becomes an event; every event
they do produce is well formed whatever types its fields had; well-formed events round-trip
our correlation ids; and parsing a 1 MB hostile body takes time linear in its size.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.hostile.cases import SENDGRID_SHAPES, mailgun_fields_body
from services.webhooks.receivers import MAILGUN_MAX_BODY
from shared.core.models import ATTEMPT_ARG
from shared.core.webhook_events import KINDS, MAX_TEXT, MalformedPayload, ParseResult, ProviderEvent
from shared.providers import mailgun_events, sendgrid_events

#: Fixed so that two parses of one body are comparable.
RECEIVED_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
MB = 1 << 20

FUZZ = settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
#: For properties over whole arrays of generated objects, which are slower to generate.
FUZZ_ARRAYS = settings(FUZZ, max_examples=50)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
json_objects = st.dictionaries(st.text(max_size=12), json_values, max_size=5)
#: Anything an ``email`` / ``recipient`` field may hold that is not a plausible address.
not_an_address = json_values.filter(lambda v: not (isinstance(v, str) and "@" in v))
addresses = st.builds(
    "{}@{}.example".format,
    st.from_regex(r"[A-Za-z0-9._+-]{1,20}", fullmatch=True),
    st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True),
)
tags = st.builds("{}.{}".format, st.sampled_from("cr"), st.integers(0, 10_000))
unix_seconds = st.integers(min_value=0, max_value=4_102_444_800)  # 1970..2100

_TAG = re.compile(r"[cr]\.[0-9]+")


def assert_well_formed(event: ProviderEvent) -> None:
    """What every consumer of a ProviderEvent relies on, whatever the provider sent."""
    assert event.provider in (sendgrid_events.CODE, mailgun_events.CODE)
    assert event.kind in KINDS
    assert isinstance(event.event_id, str)
    assert event.event_id
    assert "@" in event.email
    assert event.occurred_at.tzinfo is not None
    assert event.batch_id is None or isinstance(event.batch_id, uuid.UUID)
    assert event.log_id is None or isinstance(event.log_id, uuid.UUID)
    assert event.chunk is None or (type(event.chunk) is int and event.chunk >= 0)
    assert event.attempt is None or _TAG.fullmatch(event.attempt)
    # Mailgun puts the SMTP code before its (capped) words, hence the margin.
    assert event.reason is None or 0 < len(event.reason) <= MAX_TEXT + 24
    assert event.message_id is None or isinstance(event.message_id, str)
    assert event.url is None or event.kind == "clicked"
    assert not (event.provider_side and event.suppress)


def sendgrid_parse(body: bytes) -> ParseResult:
    return sendgrid_events.parse_events(body, received_at=RECEIVED_AT)


# -- arbitrary bytes and arbitrary JSON -------------------------------------------------------


@FUZZ
@given(st.binary(max_size=600))
def test_sendgrid_arbitrary_bytes_parse_or_raise_malformed_payload(body: bytes) -> None:
    """No byte string makes the SendGrid parser raise anything but MalformedPayload."""
    try:
        result = sendgrid_parse(body)
    except MalformedPayload:
        return
    for event in result.events:
        assert_well_formed(event)


@FUZZ
@given(st.binary(max_size=600))
def test_mailgun_arbitrary_bytes_parse_or_raise_malformed_payload(body: bytes) -> None:
    """No byte string makes the Mailgun envelope parser raise anything but MalformedPayload."""
    try:
        envelope = mailgun_events.parse_envelope(body)
    except MalformedPayload:
        return
    assert envelope.body_hash == hashlib.sha256(body).digest()


@FUZZ
@given(st.data())
def test_a_corrupted_valid_delivery_parses_or_is_malformed(data: st.DataObject) -> None:
    """Splicing random bytes into a real delivery never gets past the two outcomes."""
    body = orjson.dumps([{"email": "a@x.com", "event": "bounce", "sg_event_id": "e", "chunk": 1}])
    start = data.draw(st.integers(0, len(body)), label="start")
    end = data.draw(st.integers(start, len(body)), label="end")
    corrupted = body[:start] + data.draw(st.binary(max_size=12), label="splice") + body[end:]
    try:
        result = sendgrid_parse(corrupted)
    except MalformedPayload:
        return
    for event in result.events:
        assert_well_formed(event)


@FUZZ
@given(
    json_values.filter(lambda v: not (isinstance(v, list) and all(isinstance(i, dict) for i in v)))
)
def test_sendgrid_json_other_than_an_array_of_objects_is_malformed(value: Any) -> None:
    """Scalars, objects, and arrays holding anything but objects are refused as a whole."""
    with pytest.raises(MalformedPayload):
        sendgrid_parse(orjson.dumps(value))


@FUZZ
@given(json_values.filter(lambda v: not isinstance(v, dict)))
def test_mailgun_json_other_than_an_object_is_malformed(value: Any) -> None:
    """A Mailgun body must be one JSON object."""
    with pytest.raises(MalformedPayload):
        mailgun_events.parse_envelope(orjson.dumps(value))


# -- garbage never becomes an event -----------------------------------------------------------


@FUZZ_ARRAYS
@given(st.lists(st.tuples(json_objects, not_an_address | st.just("<absent>")), max_size=5))
def test_sendgrid_objects_without_a_plausible_address_are_only_counted(
    items: list[tuple[dict[str, Any], object]],
) -> None:
    """Whatever else they hold, objects whose ``email`` is absent, not a string or has no @
    produce no event; each is counted as skipped."""
    objects = []
    for fields, email in items:
        obj = {k: v for k, v in fields.items() if k != "email"}
        if email != "<absent>":
            obj["email"] = email
        objects.append(obj)

    result = sendgrid_parse(orjson.dumps(objects))

    assert (result.events, result.skipped) == ((), len(objects))


@FUZZ
@given(json_objects, not_an_address | st.just("<absent>"))
def test_mailgun_event_data_without_a_plausible_recipient_is_no_event(
    fields: dict[str, Any], recipient: object
) -> None:
    """``event-data`` without a usable ``recipient`` is no event, whatever else it says."""
    data = {k: v for k, v in fields.items() if k != "recipient"}
    if recipient != "<absent>":
        data["recipient"] = recipient

    assert mailgun_events.parse_event(data, received_at=RECEIVED_AT) is None


@FUZZ_ARRAYS
@given(st.lists(st.one_of(json_objects, st.builds(dict, email=addresses)), max_size=8))
def test_sendgrid_every_item_is_either_an_event_or_skipped(items: list[dict[str, Any]]) -> None:
    """An array of objects yields one event per item with an address, the rest skipped."""
    result = sendgrid_parse(orjson.dumps(items))
    with_address = [i for i in items if isinstance(i.get("email"), str) and "@" in i["email"]]

    assert len(result.events) + result.skipped == len(items)
    assert [e.email for e in result.events] == [i["email"].strip().lower() for i in with_address]


# -- wrong types in every known field ---------------------------------------------------------

SENDGRID_FIELDS = (
    "timestamp", "event", "sg_event_id", "sg_message_id", "batch_id", "chunk", "log_id",
    ATTEMPT_ARG, "type", "reason", "status", "response", "url",
)  # fmt: skip
MAILGUN_FIELDS = (
    "event", "id", "timestamp", "severity", "reason", "delivery-status", "flags", "reject",
    "message", "user-variables", "url",
)  # fmt: skip


@FUZZ
@given(
    addresses,
    st.fixed_dictionaries({}, optional=dict.fromkeys(SENDGRID_FIELDS, json_values)),
)
def test_sendgrid_wrong_types_in_any_field_still_give_a_well_formed_event(
    email: str, fields: dict[str, Any]
) -> None:
    """With a usable address, any values in the other fields give one well-formed event
    (a garbage field becomes None or a fallback, never an exception)."""
    result = sendgrid_parse(orjson.dumps([{"email": email, **fields}]))

    (event,) = result.events
    assert_well_formed(event)
    assert event.email == email.lower()


@FUZZ
@given(
    addresses,
    st.fixed_dictionaries({}, optional=dict.fromkeys(MAILGUN_FIELDS, json_values)),
)
def test_mailgun_wrong_types_in_any_field_still_give_a_well_formed_event(
    recipient: str, fields: dict[str, Any]
) -> None:
    """The same for Mailgun's ``event-data``, nested objects included."""
    event = mailgun_events.parse_event({"recipient": recipient, **fields}, received_at=RECEIVED_AT)

    assert event is not None
    assert_well_formed(event)
    assert event.email == recipient.lower()


@FUZZ
@given(
    st.fixed_dictionaries(
        {}, optional=dict.fromkeys(("timestamp", "token", "signature"), json_values)
    )
)
def test_mailgun_envelope_signature_parts_are_non_empty_strings_or_malformed(
    signature: dict[str, Any],
) -> None:
    """The envelope hands the verifier non-empty strings (an integer timestamp as its
    digits), or refuses the body."""
    try:
        envelope = mailgun_events.parse_envelope(
            orjson.dumps({"signature": signature, "event-data": {}})
        )
    except MalformedPayload:
        return
    parts = (envelope.timestamp, envelope.token, envelope.signature)
    assert all(isinstance(p, str) and p for p in parts)
    stamp = signature["timestamp"]
    assert envelope.timestamp == (stamp if isinstance(stamp, str) else str(stamp))


# -- well-formed events round-trip ------------------------------------------------------------

SENDGRID_KINDS = {
    "processed": "sent",
    "delivered": "delivered",
    "deferred": "deferred",
    "open": "opened",
    "click": "clicked",
    "spamreport": "complained",
    "unsubscribe": "unsubscribed",
    "group_unsubscribe": "unsubscribed",
}


@FUZZ
@given(
    email=addresses,
    name=st.sampled_from(sorted(SENDGRID_KINDS)),
    stamp=unix_seconds,
    batch_id=st.uuids(version=1),
    chunk=st.integers(0, 100_000),
    chunk_as_text=st.booleans(),
    log_id=st.uuids(version=1),
    tag=tags,
    event_id=st.text("ABCDEFabcdef0123456789-_=", min_size=1, max_size=30),
    x_message_id=st.text("ABCDEFGHIJKLMNOPabcdef0123456789", min_size=1, max_size=24),
)
def test_sendgrid_well_formed_events_round_trip(
    email: str,
    name: str,
    stamp: int,
    batch_id: uuid.UUID,
    chunk: int,
    chunk_as_text: bool,
    log_id: uuid.UUID,
    tag: str,
    event_id: str,
    x_message_id: str,
) -> None:
    """What we sent as custom args comes back as the event's correlation ids."""
    item = {
        "email": email,
        "event": name,
        "timestamp": stamp,
        "sg_event_id": event_id,
        "sg_message_id": f"{x_message_id}.filter0001.16648.5515E0B88.0",
        "batch_id": str(batch_id),
        "chunk": str(chunk) if chunk_as_text else chunk,
        "log_id": str(log_id),
        ATTEMPT_ARG: tag,
    }

    (event,) = sendgrid_parse(orjson.dumps([item])).events

    assert (event.email, event.kind, event.event_id) == (
        email.lower(),
        SENDGRID_KINDS[name],
        event_id,
    )
    assert (event.batch_id, event.chunk, event.log_id, event.attempt) == (
        batch_id,
        chunk,
        log_id,
        tag,
    )
    assert event.occurred_at == datetime.fromtimestamp(stamp, UTC)
    assert event.message_id == x_message_id


@FUZZ
@given(
    recipient=addresses,
    stamp=unix_seconds,
    micros=st.integers(0, 999_999),
    mailgun_id=st.text("ABCDEFGHabcdefgh0123456789", min_size=1, max_size=22),
    batch_id=st.uuids(version=1),
    chunk=st.integers(0, 100_000),
    log_id=st.uuids(version=1),
    tag=tags,
)
def test_mailgun_well_formed_events_round_trip(
    recipient: str,
    stamp: int,
    micros: int,
    mailgun_id: str,
    batch_id: uuid.UUID,
    chunk: int,
    log_id: uuid.UUID,
    tag: str,
) -> None:
    """``v:`` variables come back from ``user-variables``; the dedupe key is id and time."""
    timestamp = stamp + micros / 1e6
    data = {
        "event": "delivered",
        "id": mailgun_id,
        "timestamp": timestamp,
        "recipient": recipient,
        "message": {"headers": {"message-id": f"<{mailgun_id}@mg.example.org>"}},
        "user-variables": {
            "batch_id": str(batch_id),
            "chunk": str(chunk),
            "log_id": str(log_id),
            ATTEMPT_ARG: tag,
        },
    }
    body = orjson.dumps(
        {"signature": {"timestamp": "1", "token": "t", "signature": "s"}, "event-data": data}
    )

    event = mailgun_events.parse_event(mailgun_events.parse_envelope(body).event_data)

    assert event is not None
    assert (event.email, event.kind) == (recipient.lower(), "delivered")
    assert (event.batch_id, event.chunk, event.log_id, event.attempt) == (
        batch_id,
        chunk,
        log_id,
        tag,
    )
    assert event.event_id == f"{mailgun_id}:{timestamp:.6f}"
    assert event.message_id == f"{mailgun_id}@mg.example.org"


@FUZZ_ARRAYS
@given(
    st.lists(json_objects | st.builds(dict, email=addresses), max_size=6),
    st.lists(json_objects | st.builds(dict, email=addresses), max_size=6),
)
def test_sendgrid_one_delivery_parses_as_its_parts(
    first: list[dict[str, Any]], second: list[dict[str, Any]]
) -> None:
    """How SendGrid batches events into POSTs changes nothing about the events themselves."""
    whole = sendgrid_parse(orjson.dumps(first + second))
    parts = [sendgrid_parse(orjson.dumps(first)), sendgrid_parse(orjson.dumps(second))]

    assert whole.events == parts[0].events + parts[1].events
    assert whole.skipped == parts[0].skipped + parts[1].skipped


@FUZZ
@given(addresses, json_objects.map(lambda d: {k: v for k, v in d.items() if k != "sg_event_id"}))
def test_an_id_less_sendgrid_event_keeps_its_key_in_any_key_order(
    email: str, fields: dict[str, Any]
) -> None:
    """Without sg_event_id the dedupe key is the content: re-serialised with its keys in
    another order (a redelivery through another JSON encoder) it is the same event."""
    item = {"email": email, **fields}
    reordered = dict(reversed(list(item.items())))

    (event,) = sendgrid_parse(orjson.dumps([item])).events
    (again,) = sendgrid_parse(orjson.dumps([reordered])).events

    assert event.event_id == again.event_id
    assert event.event_id.startswith("sha256:")


@FUZZ
@given(st.text("abcdef0123456789", min_size=1, max_size=22), unix_seconds, unix_seconds)
def test_mailgun_ids_are_distinct_events_only_at_distinct_times(
    mailgun_id: str, first: int, second: int
) -> None:
    """Mailgun's id is unique within a day only: same id and time is one event, same id at
    another time is another."""
    keys = [
        mailgun_events.parse_event(
            {"recipient": "a@x.com", "id": mailgun_id, "timestamp": stamp}, received_at=RECEIVED_AT
        )
        for stamp in (first, second)
    ]

    assert keys[0] is not None
    assert keys[1] is not None
    assert (keys[0].event_id == keys[1].event_id) is (first == second)


# -- limits the parsers must hold -------------------------------------------------------------


def test_nesting_past_the_decoder_limit_is_malformed_for_both_providers() -> None:
    """A body nested thousands deep is refused as malformed (not a RecursionError)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    envelope = b'{"signature": {}, "event-data": ' + deep + b"}"

    with pytest.raises(MalformedPayload):
        sendgrid_parse(deep)
    with pytest.raises(MalformedPayload):
        mailgun_events.parse_envelope(envelope)


def test_an_event_with_a_deep_field_and_an_id_parses() -> None:
    """Nesting inside an unread field does not matter while the event has its own id."""
    body = b'[{"email": "a@x.com", "sg_event_id": "e1", "x": ' + b"[" * 600 + b"]" * 600 + b"}]"

    (event,) = sendgrid_parse(body).events

    assert event.event_id == "e1"


@pytest.mark.parametrize("provider", ["sg", "mg"])
def test_an_id_less_event_nested_deep_is_parsed_or_malformed(provider: str) -> None:
    """A well-formed array of objects (or envelope) nested within the decoder's limit either
    parses or is MalformedPayload; no other exception escapes the parser."""
    deep = b"[" * 300 + b"]" * 300
    try:
        if provider == "sg":
            sendgrid_parse(b'[{"email": "a@x.com", "x": ' + deep + b"}]")
        else:
            body = b'{"signature": {"timestamp": "1", "token": "t", "signature": "s"}, '
            body += b'"event-data": {"recipient": "a@x.com", "x": ' + deep + b"}}"
            mailgun_events.parse_event(mailgun_events.parse_envelope(body).event_data)
    except MalformedPayload:
        pass


@pytest.mark.parametrize("chunk", [2**31, "9" * 15, 2**63])
def test_a_chunk_no_batch_can_have_is_none(chunk: object) -> None:
    """A chunk index beyond the int column's range is garbage, like a negative one."""
    item = {"email": "a@x.com", "sg_event_id": "e", "chunk": chunk}

    (event,) = sendgrid_parse(orjson.dumps([item])).events

    assert event.chunk is None


# -- parsing time stays linear ----------------------------------------------------------------


def _array(item: bytes, size: int) -> bytes:
    return b"[" + b",".join([item] * (size // (len(item) + 1))) + b"]"


# How long these take is `make hostile`'s to measure (bench/hostile/cases.py has each shape
# at 100 KB and 1 MB): a test here says only what the parser answers.


@pytest.mark.parametrize("shape", SENDGRID_SHAPES, ids=list(SENDGRID_SHAPES))
def test_a_1mb_hostile_sendgrid_body_is_answered_with_events_or_a_malformed_payload(
    shape: str,
) -> None:
    """Size attacks end in an answer: the items read (as events, or skipped for want of an
    address) or the MalformedPayload the receiver turns into a 400, never another
    exception."""
    body = SENDGRID_SHAPES[shape](MB)
    assert len(body) >= MB - 64

    try:
        parsed = sendgrid_parse(body)
    except MalformedPayload:
        return
    assert len(parsed.events) + parsed.skipped >= 1  # every item accounted for
    assert {event.email for event in parsed.events} <= {"a@x.com"}


def test_a_mailgun_envelope_of_many_fields_gives_its_recipient() -> None:
    """An id-less event-data of thousands of fields, near the receiver's 256 KB, parses to
    its recipient's event."""
    body = mailgun_fields_body(10)
    assert 150_000 <= len(body) <= MAILGUN_MAX_BODY

    event = mailgun_events.parse_event(mailgun_events.parse_envelope(body).event_data)

    assert event is not None
    assert event.email == "a@x.com"
