"""What each recipient of a request finds in their mailbox (``sandbox.rendered``)."""

from __future__ import annotations

from sandbox.rendered import mailgun, sendgrid


def test_sendgrid_substitutes_per_personalization_and_adds_its_headers() -> None:
    payload = {
        "from": {"email": "shop@example.com"},
        "subject": "Hi -name-",
        "headers": {"X-Campaign": "nov"},
        "content": [
            {"type": "text/plain", "value": "Dear -name-"},
            {"type": "text/html", "value": "<p>Dear -name-</p>"},
        ],
        "personalizations": [
            {
                "to": [{"email": "Ann@Example.org"}],
                "substitutions": {"-name-": "Ann"},
                "headers": {"List-Unsubscribe": "<https://u.example/1>"},
            },
            {"to": [{"email": "bob@example.org"}], "substitutions": {"-name-": "Bob"}},
        ],
    }

    ann, bob = sendgrid(payload)

    assert ann.view() == {
        "provider": "sendgrid",
        "headers": {"X-Campaign": "nov", "List-Unsubscribe": "<https://u.example/1>"},
        "subject": "Hi Ann",
        "html": "<p>Dear Ann</p>",
        "text": "Dear Ann",
    }
    assert (ann.to, bob.to, bob.subject, bob.headers) == (
        "ann@example.org",
        "bob@example.org",
        "Hi Bob",
        {"X-Campaign": "nov"},
    )


def test_mailgun_expands_recipient_variables_in_bodies_subject_and_headers() -> None:
    fields = [
        ("from", "shop@example.com"),
        ("to", "ann@example.org"),
        ("to", "bob@example.org"),
        ("subject", "Hi %recipient.name%"),
        ("html", "<a href='%recipient.link%'>x</a>"),
        ("h:List-Unsubscribe", "<%recipient.unsub%>"),
    ]
    variables = {
        "ann@example.org": {"name": "Ann", "link": "https://t/1", "unsub": "https://u/1"},
        "bob@example.org": {"name": "Bob", "link": "https://t/2", "unsub": "https://u/2"},
    }

    ann, bob = mailgun(fields, ["ann@example.org", "bob@example.org"], variables)

    assert (ann.subject, ann.html, ann.headers) == (
        "Hi Ann",
        "<a href='https://t/1'>x</a>",
        {"List-Unsubscribe": "<https://u/1>"},
    )
    assert (bob.subject, bob.text) == ("Hi Bob", None)
