"""SendGrid Mail Send body rules (pure)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sendgrid.helpers.mail import Category, Content, CustomArg, Mail, Personalization, To

from sandbox import mailsend
from tests.unit.sandbox.conftest import sendgrid_mail

NOW = time.time()


def _fields(payload: Any) -> list[str | None]:
    return [e.field for e in mailsend.validate(payload, now=NOW)]


def test_minimal_valid_body_passes() -> None:
    """A body with personalizations, from, subject and content has no errors."""
    assert mailsend.validate(sendgrid_mail("a@example.com"), now=NOW) == []


def test_body_from_official_helper_passes() -> None:
    """What the official ``sendgrid`` helper builds is accepted."""
    mail = Mail(from_email="sender@example.com", subject="Hi")
    mail.add_content(Content("text/html", "<p>x"))
    mail.add_content(Content("text/plain", "x"))
    mail.add_category(Category("news"))
    personalization = Personalization()
    personalization.add_to(To("a@example.com", "A"))
    personalization.add_custom_arg(CustomArg("log_id", "1"))
    mail.add_personalization(personalization)

    assert mailsend.validate(mail.get(), now=NOW) == []


def _personalizations(count: int, per: int = 1) -> list[dict[str, Any]]:
    return [{"to": [{"email": f"r{i}-{j}@example.com"} for j in range(per)]} for i in range(count)]


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("no personalizations", {"personalizations": None}, "personalizations"),
    ("empty personalizations", {"personalizations": []}, "personalizations"),
    ("1001 personalizations", {"personalizations": _personalizations(1001)}, "personalizations"),
    ("personalization without to", {"personalizations": [{"cc": []}]}, "personalizations.0.to"),
    (
        "invalid recipient",
        {"personalizations": [{"to": [{"email": "not-an-address"}]}]},
        "personalizations.0.to.0.email",
    ),
    ("no from", {"from": None}, "from.email"),
    ("unicode from", {"from": {"email": "séndér@example.com"}}, "from.email"),
    ("no subject", {"subject": None}, "subject"),
    ("no content", {"content": []}, "content"),
    ("empty content value", {"content": [{"type": "text/plain", "value": ""}]}, "content.0.value"),
    (
        "text/plain after html",
        {"content": [{"type": "text/html", "value": "x"}, {"type": "text/plain", "value": "x"}]},
        "content.1.type",
    ),
    ("1001 recipients", {"personalizations": _personalizations(2, per=501)}, "personalizations"),
    (
        "duplicate in to and cc",
        {"personalizations": [{"to": [{"email": "a@x.com"}], "cc": [{"email": "A@x.com"}]}]},
        "personalizations.0.cc",
    ),
    (
        "duplicate across personalizations",
        {"personalizations": [{"to": [{"email": "a@x.com"}]}, {"to": [{"email": "a@x.com"}]}]},
        "personalizations.1.to",
    ),
    ("11 categories", {"categories": [f"c{i}" for i in range(11)]}, "categories"),
    ("long category", {"categories": ["x" * 256]}, "categories.0"),
    ("custom_args not strings", {"custom_args": {"n": 1}}, "custom_args"),
    (
        "custom_args too large together",
        {
            "custom_args": {"a": "x" * 6000},
            "personalizations": [{"to": [{"email": "a@x.com"}], "custom_args": {"b": "y" * 4000}}],
        },
        "personalizations.0.custom_args",
    ),
    ("reserved header", {"headers": {"X-SG-ID": "1"}}, "headers"),
    (
        "reserved personalization header",
        {"personalizations": [{"to": [{"email": "a@x.com"}], "headers": {"reply-to": "x"}}]},
        "personalizations.0.headers",
    ),
    ("send_at beyond 72 h", {"send_at": int(NOW) + 73 * 3600}, "send_at"),
    ("invalid reply_to", {"reply_to": {"email": "nope"}}, "reply_to.email"),
]


@pytest.mark.parametrize(("case", "fields", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_each_rule_names_its_field(case: str, fields: dict[str, Any], field: str) -> None:
    """Each rule SendGrid enforces yields an error naming the offending field."""
    payload = {k: v for k, v in sendgrid_mail("a@example.com", **fields).items() if v is not None}

    assert field in _fields(payload)


def test_subject_in_every_personalization_suffices() -> None:
    """No top-level subject is needed when every personalization has one."""
    payload = sendgrid_mail(subject=None)
    del payload["subject"]
    payload["personalizations"] = [
        {"to": [{"email": "a@x.com"}], "subject": "A"},
        {"to": [{"email": "b@x.com"}], "subject": "B"},
    ]

    assert _fields(payload) == []


def test_template_replaces_subject_and_content() -> None:
    """With a template_id neither subject nor content is required."""
    payload = {
        "personalizations": [{"to": [{"email": "a@x.com"}]}],
        "from": {"email": "s@x.com"},
        "template_id": "d-123",
    }

    assert _fields(payload) == []


def test_all_problems_are_listed_at_once() -> None:
    """Every problem of a body is reported in one answer."""
    fields = _fields({"personalizations": [{"to": [{"email": "bad"}]}], "categories": ["x"] * 11})

    assert {
        "personalizations.0.to.0.email",
        "from.email",
        "subject",
        "content",
        "categories",
    } <= set(fields)


def test_non_object_body_is_refused() -> None:
    """A JSON array is not a Mail Send body."""
    assert _fields([]) == [None]


def test_exactly_1000_recipients_pass() -> None:
    """The recipient limit is inclusive."""
    payload = sendgrid_mail(personalizations=_personalizations(2, per=500))

    assert _fields(payload) == []


@pytest.mark.parametrize(
    ("attachment", "field"),
    [
        ({"filename": "a.txt"}, "attachments.0.content"),
        ({"filename": "a.txt", "content": "not base64!"}, "attachments.0.content"),
        ({"content": "QQ=="}, "attachments.0.filename"),
        ({"content": "QQ==", "filename": "a", "disposition": "x"}, "attachments.0.disposition"),
        ({"content": "QQ==", "filename": "a", "disposition": "inline"}, "attachments.0.content_id"),
    ],
)
def test_a_bad_attachment_is_refused(attachment: dict[str, Any], field: str) -> None:
    """SendGrid's attachment rules: content (base64) and filename, an inline one's id."""
    payload = {**sendgrid_mail("a@example.com"), "attachments": [attachment]}
    assert _fields(payload) == [field]


def test_attachments_as_the_helpers_write_them_pass() -> None:
    payload = {
        **sendgrid_mail("a@example.com"),
        "attachments": [
            {"content": "QQ==", "filename": "a.txt", "type": "text/plain"},
            {"content": "QQ==", "filename": "l.png", "disposition": "inline", "content_id": "l"},
        ],
    }
    assert mailsend.validate(payload, now=NOW) == []
