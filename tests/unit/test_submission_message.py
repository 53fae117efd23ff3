"""A message handed over by SMTP as the batch it becomes (``services.submission.message``), and
the SMTP reply for the API's answer (``services.submission.server.reply_to``)."""

from __future__ import annotations

from email.message import EmailMessage
from typing import Any

import orjson
import pytest

from services.submission.message import Refused, Submission, batch_of
from services.submission.server import reply_to


def _raw(**headers: str) -> bytes:
    message = EmailMessage()
    for name, value in {"From": "Shop <shop@example.com>", "Subject": "Hi", **headers}.items():
        message[name.replace("_", "-")] = value
    message.set_content("Hello there")
    return bytes(message)


def _body(submission: Submission) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(submission.body)
    return body


def test_one_recipient_gets_a_copy_of_their_own_with_the_message_s_parts() -> None:
    submission = batch_of(_raw(To="Ann <ann@example.org>", Reply_To="help@example.com"),
                          ["Ann@Example.org"])  # fmt: skip
    body = _body(submission)
    assert body["from"] == "Shop <shop@example.com>"
    assert (body["to"], body["subject"], body["reply_to"]) == (
        ["ann@example.org"], "Hi", "help@example.com",
    )  # fmt: skip
    assert body["text"] == "Hello there\n"
    assert "shared" not in body and "html" not in body


def test_the_envelope_decides_who_receives_and_the_headers_who_is_seen() -> None:
    raw = _raw(To="a@x.org, b@x.org", Cc="c@x.org")
    body = _body(batch_of(raw, ["a@x.org", "b@x.org", "c@x.org", "hidden@x.org"]))
    assert (body["to"], body["cc"], body["bcc"], body["shared"]) == (
        ["a@x.org", "b@x.org"], ["c@x.org"], ["hidden@x.org"], True,
    )  # fmt: skip


def test_a_header_naming_nobody_of_the_envelope_gives_each_their_own_copy() -> None:
    body = _body(batch_of(_raw(To="undisclosed-recipients:;"), ["a@x.org", "b@x.org"]))
    assert body["to"] == ["a@x.org", "b@x.org"] and "shared" not in body


def test_cc_alone_becomes_to() -> None:
    body = _body(
        batch_of(_raw(To="list@lists.x.org", Cc="a@x.org, b@x.org"), ["a@x.org", "b@x.org"])
    )
    assert (body["to"], body.get("cc"), body["shared"]) == (["a@x.org", "b@x.org"], None, True)


def test_the_message_id_and_its_recipients_are_the_idempotency_key() -> None:
    """The same message to the same people is one batch; its other recipients, sent in a
    transaction of their own (after a 452), make another."""
    raw = _raw(Message_ID="<abc.123@host.example>")
    first = batch_of(raw, ["a@x.org", "b@x.org"]).idempotency_key
    assert first is not None and first.startswith("smtp:")
    assert batch_of(raw, ["B@x.org", "a@x.org"]).idempotency_key == first
    assert batch_of(raw, ["c@x.org"]).idempotency_key not in (None, first)
    assert batch_of(_raw(), ["a@x.org"]).idempotency_key is None


def test_a_display_name_with_a_comma_is_quoted_as_the_api_reads_it() -> None:
    body = _body(batch_of(_raw(From='"Doe, John" <john@example.com>'), ["a@x.org"]))
    assert body["from"] == '"Doe, John" <john@example.com>'


def test_a_header_the_parser_cannot_read_is_a_refusal_not_a_crash() -> None:
    with pytest.raises(Refused) as refused:
        batch_of(b"From: a@x.org\r\nSubject: s\r\nMessage-ID: <[>\r\n\r\nhi\r\n", ["a@x.org"])
    assert refused.value.reply.startswith("554 5.6.0")


def test_a_refusal_is_one_line_whatever_the_message_carries() -> None:
    raw = (
        b"From: a@x.org\r\nSubject: s\r\nContent-Type: text/plain; "
        b"charset*=us-ascii''x%0D%0A250%20fake\r\n\r\nhi\r\n"
    )
    with pytest.raises(Refused) as refused:
        batch_of(raw, ["a@x.org"])
    assert "\r" not in refused.value.reply and "\n" not in refused.value.reply
    assert refused.value.reply.startswith("554 5.6.3")


def test_x_headers_pass_once_each_and_the_rest_are_ours_to_write() -> None:
    raw = _raw(X_Campaign="spring", X_Mailgun_Tag="no", Date="Mon, 30 Nov 2026 10:00:00 +0000")
    raw = raw.replace(b"X-Campaign: spring", b"X-Campaign: spring\nx-campaign: autumn")
    assert _body(batch_of(raw, ["a@x.org"]))["headers"] == {"X-Campaign": "spring"}


def test_html_and_text_alternatives_are_both_kept() -> None:
    message = EmailMessage()
    message["From"], message["Subject"] = "shop@example.com", "Hé"
    message.set_content("plain")
    message.add_alternative("<p>html</p>", subtype="html")
    body = _body(batch_of(bytes(message), ["a@x.org"]))
    assert (body["subject"], body["text"], body["html"]) == ("Hé", "plain\n", "<p>html</p>\n")


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (_raw(From="a@x.org, b@x.org"), "550 5.1.7"),
        (b"From: a@x.org\r\nSubject: s\r\nContent-Type: application/pdf\r\n\r\nxx", "554 5.6.0"),
        (
            b"From: a@x.org\r\nSubject: s\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n"
            b"--b\r\nContent-Type: image/png\r\n\r\nxx\r\n--b--\r\n",
            "554 5.6.0",
        ),
        (
            b"From: a@x.org\r\nSubject: s\r\nContent-Type: text/plain; charset=nope\r\n\r\nxx",
            "554 5.6.3",
        ),
    ],
    ids=["two-senders", "only-a-file", "only-an-attachment", "charset"],
)
def test_a_message_that_cannot_become_a_batch_is_refused_with_a_reason(
    raw: bytes, code: str
) -> None:
    with pytest.raises(Refused) as refused:
        batch_of(raw, ["a@x.org"])
    assert refused.value.reply.startswith(code)


def test_an_invitation_is_refused_not_dropped() -> None:
    message = EmailMessage()
    message["From"], message["Subject"] = "shop@example.com", "Meeting"
    message.set_content("see the invitation")
    message.add_alternative("BEGIN:VCALENDAR\nEND:VCALENDAR\n", subtype="calendar")
    with pytest.raises(Refused, match=r"5\.6\.1"):
        batch_of(bytes(message), ["a@x.org"])


def test_an_idempotency_key_still_being_stored_is_a_try_again() -> None:
    answer = {"error": {"code": "idempotency_in_progress", "message": "in progress"}}
    assert reply_to(409, answer).startswith("451 4.3.0")


def _body_of(message: EmailMessage) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(batch_of(bytes(message), ["a@x.org"]).body)
    return body


def test_attachments_are_kept_with_their_name_type_and_bytes() -> None:
    message = EmailMessage()
    message["From"], message["Subject"] = "shop@example.com", "Invoice"
    message.set_content("see attached")
    message.add_attachment(b"%PDF", maintype="application", subtype="pdf", filename="i.pdf")
    message.add_attachment(b"a,b\n", maintype="text", subtype="csv", filename="C:\\x\\t.csv")
    body = _body_of(message)
    assert body["text"] == "see attached\n"
    assert body["attachments"] == [
        {"filename": "i.pdf", "content_type": "application/pdf", "content": "JVBERg=="},
        {"filename": "t.csv", "content_type": "text/csv", "content": "YSxiCg=="},
    ]


def test_an_inline_image_keeps_its_content_id() -> None:
    message = EmailMessage()
    message["From"], message["Subject"] = "shop@example.com", "Logo"
    message.set_content("logo below")
    message.add_alternative('<img src="cid:logo@x">', subtype="html")
    html = message.get_body(preferencelist=("html",))
    assert html is not None
    html.add_related(b"\x89PNG", maintype="image", subtype="png", cid="<logo@x>")
    body = _body_of(message)
    assert body["html"] == '<img src="cid:logo@x">\n'
    assert body["attachments"] == [
        {
            "filename": "attachment-1.png",
            "content_type": "image/png",
            "content": "iVBORw==",
            "disposition": "inline",
            "content_id": "logo@x",
        }
    ]


def test_a_forwarded_message_is_refused_not_dropped() -> None:
    inner = EmailMessage()
    inner["From"], inner["Subject"] = "b@x.org", "fwd"
    inner.set_content("inner")
    message = EmailMessage()
    message["From"], message["Subject"] = "shop@example.com", "Fwd"
    message.set_content("see below")
    message.add_attachment(inner)
    with pytest.raises(Refused, match=r"554 5\.6\.1 .*forwarded message"):
        batch_of(bytes(message), ["a@x.org"])


@pytest.mark.parametrize(
    ("status", "code"),
    [(202, "250 2.0.0 queued as b1"), (401, "554 5.7.8"), (403, "550 5.7.1"), (409, "550 5.7.0"),
     (413, "552 5.3.4"), (422, "550 5.6.0"), (429, "451 4.7.1"), (500, "451 4.3.0"),
     (503, "451 4.3.0")],
)  # fmt: skip
def test_the_api_s_answer_is_told_as_smtp_says(status: int, code: str) -> None:
    answer = {"batch_id": "b1", "error": {"code": "x", "message": "why\r\nnot é"}}
    reply = reply_to(status, answer)
    assert reply.startswith(code)
    assert "\r" not in reply and "\n" not in reply and reply.isascii()


def test_a_refusal_names_the_fields_the_api_named() -> None:
    answer = {"error": {"code": "invalid_fields", "message": "bad",
                        "fields": {"from": "domain not verified"}}}  # fmt: skip
    assert reply_to(422, answer) == "550 5.6.0 bad (from: domain not verified)"
