"""Every parser of untrusted text gets through a megabyte of adversarial repetition (the
shapes that make backtracking regexes, nested scans and repeated concatenation quadratic)
and answers it: a value or a refusal, never another error.

No test here reads a clock: how the time grows with the input is a figure, measured by
`make hostile` at 1x and 10x of these same shapes. What a test can still see without a clock
is a parser that never finishes: a quadratic one takes about 17 minutes for 1 MB, far past
the suite's per-test timeout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.api import original_form
from services.api.queries import decode_cursor
from shared.core import addresses, webhook_events
from shared.delivery import validation
from shared.infra.http import ApiError
from shared.providers import mailgun_events, sendgrid_events

MEGABYTE = 1024 * 1024

# The characters parsers branch on: encoded-word delimiters, quotes, escapes, brackets,
# separators and whitespace.
SPECIALS = '=?qQbB<>"\\(),@.:;[] \t_-éa0'
units = st.text(alphabet=SPECIALS, min_size=1, max_size=16)

KNOWN_BAD = [
    "=?a?q? ",  # an encoded-word head without an end: the lazy ".*?" rescanned the rest
    "=?utf-8?q?x?= ",  # adjacent encoded-words: their bytes were joined by repeated +=
    '"a\\"',
    "((",
    "<<",
    "=?",
]

TEXT_PARSERS: dict[str, Callable[[str], object]] = {
    "text_problem": addresses.text_problem,
    "split_address_list": addresses.split_address_list,
    "parse_address": addresses.parse_address,
    "address_key": addresses.address_key,
    "normalize_email": addresses.normalize_email,
    "display_name": addresses.display_name,
    "webhook text": webhook_events.text,
    "parse_email": webhook_events.parse_email,
    "parse_uuid": webhook_events.parse_uuid,
    "parse_tag": webhook_events.parse_tag,
    "parse_chunk": webhook_events.parse_chunk,
    "parse_time": webhook_events.parse_time,
    "event_key": webhook_events.event_key,
    "original is_email": original_form.is_email,
    "decode_cursor": decode_cursor,
}


def _megabyte(unit: str) -> str:
    return unit * (MEGABYTE // len(unit.encode()) + 1)


def _answers(parse: Callable[[str], object], text: str) -> bool:
    with contextlib.suppress(ValueError, ApiError):  # refusing is an answer
        parse(text)
    return True


@pytest.mark.parametrize("name", sorted(TEXT_PARSERS))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unit=units)
@example(unit=KNOWN_BAD[0])
@example(unit=KNOWN_BAD[1])
@example(unit=KNOWN_BAD[2])
def test_a_megabyte_of_repetition_is_answered(name: str, unit: str) -> None:
    assert _answers(TEXT_PARSERS[name], _megabyte(unit))


@pytest.mark.parametrize("unit", KNOWN_BAD)
def test_an_encoded_word_check_of_a_megabyte_is_answered(unit: str) -> None:
    assert _answers(addresses.text_problem, _megabyte(unit))


def test_header_injection_is_still_found_at_the_end_of_a_megabyte() -> None:
    text = "=?a?q? " * (MEGABYTE // 7) + "=?utf-8?q?a=0Ab?="

    problem = addresses.text_problem(text)

    assert problem is not None and problem.injection


def test_adjacent_encoded_words_are_still_joined_before_they_are_checked() -> None:
    # CR and LF split across two words only make a line break once decoders join them.
    problem = addresses.text_problem("=?utf-8?q?a=0D?= =?utf-8?q?=0Ab?=")

    assert problem is not None and problem.injection


def test_encoded_text_may_hold_a_question_mark_as_decoders_allow() -> None:
    problem = addresses.text_problem("=?utf-8?q?a?b=0A?=")

    assert problem is not None and problem.injection


def test_a_quadratic_codec_named_as_the_charset_is_not_used() -> None:
    # punycode's decoder is quadratic; a hostile label must not select it: its words are
    # read as UTF-8, where punycode would have decoded "bcher-kva" to "bücher".
    assert addresses._decode_charset(b"bcher-kva", "punycode") == "bcher-kva"


@given(unit=units)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(unit=KNOWN_BAD[1])
def test_a_megabyte_webhook_body_of_repetition_is_answered(unit: str) -> None:
    body = orjson.dumps([{"email": _megabyte(unit), "event": unit, "sg_event_id": unit}])

    sendgrid_events.parse_events(body)
    with pytest.raises(webhook_events.MalformedPayload):
        mailgun_events.parse_envelope(body)  # a list is not Mailgun's envelope


@given(unit=units)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(unit=KNOWN_BAD[0])
def test_a_batch_with_megabyte_fields_is_refused(unit: str) -> None:
    big = _megabyte(unit)
    body = {
        "from": big,
        "reply_to": big,
        "subject": big,
        "html": big,
        "to": [{"email": big, "name": big}],
        "headers": {"X-Note": big},
    }

    with pytest.raises(validation.InvalidRequest):
        validation.parse_batch_request(body, max_recipients=10)


def test_a_batch_with_many_recipients_is_validated_off_the_event_loop() -> None:
    entries = [{"email": f"r{i}@example.com"} for i in range(validation.LARGE_RECIPIENT_ENTRIES)]

    assert not validation.is_large({"to": entries})
    assert validation.is_large({"to": entries, "cc": ["c@example.com"]})


def test_a_batch_with_a_large_body_text_is_validated_off_the_event_loop() -> None:
    assert validation.is_large({"to": [], "html": "x" * (validation.LARGE_TEXT_LENGTH + 1)})
    assert not validation.is_large({"to": [], "html": "x" * validation.LARGE_TEXT_LENGTH})


@pytest.mark.parametrize("body", [None, [], "text", {"to": "not a list", "html": 5}])
def test_a_body_of_the_wrong_shape_is_not_large(body: object) -> None:
    assert not validation.is_large(body)


def test_a_batch_with_large_substitutions_is_validated_off_the_event_loop() -> None:
    """Substitution values count: 4 recipients with 10 KB values each make a large body
    (1,000 of them kept the loop busy for seconds), 4 with short ones do not."""
    big = [{"email": f"r{i}@example.com", "substitutions": {"-v-": "x" * 10_000}} for i in range(4)]
    small = [{"email": f"r{i}@example.com", "substitutions": {"-v-": "x"}} for i in range(4)]

    assert validation.is_large({"to": big})
    assert not validation.is_large({"to": small})


def test_a_batch_with_many_substitution_keys_is_validated_off_the_event_loop() -> None:
    """Each substitution counts for its checks: 1,000 recipients with 100 short keys each
    make a large body though no text in it is long."""
    entries = [
        {"email": f"r{i}@example.com", "substitutions": {f"k{j}": "v" for j in range(100)}}
        for i in range(validation.LARGE_RECIPIENT_ENTRIES)
    ]

    assert validation.is_large({"to": entries})


def test_a_substitution_map_over_its_limit_is_large_without_being_read() -> None:
    """A map with more keys than allowed makes the body large (validation refuses it)."""
    entry = {"email": "r@example.com", "substitutions": dict.fromkeys(map(str, range(101)), "")}

    assert validation.is_large({"to": [entry]})
