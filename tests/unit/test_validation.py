"""Unit tests for shared.delivery.validation: the POST /v1/batches body rules and body_hash."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from shared.core.catalog import CATALOG
from shared.core.errors import SafedelivrError
from shared.core.models import RESERVED_HEADERS, Address, Message
from shared.delivery.batch_in import BatchIn
from shared.delivery.validation import (
    HEADER_RESERVED,
    MAX_METADATA_BYTES,
    MAX_REJECTED_LENGTH,
    BatchRequest,
    InvalidRequest,
    RecipientInput,
    Rejected,
    addresses_of,
    body_hash,
    drop_suppressed,
    parse_batch_request,
)

CAP = 1000


def _body(**overrides: Any) -> dict[str, Any]:
    """A valid request body with some fields replaced (None removes a field)."""
    body: dict[str, Any] = {
        "from": "Ann <ann@x.org>",
        "to": ["bob@x.org"],
        "subject": "Hello",
        "text": "Hi there",
    }
    body.update(overrides)
    return {key: value for key, value in body.items() if value is not None}


def _parse(body: object, *, cap: int = CAP, **kwargs: Any) -> BatchRequest:
    return parse_batch_request(body, max_recipients=cap, **kwargs)


def _refusal(body: object, *, cap: int = CAP, **kwargs: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        _parse(body, cap=cap, **kwargs)
    return caught.value


def _field_errors(body: object) -> dict[str, str]:
    refusal = _refusal(body)
    assert refusal.code == "invalid_fields"
    return refusal.fields


# -- valid forms ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sender", "expected"),
    [
        ("ann@x.org", Address(email="ann@x.org")),
        ("Ann <ann@X.ORG>", Address(email="ann@x.org", name="Ann")),
        ('"Lee, Ann" <ann@x.org>', Address(email="ann@x.org", name="Lee, Ann")),
        ({"email": "ann@x.org"}, Address(email="ann@x.org")),
        ({"email": " ann@x.org ", "name": "Ann"}, Address(email="ann@x.org", name="Ann")),
        ({"email": "ann@x.org", "name": None}, Address(email="ann@x.org")),
        ({"email": "a@bücher.de", "name": "Zoë"}, Address(email="a@xn--bcher-kva.de", name="Zoë")),
    ],
)
def test_from_forms(sender: object, expected: Address) -> None:
    """``from`` accepts an address string or an {email, name} object."""
    assert _parse(_body(**{"from": sender})).message.sender == expected


@pytest.mark.parametrize(
    ("reply_to", "expected"),
    [
        ("Support <help@x.org>", Address(email="help@x.org", name="Support")),
        ({"email": "help@x.org", "name": "Support"}, Address(email="help@x.org", name="Support")),
        (None, None),
    ],
)
def test_reply_to_forms(reply_to: object, expected: Address | None) -> None:
    """``reply_to`` takes the same forms as ``from`` and is optional."""
    assert _parse(_body(reply_to=reply_to)).message.reply_to == expected


@pytest.mark.parametrize(
    ("to", "expected"),
    [
        (["bob@x.org"], [RecipientInput(email="bob@x.org")]),
        ("bob@x.org", [RecipientInput(email="bob@x.org")]),
        (
            "bob@x.org, Cy <cy@x.org>",
            [RecipientInput(email="bob@x.org"), RecipientInput(email="cy@x.org", name="Cy")],
        ),
        (
            ['"Lee, Bob" <bob@x.org>'],
            [RecipientInput(email="bob@x.org", name="Lee, Bob")],
        ),
        (
            [{"email": "bob@x.org", "name": "Bob", "substitutions": {"-first-": "Bob"}}],
            [RecipientInput(email="bob@x.org", name="Bob", substitutions={"-first-": "Bob"})],
        ),
        (
            [{"email": "bob@x.org"}, "cy@x.org"],
            [RecipientInput(email="bob@x.org"), RecipientInput(email="cy@x.org")],
        ),
    ],
)
def test_to_forms(to: object, expected: list[RecipientInput]) -> None:
    """``to`` accepts a list of strings, a comma-separated string, objects, or a mix."""
    assert list(_parse(_body(to=to)).recipients) == expected


@pytest.mark.parametrize(
    ("copies", "expected"),
    [
        (["cc1@x.org", "Cc Two <cc2@x.org>"], ("cc1@x.org", "cc2@x.org")),
        ("cc1@x.org, cc2@x.org", ("cc1@x.org", "cc2@x.org")),
        ([{"email": "cc1@x.org", "name": "One"}], ("cc1@x.org",)),
        ([], ()),
    ],
)
def test_cc_and_bcc_forms(copies: object, expected: tuple[str, ...]) -> None:
    """``cc`` and ``bcc`` accept lists, comma-separated strings and objects."""
    message = _parse(_body(cc=copies)).message
    assert tuple(a.email for a in message.cc) == expected
    bcc = _parse(_body(bcc=copies)).message.bcc
    assert tuple(a.email for a in bcc) == expected


def test_optional_fields_are_carried_into_the_message() -> None:
    """Headers, categories, metadata, bulk and both bodies reach the Message unchanged."""
    message = _parse(
        _body(
            html="<p>Hi</p>",
            headers={"X-Campaign": "spring", "X-Entity-Ref-ID": "42"},
            categories=["news", "spring"],
            metadata={"order_id": "42", "tenant-1": "a"},
            bulk=True,
        )
    ).message
    assert message.html == "<p>Hi</p>"
    assert message.text == "Hi there"
    assert message.headers == {"X-Campaign": "spring", "X-Entity-Ref-ID": "42"}
    assert message.categories == ("news", "spring")
    assert message.metadata == {"order_id": "42", "tenant-1": "a"}
    assert message.bulk is True


def test_null_optional_fields_mean_absent() -> None:
    """``null`` for an optional field is the same as leaving it out."""
    body = _body(html=None) | {
        "reply_to": None,
        "cc": None,
        "bcc": None,
        "headers": None,
        "bulk": None,
        "categories": None,
        "metadata": None,
        "html": None,
    }
    message = _parse(body).message
    # Absent means the defaults, one copy per recipient among them.
    assert (message.reply_to, message.cc, message.headers, message.bulk) == (None, (), {}, True)


@pytest.mark.parametrize(
    ("html", "text"),
    [("<p>Hi</p>", None), (None, "Hi"), ("<p>Hi</p>", ""), ("", "Hi")],
)
def test_either_body_is_enough(html: str | None, text: str | None) -> None:
    """html alone or text alone is enough; an empty one is stored as None."""
    message = _parse({**_body(text=None), "html": html, "text": text}).message
    assert (message.html, message.text) == (html or None, text or None)


def test_message_round_trips_through_its_codec() -> None:
    """The built Message encodes and decodes unchanged (it can cross the broker)."""
    message = _parse(
        _body(cc=["cc@x.org"], headers={"X-A": "b"}, categories=["c"], metadata={"k": "v"})
    ).message
    assert Message.decode(message.encode()) == message


# -- whole-request errors ---------------------------------------------------------------------


@pytest.mark.parametrize("raw", [[], "text", 5, None])
def test_body_must_be_an_object(raw: object) -> None:
    """A body that is not a JSON object is refused under ``body``."""
    assert _field_errors(raw) == {"body": "must be a JSON object"}


def test_unknown_top_level_fields_are_named() -> None:
    """Each unknown top-level field is reported under its own name."""
    errors = _field_errors(_body(From="x@x.org", template_id="t"))
    assert errors == {"From": "unknown field", "template_id": "unknown field"}


def test_unknown_field_with_control_characters_is_quoted() -> None:
    """An unknown key holding control characters is reported JSON-quoted."""
    assert _field_errors(_body(**{"a\r\nb": 1})) == {'"a\\r\\nb"': "unknown field"}


def test_all_field_errors_are_collected() -> None:
    """Every invalid field is reported at once, not just the first."""
    errors = _field_errors(
        _body(
            subject="",
            to=[5],
            headers={"To": "x"},
            bulk="yes",
            categories="news",
            metadata=[],
            cc=[""],
        )
        | {"from": None}
    )
    assert set(errors) == {
        "from",
        "subject",
        "to[0]",
        "headers.To",
        "bulk",
        "categories",
        "metadata",
        "cc[0]",
    }


def test_invalid_request_is_a_safedelivr_error_with_status_422() -> None:
    """InvalidRequest carries code, message, fields and HTTP status 422."""
    refusal = _refusal(_body(subject=""))
    assert isinstance(refusal, SafedelivrError)
    assert (refusal.status, refusal.code) == (422, "invalid_fields")
    assert refusal.message == "the request has 1 invalid field(s)"
    assert str(refusal) == refusal.message


# -- from / reply_to --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sender", "field", "message"),
    [
        (None, "from", "is required"),
        (5, "from", "must be an address string or an object {email, name}"),
        ("not an address", "from", "@-sign"),
        ("a@x.org, b@x.org", "from", "more than one address"),
        ("Zoë <zoë@x.org>", "from", "ASCII"),
        ({"name": "Ann"}, "from.email", "is required"),
        ({"email": 5}, "from.email", "must be a string"),
        ({"email": "Ann <ann@x.org>"}, "from.email", "display name"),
        ({"email": "ann@x.org", "name": 5}, "from.name", "must be a string"),
        ({"email": "ann@x.org", "name": "a" * 257}, "from.name", "longer than 256"),
        ({"email": "ann@x.org", "reply": "x"}, "from.reply", "unknown field"),
    ],
)
def test_invalid_from(sender: object, field: str, message: str) -> None:
    """Each invalid ``from`` is reported under its field path."""
    errors = _field_errors({**_body(), "from": sender})
    assert list(errors) == [field]
    assert message in errors[field]


def test_invalid_reply_to() -> None:
    """An invalid ``reply_to`` is a field error."""
    assert list(_field_errors(_body(reply_to="Ann <ann@x.org"))) == ["reply_to"]


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("from", "Ann\r\nBcc: evil@attacker.org <ann@x.org>", "from"),
        ("from", {"email": "ann@x.org", "name": "Ann\nBcc: x@evil"}, "from.name"),
        ("from", {"email": "ann@x.org", "name": "=?utf-8?q?Ann=0A?="}, "from.name"),
        ("reply_to", {"email": "ann@x.org", "name": "Ann\x00"}, "reply_to.name"),
        ("reply_to", "=?UTF-8?Q?=0A?= <ann@x.org>", "reply_to"),
    ],
)
def test_header_injection_in_sender_names(field: str, value: object, path: str) -> None:
    """Line breaks or NUL in from/reply_to, raw or encoded, are refused as injection."""
    errors = _field_errors(_body(**{field: value}))
    assert list(errors) == [path]
    assert "header injection" in errors[path]


# -- subject ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("subject", "message"),
    [
        (None, "is required"),
        (5, "must be a string"),
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("x" * 999, "at most 998 characters"),
        ("Bell\x07", "control characters"),
    ],
)
def test_invalid_subject(subject: object, message: str) -> None:
    """Missing, non-string, blank, too long or control-laden subjects are refused."""
    errors = _field_errors({**_body(), "subject": subject})
    assert message in errors["subject"]


def test_subject_of_998_characters_is_accepted() -> None:
    """A subject of exactly 998 characters is accepted."""
    assert _parse(_body(subject="x" * 998)).message.subject == "x" * 998


def test_subject_with_crlf_bcc_is_refused() -> None:
    """``"Hi\\r\\nBcc: x@evil"`` in the subject is a 422 naming ``subject``."""
    refusal = _refusal(_body(subject="Hi\r\nBcc: x@evil"))
    assert (refusal.status, refusal.code) == (422, "invalid_fields")
    assert "header injection" in refusal.fields["subject"]


def test_subject_with_q_encoded_newline_is_refused() -> None:
    """``=?UTF-8?Q?=0A?=`` in the subject is a 422 naming ``subject``."""
    refusal = _refusal(_body(subject="=?UTF-8?Q?=0A?="))
    assert (refusal.status, refusal.code) == (422, "invalid_fields")
    assert "encoded-word" in refusal.fields["subject"]


def test_subject_with_b_encoded_newline_is_refused() -> None:
    """A base64 encoded-word hiding CR LF in the subject is refused."""
    errors = _field_errors(_body(subject="Hi =?utf-8?b?DQpCY2M6IHhAZXZpbA==?="))
    assert "header injection" in errors["subject"]


def test_subject_with_harmless_encoded_word_is_accepted() -> None:
    """A pre-encoded subject without line breaks is accepted as given."""
    subject = "=?utf-8?q?Caf=C3=A9?="
    assert _parse(_body(subject=subject)).message.subject == subject


# -- html / text ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("html", "text"),
    [(None, None), ("", ""), ("  ", "\n")],
)
def test_html_or_text_is_required(html: str | None, text: str | None) -> None:
    """Without a non-empty html or text, both fields are named."""
    errors = _field_errors({**_body(text=None), "html": html, "text": text})
    assert set(errors) == {"html", "text"}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("html", 5, "must be a string"),
        ("text", ["x"], "must be a string"),
        ("text", "a\x00b", "NUL"),
        ("html", "a\ud800b", "surrogates"),
    ],
)
def test_invalid_bodies(field: str, value: object, message: str) -> None:
    """A non-string body or one holding NUL or lone surrogates is refused under its name."""
    errors = _field_errors(_body(**{field: value}))
    assert list(errors) == [field]
    assert message in errors[field]


def test_multiline_text_body_is_accepted() -> None:
    """Bodies may of course hold line breaks."""
    assert _parse(_body(text="line 1\r\nline 2\n")).message.text == "line 1\r\nline 2\n"


# -- headers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*sorted(RESERVED_HEADERS), "CONTENT-TYPE", "Dkim-Signature"])
def test_reserved_headers_are_refused(name: str) -> None:
    """Every reserved header, in any case, is refused under ``headers.<name>``."""
    errors = _field_errors(_body(headers={name: "x"}))
    assert "reserved" in errors[f"headers.{name}"]


@pytest.mark.parametrize(
    "name",
    ["X-Mailgun-Variables", "x-mailgun-tag", "X-SMTPAPI", "X-SG-Send-At", "X-Twilio-Id"],
)
def test_provider_control_headers_are_refused(name: str) -> None:
    """Headers that steer a provider (tracking, tags, routing) are not the sender's to set."""
    errors = _field_errors(_body(headers={name: "x"}))
    assert "reserved" in errors[f"headers.{name}"]


@pytest.mark.parametrize(
    "name",
    [
        "Resent-From",
        "resent-sender",
        "RESENT-TO",
        "Resent-Message-ID",
        "Authentication-Results",
        "authentication-results",
        "ARC-Seal",
        "arc-message-signature",
        "ARC-Authentication-Results",
    ],
)
def test_identity_and_authentication_headers_are_refused(name: str) -> None:
    """Resent-*, Authentication-Results and ARC-* are reserved in any case, with the error of
    every reserved header (a sender's own would pass for another sender or a verdict)."""
    errors = _field_errors(_body(headers={name: "x"}))
    assert errors == {f"headers.{name}": HEADER_RESERVED}


@pytest.mark.parametrize(
    "name", ["List-Unsubscribe", "list-unsubscribe", "List-Unsubscribe-Post", "LIST-UNSUBSCRIBE"]
)
def test_a_senders_own_unsubscribe_headers_are_refused(name: str) -> None:
    """Ours must win: the request's own List-Unsubscribe(-Post) is reserved like the others
    (``unsubscribe: true`` asks for ours)."""
    errors = _field_errors(_body(headers={name: "<https://sender.example/u>"}))
    assert errors == {f"headers.{name}": HEADER_RESERVED}


def test_a_header_that_merely_starts_like_a_provider_family_is_allowed() -> None:
    """``X-Mailgunner`` is not Mailgun's (its family is ``X-Mailgun-``)."""
    assert _parse(_body(headers={"X-Mailgunner": "x", "X-SGx": "y"})).message.headers == {
        "X-Mailgunner": "x",
        "X-SGx": "y",
    }


@pytest.mark.parametrize(
    "name", ["X Foo", "X-Foo:", "", "Ünicode", "X-\tTab", "x" * 129, "X-Foo\r\nBcc"]
)
def test_invalid_header_names_are_refused(name: str) -> None:
    """Header names must be 1..128 printable ASCII characters without space or colon."""
    errors = _field_errors(_body(headers={name: "x"}))
    assert len(errors) == 1
    assert "header field name" in next(iter(errors.values()))


def test_header_name_with_line_break_is_reported_quoted() -> None:
    """A header name with CR LF appears JSON-quoted in the error path."""
    errors = _field_errors(_body(headers={"X\r\nBcc": "x"}))
    assert list(errors) == ['headers."X\\r\\nBcc"']


def test_duplicate_header_names_differing_in_case_are_refused() -> None:
    """Header names are case-insensitive, so X-Foo and x-foo clash."""
    errors = _field_errors(_body(headers={"X-Foo": "a", "x-foo": "b"}))
    assert list(errors) == ["headers.x-foo"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (5, "must be a string"),
        ("x" * 999, "at most 998"),
        ("a\r\nBcc: x@evil", "header injection"),
        ("a\nb", "header injection"),
        ("=?UTF-8?Q?=0A?=", "header injection"),
        ("=?utf-8?b?YQ0KQmNjOiB4QGV2aWw=?=", "header injection"),
    ],
)
def test_invalid_header_values_are_refused(value: object, message: str) -> None:
    """Header values must be short strings without raw or encoded line breaks."""
    errors = _field_errors(_body(headers={"X-Foo": value}))
    assert message in errors["headers.X-Foo"]


@pytest.mark.parametrize("headers", [["X-Foo"], "X-Foo: 1"])
def test_headers_must_be_an_object(headers: object) -> None:
    """``headers`` must be an object."""
    assert list(_field_errors(_body(headers=headers))) == ["headers"]


def test_too_many_headers_are_refused() -> None:
    """More than 50 custom headers are refused."""
    errors = _field_errors(_body(headers={f"X-H{i}": "v" for i in range(51)}))
    assert "at most 50" in errors["headers"]


# -- bulk -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bulk", [1, 0, "true", "yes", []])
def test_bulk_must_be_boolean(bulk: object) -> None:
    """``bulk`` accepts only true or false."""
    assert _field_errors(_body(bulk=bulk)) == {"bulk": "must be true or false"}


# -- categories -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("categories", "field", "message"),
    [
        ("news", "categories", "must be a list"),
        ([f"c{i}" for i in range(11)], "categories", "at most 10"),
        ([""], "categories[0]", "must not be empty"),
        (["ok", " "], "categories[1]", "must not be empty"),
        (["x" * 256], "categories[0]", "at most 255"),
        ([5], "categories[0]", "must be a string"),
        (["news\r\nBcc: x"], "categories[0]", "header injection"),
        (["news", "news"], "categories[1]", "listed twice"),
    ],
)
def test_invalid_categories(categories: object, field: str, message: str) -> None:
    """Categories: a list of at most 10 distinct strings of 1..255 safe characters."""
    errors = _field_errors(_body(categories=categories))
    assert list(errors) == [field]
    assert message in errors[field]


def test_ten_categories_of_255_characters_are_accepted() -> None:
    """The category limits are inclusive."""
    categories = [str(i) * 255 for i in range(10)]
    assert _parse(_body(categories=categories)).message.categories == tuple(categories)


# -- metadata ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "field", "message"),
    [
        (["a"], "metadata", "must be an object"),
        ({"bad key": "v"}, "metadata.bad key", "key must be"),
        ({"k" * 65: "v"}, "metadata." + "k" * 65, "key must be"),
        ({"": "v"}, 'metadata.""', "key must be"),
        ({"k": 5}, "metadata.k", "must be a string"),
        ({"k": "a\nb"}, "metadata.k", "header injection"),
        ({"k": "=?utf-8?q?=00?="}, "metadata.k", "header injection"),
    ],
)
def test_invalid_metadata(metadata: object, field: str, message: str) -> None:
    """Metadata keys match [A-Za-z0-9_-]{1,64}; values are header-safe strings."""
    errors = _field_errors(_body(metadata=metadata))
    assert list(errors) == [field]
    assert message in errors[field]


def test_metadata_over_10000_bytes_is_refused() -> None:
    """Metadata larger than 10,000 bytes as JSON is refused."""
    metadata = {f"k{i}": "v" * 1000 for i in range(10)}
    assert len(orjson.dumps(metadata)) > MAX_METADATA_BYTES
    assert "10000 bytes" in _field_errors(_body(metadata=metadata))["metadata"]


def test_metadata_of_10000_bytes_is_accepted() -> None:
    """Metadata of exactly 10,000 bytes as JSON is accepted."""
    metadata = {"k": "v" * (MAX_METADATA_BYTES - len(b'{"k":""}'))}
    assert len(orjson.dumps(metadata)) == MAX_METADATA_BYTES
    assert _parse(_body(metadata=metadata)).message.metadata == metadata


# -- to: structure and injection --------------------------------------------------------------


@pytest.mark.parametrize(
    ("to", "field", "message"),
    [
        (None, "to", "is required"),
        (5, "to", "must be a list of addresses or a comma-separated string"),
        ({"email": "bob@x.org"}, "to", "must be a list"),
        ([5], "to[0]", "must be an address string or an object"),
        (["bob@x.org", None], "to[1]", "must be an address string or an object"),
        ([{"name": "Bob"}], "to[0].email", "is required"),
        ([{"email": 5}], "to[0].email", "must be a string"),
        ([{"email": "bob@x.org", "name": 5}], "to[0].name", "must be a string"),
        ([{"email": "bob@x.org", "cc": "x"}], "to[0].cc", "unknown field"),
        ([{"email": "bob@x.org", "substitutions": []}], "to[0].substitutions", "must be an object"),
    ],
)
def test_invalid_to_structure(to: object, field: str, message: str) -> None:
    """A malformed ``to`` (as opposed to a bad address) is a field error."""
    errors = _field_errors(_body(to=to) if to is not None else {**_body(), "to": None})
    assert list(errors) == [field]
    assert message in errors[field]


@pytest.mark.parametrize(
    ("to", "field"),
    [
        (["bob@x.org", "Eve\r\n <eve@x.org>"], "to[1]"),
        (["bob@x.org", "eve@x.org\nBcc: x@evil"], "to[1]"),
        ("bob@x.org, Eve\x00 <eve@x.org>", "to[1]"),
        ("bob@x.org,\r\neve@x.org", "to[1]"),
        (["bob@x.org", "=?UTF-8?Q?Eve=0A?= <eve@x.org>"], "to[1]"),
        (["bob@x.org", {"email": "eve@x.org", "name": "Eve\r\nBcc: x"}], "to[1].name"),
        (["bob@x.org", {"email": "eve@x.org\r\n"}], "to[1].email"),
    ],
)
def test_header_injection_in_to_is_refused_not_rejected(to: object, field: str) -> None:
    """A ``to`` entry hiding a line break or NUL fails the request; it is not a mere rejection."""
    errors = _field_errors(_body(to=to))
    assert list(errors) == [field]
    assert "header injection" in errors[field]


# -- to: substitutions ------------------------------------------------------------------------


def _subs_errors(substitutions: object, **overrides: Any) -> dict[str, str]:
    to = [{"email": "bob@x.org", "substitutions": substitutions}]
    return _field_errors(_body(to=to, **overrides))


@pytest.mark.parametrize(
    ("substitutions", "field", "message"),
    [
        ({"k": 5}, "to[0].substitutions.k", "must be a string"),
        ({"": "v"}, 'to[0].substitutions.""', "key must be 1 to 128"),
        ({"k" * 129: "v"}, f'to[0].substitutions."{"k" * 100}"', "key must be 1 to 128"),
        ({"-a\n-": "v"}, 'to[0].substitutions."-a\\n-"', "key must not contain"),
        ({"-a-": "x\x00y"}, "to[0].substitutions.-a-", "NUL"),
        ({f"-k{i}-": "v" for i in range(101)}, "to[0].substitutions", "at most 100 keys"),
        ({f"-k{i}-": "v" * 200 for i in range(50)}, "to[0].substitutions", "10000 bytes"),
    ],
)
def test_invalid_substitutions(substitutions: object, field: str, message: str) -> None:
    """Substitutions are bounded string maps with safe keys."""
    errors = _subs_errors(substitutions)
    assert list(errors) == [field]
    assert message in errors[field]


def test_substitution_used_in_subject_may_not_hold_line_breaks() -> None:
    """A value whose key appears in the subject is header-bound: no line breaks."""
    errors = _subs_errors({"-first-": "Bob\r\nBcc: x@evil"}, subject="Hi -first-")
    assert "header injection" in errors["to[0].substitutions.-first-"]


def test_substitution_used_in_a_header_may_not_hold_line_breaks() -> None:
    """A value whose key appears in a custom header value is header-bound too."""
    errors = _subs_errors({"%id%": "1\n2"}, headers={"X-Ref": "ref-%id%"})
    assert "the key is used in a header" in errors["to[0].substitutions.%id%"]


def test_a_key_inside_another_keys_place_in_a_header_is_header_bound() -> None:
    """A key found in a header only inside a longer key's text is header-bound all the same."""
    errors = _subs_errors({"-id-": "1", "id": "1\n2"}, headers={"X-Ref": "ref-id-"})
    assert "the key is used in a header" in errors["to[0].substitutions.id"]
    assert "to[0].substitutions.-id-" not in errors


class _CountedSearches(str):
    """Header text that counts how often a key is looked for in it."""

    searches = 0

    def __contains__(self, key: object) -> bool:
        _CountedSearches.searches += 1
        return super().__contains__(key)  # type: ignore[operator]


def test_header_text_is_searched_once_for_all_keys_not_once_per_key() -> None:
    """The subject and headers are not searched once per distinct substitution key (1,000
    recipients with 100 keys of their own over 50 KB of headers took 8 s)."""
    _CountedSearches.searches = 0
    headers = {f"X-H{h}": _CountedSearches(f"{h}-ref-" * 100) for h in range(20)}
    to: list[dict[str, Any]] = [
        {"email": f"r{i}@x.org", "substitutions": {f"-{i}-{k}-": "1\n2" for k in range(20)}}
        for i in range(200)
    ]
    to[7]["substitutions"]["-ref-"] = "1\n2"

    errors = _field_errors(_body(to=to, subject=_CountedSearches("Hi"), headers=headers))

    assert list(errors) == ["to[7].substitutions.-ref-"]
    assert _CountedSearches.searches <= len(headers) + 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reply_to", "Support for -name- <help@x.org>"),
        ("reply_to", "help+-name-@x.org"),
        ("from", "Ann for -name- <ann@x.org>"),
    ],
)
@pytest.mark.parametrize(
    "evil",
    ['Bob" <bob@evil.example>, "x', "Bob <bob@evil.example>", "a@evil.example", "B\r\nBcc: x"],
)
def test_substitution_used_in_an_address_may_not_reshape_it(
    field: str, value: str, evil: str
) -> None:
    """A value substituted into from or reply_to may not close the name or add an address."""
    errors = _subs_errors({"-name-": evil}, **{field: value})
    assert "used in from or reply_to" in errors["to[0].substitutions.-name-"]


def test_substitution_used_in_reply_to_may_hold_a_plain_name() -> None:
    """A plain name is fine in a reply-to display name."""
    to = [{"email": "bob@x.org", "substitutions": {"-name-": "O'Brien & Sons"}}]
    request = _parse(_body(to=to, reply_to="Support for -name- <help@x.org>"))
    assert request.recipients[0].substitutions == {"-name-": "O'Brien & Sons"}


def test_substitution_used_only_in_bodies_may_hold_line_breaks() -> None:
    """A value whose key appears only in the bodies may be multi-line."""
    to: list[dict[str, Any]] = [
        {"email": "bob@x.org", "substitutions": {"-addr-": "1 Main St\n10001 NY"}},
        {"email": "cy@x.org", "substitutions": {"-addr-": "2 Main St\n10001 NY"}},
    ]
    request = _parse(_body(to=to, text="Ship to:\n-addr-", subject="Your order"))
    assert request.recipients[1].substitutions == {"-addr-": "2 Main St\n10001 NY"}


# -- to: de-duplication, rejection, suppression -----------------------------------------------


def test_to_is_deduplicated_case_insensitively_keeping_the_first() -> None:
    """The first occurrence of an address wins; later ones differing in case are dropped."""
    to = ["Bob <Bob@X.org>", "bob@x.org", {"email": "BOB@x.ORG", "name": "B"}, "cy@x.org"]
    request = _parse(_body(to=to))
    assert list(request.recipients) == [
        RecipientInput(email="Bob@x.org", name="Bob"),
        RecipientInput(email="cy@x.org"),
    ]


def test_comma_separated_to_with_quoted_comma() -> None:
    """A comma inside a quoted display name does not split a comma-separated ``to``."""
    request = _parse(_body(to='"Lee, Bob" <bob@x.org>, cy@x.org,'))
    assert [(r.email, r.name) for r in request.recipients] == [
        ("bob@x.org", "Lee, Bob"),
        ("cy@x.org", None),
    ]


def test_rejected_addresses_are_reported_and_the_request_accepted() -> None:
    """Invalid ``to`` addresses are reported with a reason; valid ones still go."""
    to = ["bob@x.org", "not-an-address", "cy@localhost", {"email": "dee@"}]
    request = _parse(_body(to=to))
    assert [r.email for r in request.recipients] == ["bob@x.org"]
    assert [r.email for r in request.rejected] == ["not-an-address", "cy@localhost", "dee@"]
    assert all(isinstance(r, Rejected) and r.reason for r in request.rejected)
    assert request.accepted == 1


def test_rejected_addresses_are_reported_once() -> None:
    """The same invalid entry listed twice (in any case) is reported once."""
    request = _parse(_body(to=["bob@x.org", "nope", "NOPE", "nope"]))
    assert request.rejected == (Rejected(email="nope", reason=request.rejected[0].reason),)


def test_unicode_local_part_is_rejected_and_idn_domain_converted() -> None:
    """SMTPUTF8 local parts are rejected; internationalised domains become punycode."""
    request = _parse(_body(to=["zoë@x.org", "Zoë <zoe@bücher.de>"]))
    assert [(r.email, r.name) for r in request.recipients] == [("zoe@xn--bcher-kva.de", "Zoë")]
    assert request.rejected[0].email == "zoë@x.org"
    assert "ASCII" in request.rejected[0].reason


def test_long_rejected_entry_is_echoed_truncated() -> None:
    """A huge invalid entry is reported cut to MAX_REJECTED_LENGTH characters."""
    request = _parse(_body(to=["bob@x.org", "x" * 5000]))
    assert request.rejected[0].email == "x" * MAX_REJECTED_LENGTH


def test_to_entry_with_several_addresses_is_rejected() -> None:
    """A list item holding two addresses is rejected, not split."""
    request = _parse(_body(to=["bob@x.org", "cy@x.org, dee@x.org"]))
    assert request.rejected[0].email == "cy@x.org, dee@x.org"
    assert "more than one address" in request.rejected[0].reason


def test_object_entry_with_bad_email_and_bad_name_is_a_field_error() -> None:
    """An object whose email is rejected still fails the request if its name is invalid."""
    errors = _field_errors(_body(to=["bob@x.org", {"email": "nope", "name": 5}]))
    assert list(errors) == ["to[1].name"]


def test_suppressed_addresses_are_removed_and_listed() -> None:
    """Listed addresses (by their key) leave the recipients and appear in ``suppressed``."""
    request = drop_suppressed(
        _parse(_body(to=["bob@x.org", "Cy@X.org", "dee@x.org"])), {"cy@x.org": "bounced"}
    )
    assert [r.email for r in request.recipients] == ["bob@x.org", "dee@x.org"]
    assert request.suppressed == ("Cy@x.org",)


def test_suppressed_cc_and_bcc_addresses_are_removed_and_listed() -> None:
    """A suppressed address is not mailed because it was given as a copy instead."""
    request = drop_suppressed(
        _parse(_body(to=["bob@x.org"], cc=["Cy@x.org", "eve@x.org"], bcc=["dee@x.org"])),
        {"cy@x.org": "bounced", "dee@x.org": "complained"},
    )
    assert [a.email for a in request.message.cc] == ["eve@x.org"]
    assert request.message.bcc == ()
    assert request.suppressed == ("Cy@x.org", "dee@x.org")


def test_copies_alone_do_not_make_a_batch_deliverable() -> None:
    """cc and bcc are not recipients: with every recipient suppressed nothing is sent."""
    with pytest.raises(InvalidRequest) as caught:
        drop_suppressed(_parse(_body(to=["bob@x.org"], cc=["cy@x.org"])), {"bob@x.org": "x"})
    assert caught.value.code == "no_recipients"


@pytest.mark.parametrize(
    ("flags", "one_each"),
    [({}, True), ({"bulk": False}, True), ({"bulk": True}, True), ({"shared": True}, False)],
)
def test_recipients_get_a_message_each_unless_the_sender_asks_for_a_shared_one(
    flags: dict[str, bool], one_each: bool
) -> None:
    """``bulk: false`` used to mean one message showing every address to every recipient."""
    assert _parse(_body(to=["a@x.org", "b@x.org"], **flags)).message.bulk is one_each


def test_copies_with_one_recipient_go_in_one_message() -> None:
    message = _parse(_body(to=["a@x.org"], cc=["c@x.org"])).message
    assert (message.bulk, [a.email for a in message.cc]) == (False, ["c@x.org"])


def test_copies_with_several_recipients_need_a_shared_message() -> None:
    errors = _field_errors(_body(to=["a@x.org", "b@x.org"], bcc=["c@x.org"]))
    assert "set shared to true" in errors["shared"]


def test_shared_and_bulk_together_are_refused() -> None:
    errors = _field_errors(_body(to=["a@x.org", "b@x.org"], bulk=True, shared=True))
    assert "cannot be combined" in errors["shared"]


def test_quotas_count_recipients_cc_and_bcc() -> None:
    request = _parse(_body(to=["a@x.org", "b@x.org"], cc=["c@x.org"], bcc=["d@x.org"], shared=True))
    assert (request.accepted, request.mailed) == (2, 4)
    assert addresses_of(request) == ["a@x.org", "b@x.org", "c@x.org", "d@x.org"]


def test_nothing_listed_leaves_the_request_as_it_was() -> None:
    request = _parse(_body(to=["bob@x.org"]))
    assert drop_suppressed(request, {}) is request


@pytest.mark.parametrize("to", [[], "", " , "])
def test_empty_to_is_no_recipients(to: object) -> None:
    """An empty ``to`` list or string is ``no_recipients``."""
    refusal = _refusal(_body(to=to))
    assert (refusal.code, refusal.status) == ("no_recipients", 422)
    assert refusal.fields == {"to": "no deliverable recipient: 0 rejected, 0 suppressed"}


def test_all_rejected_is_no_recipients_with_detail() -> None:
    """When every address is rejected, ``no_recipients`` lists each rejection."""
    refusal = _refusal(_body(to=["nope", {"email": "bob@x"}]))
    assert refusal.code == "no_recipients"
    assert refusal.fields["to"] == "no deliverable recipient: 2 rejected, 0 suppressed"
    assert refusal.fields["to[0]"].startswith("is rejected: ")
    assert refusal.fields["to[1].email"].startswith("is rejected: ")


def test_all_suppressed_is_no_recipients_with_detail() -> None:
    """When rejection and suppression leave nobody, the summary counts both and each
    suppressed address says why."""
    with pytest.raises(InvalidRequest) as caught:
        drop_suppressed(_parse(_body(to=["Bob@x.org", "nope"])), {"bob@x.org": "unsubscribed"})
    refusal = caught.value
    assert refusal.code == "no_recipients"
    assert refusal.fields == {
        "to": "no deliverable recipient: 1 rejected, 1 suppressed",
        "to.Bob@x.org": "Bob@x.org is suppressed: unsubscribed",
    }


def test_field_errors_take_precedence_over_no_recipients() -> None:
    """With other invalid fields, the code is ``invalid_fields`` even if ``to`` is empty."""
    assert _refusal(_body(to=[], subject="")).code == "invalid_fields"


# -- to: the recipient cap --------------------------------------------------------------------


def test_exactly_the_cap_is_accepted() -> None:
    """``max_recipients`` distinct recipients are accepted."""
    request = _parse(_body(to=[f"u{i}@x.org" for i in range(5)]), cap=5)
    assert request.accepted == 5


def test_over_the_cap_is_too_many_recipients() -> None:
    """One distinct recipient over the cap is ``too_many_recipients`` naming the cap."""
    refusal = _refusal(_body(to=[f"u{i}@x.org" for i in range(6)]), cap=5)
    assert (refusal.code, refusal.status) == ("too_many_recipients", 422)
    assert refusal.fields == {"to": "at most 5 distinct recipients per batch"}
    assert "at most 5" in refusal.message


def test_duplicates_and_rejections_do_not_count_toward_the_cap() -> None:
    """The cap counts distinct valid addresses only."""
    to = [f"u{i % 5}@X.org" for i in range(20)] + ["bad", "worse"]
    assert _parse(_body(to=to), cap=5).accepted == 5


def test_huge_to_list_is_refused_without_parsing() -> None:
    """A list far longer than the cap (even of duplicates) is refused outright."""
    refusal = _refusal(_body(to=["bob@x.org"] * 111), cap=5)
    assert refusal.code == "too_many_recipients"


def test_over_the_cap_with_other_errors_reports_both() -> None:
    """With other field errors, the cap is reported among them as ``invalid_fields``."""
    refusal = _refusal(_body(to=[f"u{i}@x.org" for i in range(6)], subject=""), cap=5)
    assert refusal.code == "invalid_fields"
    assert refusal.fields == {
        "subject": "must not be empty",
        "to": "at most 5 distinct recipients per batch",
    }


def test_ten_thousand_recipients_parse() -> None:
    """A 10,000-recipient batch (mixed forms, with substitutions) parses."""
    to: list[object] = []
    for i in range(10_000):
        if i % 2:
            to.append(f"User {i} <user{i}@Example.COM>")
        else:
            to.append({"email": f"user{i}@example.com", "substitutions": {"-n-": str(i)}})
    request = _parse(_body(to=to, subject="Hi -n-"), cap=10_000)
    assert request.accepted == 10_000
    assert request.recipients[9_999].email == "user9999@example.com"


# -- cc / bcc ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"cc": 5}, "cc", "must be a list"),
        ({"bcc": {"email": "x@x.org"}}, "bcc", "must be a list"),
        ({"cc": ["nope"]}, "cc[0]", "@-sign"),
        ({"cc": "ok@x.org, nope"}, "cc[1]", "@-sign"),
        ({"bcc": [5]}, "bcc[0]", "must be an address string"),
        ({"cc": ["Eve\r\n<eve@x.org>"]}, "cc[0]", "header injection"),
        ({"bcc": [{"email": "eve@x.org", "name": "Eve\n"}]}, "bcc[0].name", "header injection"),
        ({"cc": [f"c{i}@x.org" for i in range(101)]}, "cc", "must list at most 100 addresses"),
        ({"bcc": ",".join(f"c{i}@x.org" for i in range(101))}, "bcc", "must list at most 100 addr"),
        ({"cc": ["zoë@x.org"]}, "cc[0]", "ASCII"),
        ({"reply_to": {"email": "zoë@x.org"}}, "reply_to.email", "ASCII"),
        ({"cc": ["Bob@X.org"]}, "cc[0]", "listed more than once"),
        ({"cc": ["c@x.org", "C@x.org"]}, "cc[1]", "listed more than once"),
        ({"cc": ["c@x.org"], "bcc": ["C@X.ORG"]}, "bcc[0]", "listed more than once"),
    ],
)
def test_invalid_cc_and_bcc(overrides: dict[str, object], field: str, message: str) -> None:
    """A bad or repeated cc/bcc address is a 422 under its path (they are not recipients)."""
    errors = _field_errors(_body(**overrides))
    assert list(errors) == [field]
    assert message in errors[field]


# -- body_hash --------------------------------------------------------------------------------


def test_body_hash_ignores_key_order() -> None:
    """Bodies equal as JSON hash the same, however their keys were ordered on the wire."""
    first = orjson.loads(
        b'{"to": ["a@x.org"], "from": "b@x.org", "metadata": {"b": "1", "a": "2"}}'
    )
    second = orjson.loads(b'{"from":"b@x.org","metadata":{"a":"2","b":"1"},"to":["a@x.org"]}')
    assert body_hash(first) == body_hash(second)


def test_body_hash_differs_for_different_bodies() -> None:
    """A changed value changes the hash."""
    assert body_hash({"subject": "a"}) != body_hash({"subject": "b"})


def test_body_hash_is_sha256_of_the_canonical_json() -> None:
    """The hash is the 32-byte SHA-256 of the sorted-keys orjson encoding (as stored by
    earlier releases, so their keys still match)."""
    assert body_hash({"b": 1, "a": [2]}) == hashlib.sha256(b'{"a":[2],"b":1}').digest()


@pytest.mark.parametrize("named", ["mailgun", "Mailgun", " MG "])
def test_a_batch_may_pin_a_provider_by_name_or_code(named: str) -> None:
    assert _parse(_body(provider=named)).message.provider == "mg"


def test_a_batch_pins_nothing_unless_it_says_so() -> None:
    assert _parse(_body()).message.provider is None


@pytest.mark.parametrize("named", ["postmark", "", 7, ["sendgrid"]])
def test_a_pin_must_name_a_known_provider(named: object) -> None:
    names = ", ".join(info.name.lower() for info in CATALOG.values())
    assert _field_errors(_body(provider=named)) == {
        "provider": f"must name a provider configured here: {names}"
    }


def test_a_pin_must_name_a_provider_configured_here() -> None:
    refusal = _refusal(_body(provider="sendgrid"), configured=("mg",))

    assert refusal.fields == {"provider": "must name a provider configured here: mailgun"}


@pytest.mark.parametrize(
    ("priority", "recipients", "lane"),
    [
        (None, 2, "transactional"),
        (None, 3, "bulk"),
        ("bulk", 1, "bulk"),
        ("transactional", 3, "transactional"),
    ],
)
def test_the_lane_is_the_one_asked_for_else_by_size(
    priority: str | None, recipients: int, lane: str
) -> None:
    """Unset, a batch above the threshold's recipients goes bulk; a request's choice wins."""
    body = _body(to=[f"r{i}@x.org" for i in range(recipients)], priority=priority)

    assert _parse(body, bulk_threshold=2).message.lane == lane


def test_a_transactional_batch_stores_no_priority() -> None:
    """Transactional is the default: stored as absent, so older processes read the batch."""
    message = _parse(_body(priority="transactional")).message

    assert message.priority is None
    assert b"priority" not in message.encode()


@pytest.mark.parametrize("priority", ["urgent", "", 1, ["bulk"]])
def test_a_priority_must_be_transactional_or_bulk(priority: object) -> None:
    assert _field_errors(_body(priority=priority)) == {"priority": "must be transactional or bulk"}


# -- the model: what validating as BatchIn brings ---------------------------------------------


def test_a_comma_separated_cc_is_counted_in_addresses_not_characters() -> None:
    """A cc string longer than 100 characters is fine: the limit is 100 addresses."""
    copies = ", ".join(f"copy{i}@x.org" for i in range(20))
    assert len(_parse(_body(cc=copies)).message.cc) == 20


@pytest.mark.parametrize("name", ["from_", "list_"])
def test_pythons_names_of_fields_are_unknown_fields(name: str) -> None:
    """``from_`` and ``list_`` name the model's fields in Python, not the body's."""
    assert _field_errors(_body(**{name: "x"})) == {name: "unknown field"}


def test_rules_across_fields_are_checked_once_the_fields_are_valid() -> None:
    """A field error is reported alone; the rule across fields comes on the next try."""
    both = _body(to=["a@x.org", "b@x.org"], bulk=True, shared=True, subject="")
    assert _field_errors(both) == {"subject": "must not be empty"}
    assert "shared" in _field_errors({**both, "subject": "Hi"})


def test_a_shape_check_alone_builds_no_request() -> None:
    """``BatchIn`` validated without limits checks the shape the document states, no rule."""
    model = BatchIn.model_validate(_body(to=["not an address"]))
    with pytest.raises(ValueError, match="only the shape"):
        model.request()
