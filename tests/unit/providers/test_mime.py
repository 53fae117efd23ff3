"""The SMTP transactions of a chunk (``shared.providers.mime``): envelope, headers, bodies."""

from __future__ import annotations

import base64
import email
import email.policy
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any

import pytest

from shared.core.errors import PermanentProviderError
from shared.core.models import Address, Attachment, Chunk, Recipient
from shared.providers import mime
from tests.unit.providers.fakes import chunk, recipient

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ANN = recipient("ann@example.org", "Ann", {"-first-": "Ann"})
BOB = recipient("bob@example.org", "Doe, Bob", {"-first-": "Bob"})

GOLDEN_SHARED = (
    "From: Example News <news@example.com>\r\n"
    'To: Ann <ann@example.org>, "Doe, Bob" <bob@example.org>\r\n'
    "Cc: Boss <boss@example.com>\r\n"
    "Reply-To: Help <help@example.com>\r\n"
    "Subject: =?utf-8?q?H=C3=A9llo?= -first-\r\n"
    "Date: Fri, 02 Jan 2026 03:04:05 +0000\r\n"
    "Message-ID: <6f1c2a40-0000-1000-8000-000000000001.0.c.0.0@relay.example>\r\n"
    "X-Safedelivr-Batch: 6f1c2a40-0000-1000-8000-000000000001.0\r\n"
    "X-Safedelivr-Attempt: c.0\r\n"
    "X-Campaign: spring\r\n"
    "MIME-Version: 1.0\r\n"
    "Content-Type: multipart/alternative;\r\n"
    ' boundary="=_sd_{b}"\r\n'
    "\r\n"
    "--=_sd_{b}\r\n"
    'Content-Type: text/plain; charset="utf-8"\r\n'
    "Content-Transfer-Encoding: 7bit\r\n"
    "\r\n"
    "Hi -first-\r\n"
    "\r\n"
    "--=_sd_{b}\r\n"
    'Content-Type: text/html; charset="utf-8"\r\n'
    "Content-Transfer-Encoding: 7bit\r\n"
    "MIME-Version: 1.0\r\n"
    "\r\n"
    "<p>Hi -first-</p>\r\n"
    "\r\n"
    "--=_sd_{b}--\r\n"
)


def sample(*people: Recipient, **fields: Any) -> Chunk:
    defaults: dict[str, Any] = {
        "subject": "Héllo -first-",
        "text": "Hi -first-",
        "html": "<p>Hi -first-</p>",
        "reply_to": Address(email="help@example.com", name="Help"),
        "headers": {"X-Campaign": "spring"},
    }
    made = chunk(people or (ANN, BOB), **{**defaults, **fields})
    return made.model_copy(update={"attempt": "c.0"})


def build(c: Chunk) -> list[mime.Transaction]:
    return mime.transactions("smtp", c, max_recipients=100, helo="relay.example", now=NOW)


def parsed(t: mime.Transaction) -> EmailMessage:
    message = email.message_from_bytes(t.data, policy=email.policy.SMTP)
    assert isinstance(message, EmailMessage)
    return message


def test_shared_chunk_is_one_golden_transaction() -> None:
    """A shared chunk is one transaction whose bytes are exactly the golden message."""
    [t] = build(sample(cc=[Address(email="boss@example.com", name="Boss")]))

    boundary = t.data.split(b'boundary="=_sd_')[1][:32].decode()
    assert t.data.decode() == GOLDEN_SHARED.format(b=boundary)
    assert (t.sender, t.recipients) == (
        "news@example.com",
        ("ann@example.org", "bob@example.org", "boss@example.com"),
    )


def test_the_same_chunk_gives_the_same_bytes() -> None:
    """Nothing random goes in (the boundary comes from the bodies)."""
    assert build(sample()) == build(sample())


def test_bulk_chunk_is_one_transaction_per_recipient() -> None:
    """Bulk: each recipient's own copy, substitutions, log id and Message-ID."""
    own = BOB.model_copy(update={"headers": {"List-Unsubscribe": "<https://u.example/b>"}})
    ts = build(sample(ANN, own, bulk=True))

    assert [t.recipients for t in ts] == [("ann@example.org",), ("bob@example.org",)]
    bob = parsed(ts[1])
    assert bob["Subject"] == "Héllo Bob"
    assert bob[mime.LOG_HEADER] == str(BOB.log_id) == ts[1].log_id
    assert bob["List-Unsubscribe"] == "<https://u.example/b>"
    assert parsed(ts[0])["List-Unsubscribe"] is None
    assert ts[1].message_id.endswith(".c.0.1@relay.example")


def test_bcc_is_in_the_envelope_only() -> None:
    """A bcc address gets the message but is named in no header."""
    [t] = build(sample(ANN, bcc=[Address(email="audit@example.com")]))

    assert "audit@example.com" in t.recipients
    assert b"audit@example.com" not in t.data


def test_a_custom_header_cannot_replace_ours() -> None:
    """A batch header with the name of one of ours is dropped."""
    [t] = build(sample(ANN, headers={"X-Safedelivr-Attempt": "forged", "X-Keep": "yes"}))

    message = parsed(t)
    assert message.get_all(mime.ATTEMPT_HEADER) == ["c.0"]
    assert message["X-Keep"] == "yes"


def test_reserved_header_refuses_the_chunk() -> None:
    """A reserved header never reaches a relay (the envelope check refuses the chunk)."""
    with pytest.raises(PermanentProviderError):
        build(sample(ANN, headers={"X-Mailgun-Tag": "x"}))


def test_utf8_subject_and_names_round_trip() -> None:
    """Non-ASCII subjects and display names are encoded words that decode to the text."""
    zoe = recipient("zoe@example.org", "Zoë Ünal")
    [t] = build(sample(zoe, subject="Grüße, 東京 ✓"))

    message = parsed(t)
    assert t.data.isascii()
    assert message["Subject"] == "Grüße, 東京 ✓"
    assert message["To"].addresses[0].display_name == "Zoë Ünal"


def test_html_only_is_one_html_part() -> None:
    """Without text the message is a single text/html part."""
    [t] = build(sample(ANN, text=None))

    message = parsed(t)
    assert message.get_content_type() == "text/html"
    assert "<p>Hi Ann</p>" in message.get_content()


def test_too_many_recipients_refuse_the_chunk() -> None:
    """More recipients than the relay takes per transaction refuse the chunk."""
    people = [recipient(f"p{n}@example.org") for n in range(3)]
    with pytest.raises(PermanentProviderError):
        mime.transactions("smtp", sample(*people), max_recipients=2, helo="h", now=NOW)


def test_files_are_parts_of_the_message_and_inline_ones_join_the_html() -> None:
    logo = Attachment(
        filename="logo.png",
        content_type="image/png",
        content=base64.b64encode(b"\x89PNG").decode(),
        disposition="inline",
        content_id="logo@example.com",
    )
    report = Attachment(
        filename="Zoë report.pdf",
        content_type="application/pdf",
        content=base64.b64encode(b"%PDF" * 100).decode(),
    )
    c = sample(ANN)
    files = c.model_copy(
        update={"message": c.message.model_copy(update={"attachments": (logo, report)})}
    )

    (t,) = build(files)
    again = build(files)[0]
    message = parsed(t)

    assert t.data == again.data  # the same chunk, the same bytes
    assert message.get_content_type() == "multipart/mixed"
    html = message.get_body(("html",))
    assert html is not None and html.get_content().strip() == "<p>Hi Ann</p>"
    parts = {p.get_filename(): p for p in message.iter_attachments()}
    assert parts["Zoë report.pdf"].get_content() == b"%PDF" * 100
    related = [p for p in message.walk() if p.get_content_type() == "multipart/related"]
    assert len(related) == 1
    (image,) = [p for p in related[0].iter_parts() if p.get_content_type() == "image/png"]
    assert image["Content-ID"] == "<logo@example.com>"
    assert image.get_content() == b"\x89PNG"
