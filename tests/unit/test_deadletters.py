"""The pure side of dead letters (``shared.ops.deadletters``): reading RabbitMQ's death record
whatever it holds, the archive record and its stable id, what a listing shows."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.infra.topology import dispatch_key
from shared.ops.deadletters import death_of, letter_of, line, parse_id, replayed_headers, summary

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
DIED = datetime(2026, 11, 26, 11, 0, 0, 123456, tzinfo=UTC)


def test_the_most_recent_death_is_the_one_read() -> None:
    """RabbitMQ puts the latest death first in ``x-death``."""
    headers = {
        "x-death": [
            {"reason": "rejected", "queue": "safedelivr.mg", "count": 2, "time": DIED},
            {"reason": "expired", "queue": "safedelivr.delay.5s"},
        ]
    }
    death = death_of(headers)
    assert (death.reason, death.queue, death.count, death.first_time) == (
        "rejected",
        "safedelivr.mg",
        2,
        DIED,
    )


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"x-death": None},
        {"x-death": []},
        {"x-death": ["not a table"]},
        {"x-death": [{}]},
        {"x-death": {"reason": "forged"}},
        {"x-death": 5},
        {"x-death": [{"count": True, "time": "yesterday"}]},
    ],
)
def test_an_unusable_death_record_reads_as_unknown(headers: dict[str, Any]) -> None:
    """A message published straight to the dead-letter exchange has no (or any) ``x-death``."""
    death = death_of(headers)
    assert (death.reason, death.queue, death.count, death.first_time) == ("?", "?", 0, None)


def test_a_letter_is_dated_by_its_first_death_to_the_millisecond() -> None:
    """The id and the date come from RabbitMQ's record, the same on every redelivery."""
    key = dispatch_key("sg", uuid.uuid1())
    letter = letter_of(key, "m-1", {"x-death": [{"time": DIED}]}, b"x", NOW)
    assert letter.dead_at == DIED.replace(microsecond=123000)
    assert letter.id.startswith(f"{int(DIED.timestamp() * 1000)}-")
    assert letter_of(key, "m-1", {"x-death": [{"time": DIED}]}, b"x", NOW.replace(hour=13)).id == (
        letter.id
    )


def test_letters_differing_in_anything_they_carry_have_different_ids() -> None:
    """Key, message id and body all count (a length prefix keeps "ab"+"c" from "a"+"bc")."""
    death = {"x-death": [{"time": DIED}]}
    ids = {
        letter_of(key, message_id, death, body, NOW).id
        for key, message_id, body in [
            ("sg.a", "m", b"c"),
            ("sg.a", "mc", b""),
            ("sg.am", None, b"c"),
            ("sg.a", "m", b"d"),
            ("sg.b", "m", b"c"),
        ]
    }
    assert len(ids) == 5


def test_a_letter_keeps_our_headers_and_the_applications_but_not_rabbitmqs() -> None:
    headers = {
        "x-death": [{"time": DIED}],
        "x-first-death-queue": "q",
        "x-safedelivr-received-at": "1767225600.5",
        "x-delay-tier": "5",
        "trace": b"abc",
    }
    letter = letter_of("hook.sg", None, headers, b"[]", NOW)
    assert letter.headers == {"x-safedelivr-received-at": "1767225600.5", "trace": "abc"}
    assert replayed_headers(headers).keys() == {"x-safedelivr-received-at", "trace"}


@pytest.mark.parametrize(
    "text",
    ["", "abc", "1-zz", "1795000000000-" + "g" * 24, "-" + "a" * 24, "9" * 20 + "-" + "a" * 24,
     "١٢-" + "a" * 24, "1795000000000-" + "a" * 23],
)  # fmt: skip
def test_an_id_that_is_not_ours_parses_to_nothing(text: str) -> None:
    assert parse_id(text) is None


def test_an_id_parses_back_to_its_date() -> None:
    letter = letter_of("sg.x", None, {"x-death": [{"time": DIED}]}, b"", NOW)
    assert parse_id(letter.id) == (letter.dead_at, letter.id)


@pytest.mark.parametrize(
    "died",
    [datetime(2004, 6, 28, 16, 26, 55, 699000, tzinfo=UTC),
     datetime(2004, 9, 29, 10, 49, 52, 149000, tzinfo=UTC),
     datetime(9998, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)],
)  # fmt: skip
def test_an_id_parses_back_to_its_exact_millisecond(died: datetime) -> None:
    # The first two are dates a float timestamp times 1000 truncates to the millisecond before.
    letter = letter_of("sg.x", None, {}, b"", died)
    assert parse_id(letter.id) == (died, letter.id)


def test_the_summary_names_the_job_a_dispatch_letter_carries() -> None:
    batch = uuid.uuid1()
    body = f'{{"batch_id": "{batch}", "chunk": 3, "attempt": 2}}'.encode()
    letter = letter_of(dispatch_key("mg", batch, 2), None, {}, body, NOW)
    about = summary(letter)
    assert about["kind"] == "dispatch"
    assert (about["provider"], about["attempt"], about["chunk"]) == ("mg", 2, 3)
    assert about["batch_id"] == str(batch)
    assert about["bytes"] == len(body)


def test_the_summary_of_a_webhook_delivery_names_its_provider() -> None:
    about = summary(letter_of("hook.sg", None, {}, b"\xff not json", NOW))
    assert (about["kind"], about["provider"]) == ("webhook", "sg")
    assert about["preview"].endswith("not json")


def test_a_long_body_is_cut_in_the_listing_line() -> None:
    text = line(letter_of("batch.1", None, {}, b"a" * 119 + b"Z" + b"b" * 5000, NOW))
    assert text.endswith("body=b'" + "a" * 119 + "Z'")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.text(max_size=60),
    body=st.binary(max_size=400),
    headers=st.dictionaries(
        st.text(max_size=20),
        st.none() | st.integers() | st.text(max_size=20) | st.binary(max_size=20) | st.floats(),
        max_size=4,
    ),
    deaths=st.lists(
        st.dictionaries(
            st.sampled_from(["reason", "queue", "count", "time"]),
            st.text(max_size=20) | st.integers() | st.datetimes(timezones=st.just(UTC)),
        ),
        max_size=3,
    ),
)
def test_any_message_makes_a_letter_with_a_parseable_id_and_one_listing_line(
    key: str, body: bytes, headers: dict[str, Any], deaths: list[dict[str, Any]]
) -> None:
    """Whatever a dead letter holds, it is archived: nothing here may raise."""
    letter = letter_of(key, None, {**headers, "x-death": deaths}, body, NOW)
    assert parse_id(letter.id) is not None
    assert "\n" not in line(letter).removeprefix(letter.id)
    assert summary(letter)["bytes"] == len(body)
