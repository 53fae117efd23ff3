"""Unit tests for attachments: the ``attachments`` rules of a batch body
(``shared.delivery.validation``), their limits at the boundary, and ``Message``'s round trip."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from shared.core.catalog import CATALOG
from shared.core.models import Attachment, Message
from shared.delivery import validation
from shared.delivery.validation import (
    MAX_ATTACHMENTS,
    MAX_ATTACHMENTS_BYTES,
    BatchRequest,
    InvalidRequest,
    attachments_limit,
    parse_batch_request,
)


def _file(data: bytes = b"hello", **overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "filename": "a.txt",
        "content_type": "text/plain",
        "content": base64.b64encode(data).decode(),
    }
    entry.update(overrides)
    return {key: value for key, value in entry.items() if value is not None}


def _body(*attachments: object, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "from": "Ann <ann@x.org>",
        "to": ["bob@x.org"],
        "subject": "Hello",
        "text": "Hi there",
        "attachments": list(attachments),
    }
    body.update(overrides)
    return body


def _parse(body: object) -> BatchRequest:
    return parse_batch_request(body, max_recipients=100)


def _errors(body: object) -> dict[str, str]:
    with pytest.raises(InvalidRequest) as caught:
        _parse(body)
    assert caught.value.code == "invalid_fields"
    return caught.value.fields


def test_attachments_are_kept_in_order_with_their_size() -> None:
    inline = _file(b"\x89PNG", filename="logo.png", content_type="image/png")
    inline.update(disposition="inline", content_id="logo@x")
    message = _parse(_body(_file(b"hello"), inline)).message
    assert [(a.filename, a.disposition, a.content_id, a.size) for a in message.attachments] == [
        ("a.txt", "attachment", None, 5),
        ("logo.png", "inline", "logo@x", 4),
    ]


def test_no_attachments_field_means_none() -> None:
    body = _body()
    del body["attachments"]
    assert _parse(body).message.attachments == ()


@pytest.mark.parametrize(
    ("entry", "path", "words"),
    [
        (_file(filename=None), "filename", "is required"),
        (_file(filename=""), "filename", "1 to 255"),
        (_file(filename="x" * 256), "filename", "1 to 255"),
        (_file(filename="../etc/passwd"), "filename", "path separators"),
        (_file(filename="a\\b.txt"), "filename", "path separators"),
        (_file(filename="a\r\nBcc: x.txt"), "filename", "control characters"),
        (_file(filename="a\x85.txt"), "filename", "control characters"),
        (_file(content_type="pdf"), "content_type", "type/subtype"),
        (_file(content_type="text/plain; charset=x"), "content_type", "type/subtype"),
        (_file(content="aGVsbG8"), "content", "base64"),
        (_file(content="aGVs\nbG8="), "content", "base64"),
        (_file(content="aGVsbG8=aGVsbG8="), "content", "base64"),
        (_file(content="aGVsbG8é"), "content", "base64"),
        (_file(content=""), "content", "must not be empty"),
        (_file(content=5), "content", "must be a string"),
        (_file(disposition="attached"), "disposition", '"attachment" or "inline"'),
        (_file(disposition="inline"), "content_id", "is required for an inline"),
        (_file(disposition="inline", content_id="a b"), "content_id", "no space"),
        (_file(disposition="inline", content_id="<a>"), "content_id", "angle brackets"),
        (_file(content_id="logo"), "content_id", "only for an inline"),
        (_file(disposition="inline", content_id="c" * 79), "content_id", "1 to 78"),
        (_file(size=1), "size", "unknown field"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_bad_attachment_field_is_refused_under_its_path(
    entry: dict[str, Any], path: str, words: str
) -> None:
    errors = _errors(_body(_file(), _file(), entry))
    assert words in errors[f"attachments[2].{path}"]
    assert not any(key.startswith(("attachments[0]", "attachments[1]")) for key in errors)


def test_every_bad_entry_is_reported_at_once() -> None:
    errors = _errors(_body(_file(filename="a/b"), 7, _file(content="!")))
    assert set(errors) == {"attachments[0].filename", "attachments[1]", "attachments[2].content"}


def test_a_content_id_given_twice_is_refused() -> None:
    one = _file(disposition="inline", content_id="logo")
    assert "twice" in _errors(_body(one, one))["attachments[1].content_id"]


def test_attachments_must_be_a_list() -> None:
    assert _errors(_body(attachments="a.txt"))["attachments"] == (
        "must be a list of attachment objects"
    )


def test_the_count_is_capped() -> None:
    assert len(_parse(_body(*[_file()] * MAX_ATTACHMENTS)).message.attachments) == MAX_ATTACHMENTS
    errors = _errors(_body(*[_file()] * (MAX_ATTACHMENTS + 1)))
    assert errors["attachments"] == f"must hold at most {MAX_ATTACHMENTS} attachments"


def test_the_total_decoded_size_is_capped_at_the_byte() -> None:
    half = MAX_ATTACHMENTS_BYTES // 2
    at_limit = _body(_file(b"\0" * half), _file(b"\0" * (MAX_ATTACHMENTS_BYTES - half)))
    assert sum(a.size for a in _parse(at_limit).message.attachments) == MAX_ATTACHMENTS_BYTES
    over = _body(_file(b"\0" * half), _file(b"\0" * (MAX_ATTACHMENTS_BYTES - half + 1)))
    assert "at most 7,340,032 bytes together" in _errors(over)["attachments"]


def test_the_limit_fits_the_api_body_cap_and_every_provider() -> None:
    body_cap = 10 * 1024 * 1024  # SAFEDELIVR_API_MAX_BODY_BYTES's default
    assert len(base64.b64encode(b"\0" * MAX_ATTACHMENTS_BYTES)) < body_cap * 0.95
    for info in CATALOG.values():
        # base64 in MIME: 4/3, plus CRLF every 76 characters.
        assert info.max_message_bytes > MAX_ATTACHMENTS_BYTES * 4 / 3 * 78 / 76


def test_a_chain_with_a_small_provider_lowers_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    small = CATALOG["mg"].__class__(**{**_fields(CATALOG["mg"]), "max_message_bytes": 1_000_000})
    monkeypatch.setitem(CATALOG, "mg", small)
    assert attachments_limit(("sg", "mg")) == 700_000
    assert attachments_limit(("sg",)) == MAX_ATTACHMENTS_BYTES
    body = _body(_file(b"\0" * 700_001))
    assert "at most 700,000 bytes" in _errors(body)["attachments"]
    # A batch pinned to the larger provider is judged by it alone.
    assert _parse({**body, "provider": "sendgrid"}).message.attachments


def _fields(info: object) -> dict[str, Any]:
    return {name: getattr(info, name) for name in info.__slots__}  # type: ignore[attr-defined]


def test_attachment_contents_make_a_body_large() -> None:
    small = _body(_file(b"\0" * 1000))
    assert not validation.is_large(small)
    big = _body(_file(b"\0" * (validation.LARGE_TEXT_LENGTH // 4 * 3 + 3)))
    assert validation.is_large(big)


def test_a_message_without_attachments_encodes_without_the_field() -> None:
    message = Message.model_validate({"from": {"email": "a@x.org"}, "subject": "s"})
    assert "attachments" not in orjson.loads(message.encode())


def test_a_message_with_attachments_round_trips() -> None:
    attachment = Attachment(
        filename="logo.png",
        content_type="image/png",
        content="iVBORw==",
        disposition="inline",
        content_id="logo",
    )
    message = Message.model_validate(
        {"from": {"email": "a@x.org"}, "subject": "s", "attachments": [attachment]}
    )
    assert Message.decode(message.encode()) == message
    assert attachment.size == 4
