"""The SendGrid v3 Mail Send body built from a chunk (no network)."""

from __future__ import annotations

import pytest

from shared.core.errors import PermanentProviderError
from shared.core.models import Address
from shared.providers.sendgrid import MAX_CATEGORIES, build_payload
from tests.unit.providers.fakes import BATCH_ID, chunk, recipient

ANN = recipient("ann@example.org", "Ann", {"-first-": "Ann"})
BOB = recipient("bob@example.org", None, {"-first-": "Bob"})


def test_sender_subject_and_content() -> None:
    """from, subject and both contents are set, text/plain first."""
    payload = build_payload(chunk(text="Hi -first-", html="<p>Hi -first-</p>"))

    assert payload["from"] == {"email": "news@example.com", "name": "Example News"}
    assert payload["subject"] == "Hello"
    assert payload["content"] == [
        {"type": "text/plain", "value": "Hi -first-"},
        {"type": "text/html", "value": "<p>Hi -first-</p>"},
    ]


def test_html_only_content() -> None:
    """A message with only html sends one text/html content."""
    payload = build_payload(chunk(html="<b>x</b>"))

    assert payload["content"] == [{"type": "text/html", "value": "<b>x</b>"}]


def test_sender_without_name() -> None:
    """A sender without a name is just its address."""
    payload = build_payload(chunk(sender=Address(email="a@example.com")))

    assert payload["from"] == {"email": "a@example.com"}


def test_bulk_has_one_personalization_per_recipient() -> None:
    """bulk: each recipient gets its own personalization with its name and substitutions."""
    payload = build_payload(chunk([ANN, BOB], bulk=True))

    assert [p["to"] for p in payload["personalizations"]] == [
        [{"email": "ann@example.org", "name": "Ann"}],
        [{"email": "bob@example.org"}],
    ]
    assert [p["substitutions"] for p in payload["personalizations"]] == [
        {"-first-": "Ann"},
        {"-first-": "Bob"},
    ]


def test_bulk_custom_args_carry_log_ids() -> None:
    """bulk: every personalization carries batch_id, chunk and its recipient's log_id."""
    payload = build_payload(chunk([ANN, BOB], index=3, bulk=True))

    assert [p["custom_args"] for p in payload["personalizations"]] == [
        {"batch_id": str(BATCH_ID), "chunk": "3", "log_id": str(ANN.log_id)},
        {"batch_id": str(BATCH_ID), "chunk": "3", "log_id": str(BOB.log_id)},
    ]


def test_shared_has_one_personalization_for_everyone() -> None:
    """shared: one personalization whose to lists every recipient, in order."""
    payload = build_payload(chunk([ANN, BOB]))

    assert len(payload["personalizations"]) == 1
    assert payload["personalizations"][0]["to"] == [
        {"email": "ann@example.org", "name": "Ann"},
        {"email": "bob@example.org"},
    ]


def test_shared_custom_args_have_no_log_id() -> None:
    """shared: custom_args are batch_id and chunk only (one message, many logs)."""
    payload = build_payload(chunk([ANN, BOB], index=1))

    assert payload["personalizations"][0]["custom_args"] == {
        "batch_id": str(BATCH_ID),
        "chunk": "1",
    }


def test_shared_keeps_only_common_substitutions() -> None:
    """shared: substitutions that differ between recipients are left out."""
    people = [
        recipient("a@example.org", substitutions={"-first-": "A", "-team-": "red"}),
        recipient("b@example.org", substitutions={"-first-": "B", "-team-": "red"}),
    ]

    payload = build_payload(chunk(people))

    assert payload["personalizations"][0]["substitutions"] == {"-team-": "red"}


def test_shared_cc_and_bcc_on_chunk_zero() -> None:
    """shared chunk 0 carries cc and bcc on its personalization."""
    payload = build_payload(
        chunk(
            [ANN],
            cc=[Address(email="boss@example.com", name="Boss")],
            bcc=[Address(email="audit@example.com")],
        )
    )

    personalization = payload["personalizations"][0]
    assert personalization["cc"] == [{"email": "boss@example.com", "name": "Boss"}]
    assert personalization["bcc"] == [{"email": "audit@example.com"}]


def test_no_cc_on_later_chunks() -> None:
    """Chunks after the first carry no cc/bcc."""
    payload = build_payload(chunk([ANN], index=1, cc=[Address(email="boss@example.com")]))

    assert "cc" not in payload["personalizations"][0]


def test_reply_to_headers_and_categories() -> None:
    """reply_to, custom headers and categories (in order) are top-level fields."""
    payload = build_payload(
        chunk(
            reply_to=Address(email="help@example.com", name="Help Desk"),
            headers={"X-Campaign": "spring", "List-Unsubscribe": "<mailto:u@example.com>"},
            categories=["news", "spring"],
        )
    )

    assert payload["reply_to"] == {"email": "help@example.com", "name": "Help Desk"}
    assert payload["headers"] == {
        "X-Campaign": "spring",
        "List-Unsubscribe": "<mailto:u@example.com>",
    }
    assert payload["categories"] == ["news", "spring"]


def test_categories_are_capped_at_ten() -> None:
    """Only SendGrid's maximum of 10 categories is sent, the first ones."""
    names = [f"c{i}" for i in range(12)]

    payload = build_payload(chunk(categories=names))

    assert payload["categories"] == names[:MAX_CATEGORIES]


def test_metadata_is_not_sent() -> None:
    """Metadata stays with the batch: it appears nowhere in the payload."""
    payload = build_payload(chunk(metadata={"order": "A-17"}))

    assert "A-17" not in repr(payload)


def test_name_with_comma_is_passed_verbatim() -> None:
    """SendGrid takes names as JSON fields, so punctuation needs no quoting."""
    payload = build_payload(chunk([recipient("x@example.org", 'Doe, "J"')]))

    assert payload["personalizations"][0]["to"] == [{"email": "x@example.org", "name": 'Doe, "J"'}]


def test_content_with_api_key_is_refused() -> None:
    """The sendgrid helper's API-key guard becomes a PermanentProviderError."""
    with pytest.raises(PermanentProviderError, match="API key"):
        build_payload(chunk(text="SG.abcdefABCDEF.ghijklGHIJKL1234"))


def test_invalid_chunk_is_refused_before_building() -> None:
    """The envelope rules apply: bulk with cc raises with provider code sg."""
    with pytest.raises(PermanentProviderError) as caught:
        build_payload(chunk(bulk=True, cc=[Address(email="boss@example.com")]))

    assert caught.value.provider == "sg"


def test_shared_to_drops_repeated_addresses() -> None:
    """A repeated address (any case) appears once in to, the first one kept."""
    people = [recipient("a@example.org", "First"), recipient("A@Example.org", "Second")]

    payload = build_payload(chunk(people))

    assert payload["personalizations"][0]["to"] == [{"email": "a@example.org", "name": "First"}]
