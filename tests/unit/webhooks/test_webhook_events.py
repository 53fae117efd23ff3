"""The normalised event model and the lenient field readers the parsers share."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.core.errors import SafedelivrError
from shared.core.webhook_events import (
    KIND_RANK,
    KINDS,
    Kind,
    MalformedPayload,
    ProviderEvent,
    content_id,
    event_key,
    is_outcome,
    parse_chunk,
    parse_email,
    parse_time,
    parse_uuid,
    text,
    timestamp_fresh,
)
from tests.unit.webhooks.fixtures import provider_event

WHEN = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
OURS = uuid.UUID("6f1c2a40-0000-1000-8000-000000000001")  # ids we make are time UUIDs


def event(kind: Kind, *, provider_side: bool = False) -> ProviderEvent:
    return provider_event(kind, at=WHEN, provider_side=provider_side)


def test_every_kind_has_a_rank() -> None:
    """KIND_RANK ranks exactly the kinds of the Kind literal, each differently."""
    assert set(KIND_RANK) == set(KINDS)
    assert len(set(KIND_RANK.values())) == len(KINDS)


def test_rank_order_breaks_ties_towards_outcomes() -> None:
    """Ties go sent < deferred < delivered < opened < clicked < dropped < bounced <
    unsubscribed < complained, with unknown lowest."""
    order = sorted(KINDS, key=KIND_RANK.__getitem__)

    assert order == [
        "unknown",
        "sent",
        "deferred",
        "delivered",
        "opened",
        "clicked",
        "dropped",
        "bounced",
        "unsubscribed",
        "complained",
    ]


@pytest.mark.parametrize(
    ("kind", "outcome"),
    [
        ("delivered", True),
        ("bounced", True),
        ("dropped", True),
        ("complained", True),
        ("unsubscribed", True),
        ("sent", False),
        ("deferred", False),
        ("opened", False),
        ("clicked", False),
        ("unknown", False),
    ],
)
def test_is_outcome(kind: Kind, outcome: bool) -> None:
    """Only delivery and failure kinds settle a recipient's summary state."""
    assert is_outcome(kind) is outcome


def test_recipient_side_drop_is_final_and_failed() -> None:
    """A drop that is not the provider's fault settles the recipient as failed."""
    dropped = event("dropped")

    assert dropped.final
    assert dropped.state == "failed"


def test_provider_side_drop_settles_nothing() -> None:
    """A provider's own drop is not final: the recipient goes to another provider."""
    dropped = event("dropped", provider_side=True)

    assert not dropped.final
    assert dropped.state is None


def test_delivered_settles_success() -> None:
    """delivered settles the recipient as success."""
    assert event("delivered").state == "success"


def test_opens_are_engagement_not_outcomes() -> None:
    """An open is engagement and settles nothing."""
    opened = event("opened")

    assert opened.engagement
    assert opened.state is None
    assert not event("delivered").engagement


def test_events_are_frozen() -> None:
    """ProviderEvent is immutable."""
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'kind'"):
        event("sent").kind = "delivered"  # type: ignore[misc]


def test_malformed_payload_is_a_value_error_in_our_tree() -> None:
    """MalformedPayload is both a ValueError and one of our deliberate errors."""
    assert issubclass(MalformedPayload, ValueError)
    assert issubclass(MalformedPayload, SafedelivrError)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(" spaced ", "spaced"), ("", None), ("   ", None), (42, None), (None, None)],
)
def test_text_keeps_non_empty_strings_only(value: object, expected: str | None) -> None:
    """text strips strings and turns empty strings and non-strings into None."""
    assert text(value) == expected


def test_text_is_cut_to_its_limit() -> None:
    """Free text is cut to the limit."""
    assert text("abcdef", limit=3) == "abc"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (" Ann@Example.ORG ", "ann@example.org"),
        ("no-at-sign", None),
        ("", None),
        (["a@x.com"], None),
    ],
)
def test_parse_email(value: object, expected: str | None) -> None:
    """Addresses are stripped and lower-cased; anything without an @ is no address."""
    assert parse_email(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (str(OURS), OURS),
        (" " + str(OURS).upper(), OURS),
        ("b-123", None),
        ("", None),
        (123, None),
        (None, None),
        (str(OURS) * 3, None),
        ("6f1c2a40-0000-4000-8000-000000000001", None),  # a random UUID is none of ours
    ],
)
def test_parse_uuid(value: object, expected: uuid.UUID | None) -> None:
    """A UUID string parses; garbage, non-strings and overlong strings are None."""
    assert parse_uuid(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, 3),
        (0, 0),
        ("3", 3),
        (" 12 ", 12),
        (-1, None),
        (True, None),
        (3.0, None),
        ("3.0", None),
        ("x", None),
        ("\u0663", None),
        ("9" * 16, None),
        (None, None),
    ],
)
def test_parse_chunk(value: object, expected: int | None) -> None:
    """Chunk indexes come as ints or digit strings; anything else is None."""
    assert parse_chunk(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1_709_294_400, datetime(2024, 3, 1, 12, 0, tzinfo=UTC)),
        (1_709_294_400.25, datetime(2024, 3, 1, 12, 0, 0, 250_000, tzinfo=UTC)),
        ("1709294400", datetime(2024, 3, 1, 12, 0, tzinfo=UTC)),
    ],
)
def test_parse_time(value: object, expected: datetime) -> None:
    """Unix seconds (int, float or numeric string) become UTC-aware datetimes."""
    parsed = parse_time(value)

    assert parsed == expected
    assert parsed is not None
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "value", [None, True, "soon", "nan", "inf", 1e300, 10**30, "1" * 40, [1], {"t": 1}]
)
def test_parse_time_rejects_unusable_values(value: Any) -> None:
    """Non-numbers, booleans, non-finite and out-of-range values are None."""
    assert parse_time(value) is None


def test_event_key_formats_microseconds() -> None:
    """Dedupe keys use microsecond precision whatever the number's JSON form."""
    assert event_key(1529701969.818328) == "1529701969.818328"
    assert event_key(1529701969) == "1529701969.000000"
    assert event_key("1529701969.5") == "1529701969.500000"


@pytest.mark.parametrize("value", [None, "x", 1e300])
def test_event_key_is_none_for_unusable_timestamps(value: object) -> None:
    """No dedupe key part comes from a timestamp that is not a usable time."""
    assert event_key(value) is None


def test_content_id_ignores_key_order() -> None:
    """The same event with its keys in another order has the same content id."""
    assert content_id({"a": 1, "b": [2]}) == content_id({"b": [2], "a": 1})
    assert content_id({"a": 1}).startswith("sha256:")


def test_content_id_differs_for_different_content() -> None:
    """Different events have different content ids."""
    assert content_id({"a": 1}) != content_id({"a": 2})


@pytest.mark.parametrize(
    ("timestamp", "fresh"),
    [
        ("1000", True),
        ("700", True),
        ("1300", True),
        ("699", False),
        ("1301", False),
        (" 1000 ", True),
        ("-1000", False),
        ("1000.5", False),
        ("", False),
        ("abc", False),
        ("1" * 16, False),
    ],
)
def test_timestamp_fresh(timestamp: str, fresh: bool) -> None:
    """Integer timestamps within the tolerance either way are fresh; anything else is not."""
    assert timestamp_fresh(timestamp, now=1000.0, tolerance=300) is fresh
