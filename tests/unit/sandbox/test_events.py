"""Outcomes by address and the event documents built from accepted mail (pure)."""

from __future__ import annotations

import pytest

from sandbox.events import Outcome, mailgun_events, outcome_at, outcome_for, sendgrid_events
from sandbox.mailgun import expand, parse_message


@pytest.mark.parametrize(
    ("address", "outcome"),
    [
        ("bounce@x.com", Outcome.BOUNCE),
        ("Bounce-42@x.com", Outcome.BOUNCE),
        ("deferred.user@x.com", Outcome.DEFER),
        ("complaint@x.com", Outcome.COMPLAINT),
        ("drop-me@x.com", Outcome.DROP),
        ("unsubscribe@x.com", Outcome.UNSUBSCRIBE),
        ("open7@x.com", Outcome.OPEN),
        ("sgdrop-3@x.com", Outcome.SENDGRID_DROP),
        ("SgDrop@x.com", Outcome.SENDGRID_DROP),
        ("sgmgdrop.9@x.com", Outcome.EARLY_DROP),
        ("alice@bounce.com", Outcome.DELIVERED),
        ("alice@x.com", Outcome.DELIVERED),
    ],
)
def test_outcome_is_chosen_by_local_part_prefix(address: str, outcome: Outcome) -> None:
    """Only the local part's prefix decides, case-insensitively."""
    assert outcome_for(address) == outcome


def test_sendgrid_reserved_keys_win_over_custom_args() -> None:
    """A custom arg named like a SendGrid field does not replace that field."""
    payload = {
        "personalizations": [{"to": [{"email": "a@x.com"}], "custom_args": {"event": "x"}}],
        "custom_args": {"email": "evil@x.com", "log_id": "l-1"},
        "categories": ["a", "b"],
    }

    events = sendgrid_events(payload, "MSGID", 1_700_000_000, 1_700_000_001)

    assert [(e["email"], e["event"]) for e in events] == [
        ("a@x.com", "processed"),
        ("a@x.com", "delivered"),
    ]
    assert events[0]["log_id"] == "l-1"
    assert events[0]["category"] == ["a", "b"]


def test_sendgrid_drops_sgdrop_for_a_reason_of_its_own() -> None:
    """``sgdrop@``: SendGrid posts processed then dropped with its spam-checker reason."""
    payload = {"personalizations": [{"to": [{"email": "sgdrop@x.com"}]}]}

    events = sendgrid_events(payload, "MSGID", 1, 2)

    assert [e["event"] for e in events] == ["processed", "dropped"]
    assert events[1]["reason"] == "Spam Content (if Spam Checker app is enabled)"


def test_mailgun_delivers_sgdrop_normally() -> None:
    """``sgdrop@``: Mailgun accepts and delivers it like any other address."""
    message = parse_message([("from", "s@x.com"), ("to", "sgdrop@x.com"), ("text", "x")])
    assert not isinstance(message, str)

    events = mailgun_events(message, "<id@mg.x.com>", "sgdrop@x.com", 1.0)

    assert [e["event"] for e in events] == ["accepted", "delivered"]


def test_sgmgdrop_is_dropped_by_sendgrid_and_mailgun_on_their_side() -> None:
    """``sgmgdrop@``: SendGrid's spam checker and Mailgun's given-up retries (both a drop
    another provider may get past)."""
    payload = {"personalizations": [{"to": [{"email": "sgmgdrop@x.com"}]}]}
    message = parse_message([("from", "s@x.com"), ("to", "sgmgdrop@x.com"), ("text", "x")])
    assert not isinstance(message, str)

    sendgrid = sendgrid_events(payload, "MSGID", 1, 2)
    mailgun = mailgun_events(message, "<id@mg.x.com>", "sgmgdrop@x.com", 1.0)

    assert [e["event"] for e in sendgrid] == ["processed", "dropped"]
    assert [(e["event"], e.get("reason")) for e in mailgun] == [
        ("accepted", None),
        ("failed", "old"),
    ]


@pytest.mark.parametrize(
    ("provider", "outcome"),
    [("sg", Outcome.EARLY_DROP), ("mg", Outcome.EARLY_DROP), ("ses", Outcome.DELIVERED)],
)
def test_an_outcome_only_some_providers_play_is_a_delivery_elsewhere(
    provider: str, outcome: Outcome
) -> None:
    assert outcome_at(provider, "sgmgdrop@x.com") == outcome
    assert outcome_at("smtp", "sgdrop@x.com") == Outcome.DELIVERED
    assert outcome_at(provider, "bounce@x.com") == Outcome.BOUNCE


def test_sendgrid_message_ids_differ_per_personalization() -> None:
    """Each personalization has its own ``sg_message_id`` under the same X-Message-Id."""
    payload = {"personalizations": [{"to": [{"email": "a@x.com"}]}, {"to": [{"email": "b@x.com"}]}]}

    events = sendgrid_events(payload, "MSGID", 1, 2)

    ids = {e["email"]: e["sg_message_id"] for e in events}
    assert ids["a@x.com"] != ids["b@x.com"]
    assert all(i.startswith("MSGID.") for i in ids.values())


def test_expand_substitutes_known_keys_only() -> None:
    """``%recipient.KEY%`` is replaced when known; unknown placeholders stay visible."""
    variables = {"id": "42", "n": 7}

    assert expand("x-%recipient.id%-%recipient.n%-%recipient.nope%", variables) == (
        "x-42-7-%recipient.nope%"
    )


def test_mailgun_events_without_recipient_variables_share_the_to_header() -> None:
    """A shared message (no recipient-variables) shows its To list and plain v: values."""
    message = parse_message(
        [
            ("from", "s@x.com"),
            ("to", "a@x.com, b@x.com"),
            ("text", "x"),
            ("v:batch_id", "b-1"),
        ]
    )
    assert not isinstance(message, str)

    events = mailgun_events(message, "<id@mg.x.com>", "b@x.com", 1.0)

    assert events[0]["message"]["headers"]["to"] == "a@x.com, b@x.com"
    assert events[0]["message"]["headers"]["message-id"] == "id@mg.x.com"
    assert events[0]["user-variables"] == {"batch_id": "b-1"}
    assert events[0]["timestamp"] < events[1]["timestamp"]
