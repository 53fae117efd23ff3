"""A message handed over by SMTP as the batch it becomes (``services.submission.message``), and
the SMTP reply for the API's answer (``services.submission.server.reply_to``)."""

from __future__ import annotations

from email.message import EmailMessage

import pytest

from services.submission.message import Refused, batch_of
from services.submission.server import reply_to


def _raw(**headers: str) -> bytes:
    message = EmailMessage()
    for name, value in {"From": "Shop <shop@example.com>", "Subject": "Hi", **headers}.items():
        message[name.replace("_", "-")] = value
    message.set_content("Hello there")
    return bytes(message)


def test_one_recipient_gets_a_copy_of_their_own_with_the_message_s_parts() -> None:
    submission = batch_of(_raw(To="Ann <ann@example.org>", Reply_To="help@example.com"),
                          ["Ann@Example.org"])  # fmt: skip
    body = submission.body
    assert body["from"] == "Shop <shop@example.com>"
    assert (body["to"], body["subject"], body["reply_to"]) == (
        ["ann@example.org"], "Hi", "help@example.com",
    )  # fmt: skip
    assert body["text"] == "Hello there\n"
    assert "shared" not in body and "html" not in body


def test_the_envelope_decides_who_receives_and_the_headers_who_is_seen() -> None:
    raw = _raw(To="a@x.org, b@x.org", Cc="c@x.org")
    body = batch_of(raw, ["a@x.org", "b@x.org", "c@x.org", "hidden@x.org"]).body
    assert (body["to"], body["cc"], body["bcc"], body["shared"]) == (
        ["a@x.org", "b@x.org"], ["c@x.org"], ["hidden@x.org"], True,
    )  # fmt: skip


def test_a_header_naming_nobody_of_the_envelope_gives_each_their_own_copy() -> None:
    body = batch_of(_raw(To="undisclosed-recipients:;"), ["a@x.org", "b@x.org"]).body
    assert body["to"] == ["a@x.org", "b@x.org"] and "shared" not in body


def test_cc_alone_becomes_to() -> None:
    body = batch_of(_raw(To="list@lists.x.org", Cc="a@x.org, b@x.org"), ["a@x.org", "b@x.org"]).body
    assert (body["to"], body.get("cc"), body["shared"]) == (["a@x.org", "b@x.org"], None, True)


def test_the_message_id_is_the_idempotency_key() -> None:
    assert batch_of(_raw(Message_ID="<abc.123@host.example>"), ["a@x.org"]).idempotency_key == (
        "smtp:abc.123@host.example"
    )
    assert batch_of(_raw(), ["a@x.org"]).idempotency_key is None


def test_x_headers_pass_and_the_rest_are_ours_to_write() -> None:
    raw = _raw(X_Campaign="spring", X_Mailgun_Tag="no", Date="Mon, 30 Nov 2026 10:00:00 +0000")
    assert batch_of(raw, ["a@x.org"]).body["headers"] == {"X-Campaign": "spring"}


def test_html_and_text_alternatives_are_both_kept() -> None:
    message = EmailMessage()
    message["From"], message["Subject"] = "shop@example.com", "Hé"
    message.set_content("plain")
    message.add_alternative("<p>html</p>", subtype="html")
    body = batch_of(bytes(message), ["a@x.org"]).body
    assert (body["subject"], body["text"], body["html"]) == ("Hé", "plain\n", "<p>html</p>\n")


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (_raw(From="a@x.org, b@x.org"), "550 5.1.7"),
        (b"From: a@x.org\r\nSubject: s\r\nContent-Type: application/pdf\r\n\r\nxx", "554 5.6.0"),
        (
            b"From: a@x.org\r\nSubject: s\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n"
            b"--b\r\nContent-Type: image/png\r\n\r\nxx\r\n--b--\r\n",
            "554 5.6.1",
        ),
        (
            b"From: a@x.org\r\nSubject: s\r\nContent-Type: text/plain; charset=nope\r\n\r\nxx",
            "554 5.6.3",
        ),
    ],
    ids=["two-senders", "not-text", "attachment", "charset"],
)
def test_a_message_that_cannot_become_a_batch_is_refused_with_a_reason(
    raw: bytes, code: str
) -> None:
    with pytest.raises(Refused) as refused:
        batch_of(raw, ["a@x.org"])
    assert refused.value.reply.startswith(code)


def test_an_attachment_is_refused_not_dropped() -> None:
    message = EmailMessage()
    message["From"], message["Subject"] = "shop@example.com", "Invoice"
    message.set_content("see attached")
    message.add_attachment(b"%PDF", maintype="application", subtype="pdf", filename="i.pdf")
    with pytest.raises(Refused, match="attachments"):
        batch_of(bytes(message), ["a@x.org"])


@pytest.mark.parametrize(
    ("status", "code"),
    [(202, "250 2.0.0 queued as b1"), (401, "535 5.7.8"), (403, "550 5.7.1"), (409, "550 5.7.0"),
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
