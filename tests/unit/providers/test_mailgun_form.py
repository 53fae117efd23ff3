"""The Mailgun messages form built from a chunk (no network)."""

from __future__ import annotations

import email
import email.policy
import urllib.parse

import orjson
import pytest

from shared.core.errors import PermanentProviderError
from shared.core.models import Address, Attachment
from shared.providers.mailgun import (
    URLENCODED,
    build_form,
    encoded_body,
    encoded_form,
    format_address,
    parse_message_id,
    urlencode,
)
from tests.unit.providers.fakes import BATCH_ID, chunk, recipient

ANN = recipient("ann@example.org", "Ann", {"-first-": "Ann"})
BOB = recipient("bob@example.org", None, {"-first-": "Bob"})


def values(form: list[tuple[str, str]], name: str) -> list[str]:
    return [v for k, v in form if k == name]


def test_sender_subject_and_bodies() -> None:
    """from is 'Name <email>'; subject, text and html are sent as given."""
    form = build_form(chunk(text="plain", html="<p>rich</p>"))

    assert values(form, "from") == ["Example News <news@example.com>"]
    assert values(form, "subject") == ["Hello"]
    assert values(form, "text") == ["plain"]
    assert values(form, "html") == ["<p>rich</p>"]


def test_missing_text_is_not_sent() -> None:
    """Without a text part no text field is sent."""
    assert values(build_form(chunk(html="<p>x</p>")), "text") == []


def test_to_repeats_per_recipient() -> None:
    """Every recipient is one to field, named when it has a name."""
    form = build_form(chunk([ANN, BOB]))

    assert values(form, "to") == ["Ann <ann@example.org>", "bob@example.org"]


def test_correlation_variables() -> None:
    """v:batch_id and v:chunk are on every message."""
    form = build_form(chunk([ANN], index=4))

    assert values(form, "v:batch_id") == [str(BATCH_ID)]
    assert values(form, "v:chunk") == ["4"]


def test_shared_sends_no_recipient_variables() -> None:
    """shared: no recipient-variables and no log_id, so Mailgun sends one message to all."""
    form = build_form(chunk([ANN, BOB]))

    assert values(form, "recipient-variables") == []
    assert values(form, "v:log_id") == []


def test_bulk_recipient_variables_carry_log_ids() -> None:
    """bulk: recipient-variables map each address to its log_id; v:log_id refers to it."""
    form = build_form(chunk([ANN, BOB], bulk=True))

    variables = orjson.loads(values(form, "recipient-variables")[0])
    assert variables["ann@example.org"]["log_id"] == str(ANN.log_id)
    assert variables["bob@example.org"]["log_id"] == str(BOB.log_id)
    assert values(form, "v:log_id") == ["%recipient.log_id%"]


def test_bulk_substitutions_become_recipient_variables() -> None:
    """bulk: each key in subject and bodies is rewritten to a recipient variable."""
    form = build_form(
        chunk(
            [ANN, BOB], bulk=True, subject="Hi -first-", text="Dear -first-", html="<b>-first-</b>"
        )
    )

    variables = orjson.loads(values(form, "recipient-variables")[0])
    assert values(form, "subject") == ["Hi %recipient.s0%"]
    assert values(form, "text") == ["Dear %recipient.s0%"]
    assert values(form, "html") == ["<b>%recipient.s0%</b>"]
    assert (variables["ann@example.org"]["s0"], variables["bob@example.org"]["s0"]) == (
        "Ann",
        "Bob",
    )


def test_bulk_missing_substitution_keeps_key_text() -> None:
    """bulk: a recipient lacking a key sees the key itself, as SendGrid leaves it."""
    form = build_form(chunk([ANN, recipient("c@example.org")], bulk=True, text="-first-"))

    variables = orjson.loads(values(form, "recipient-variables")[0])
    assert variables["c@example.org"]["s0"] == "-first-"


def test_bulk_keys_the_texts_do_not_hold_get_no_variable() -> None:
    """bulk: a key found in no text gets no recipient variable (each would be one per
    recipient for nothing)."""
    people = [
        recipient("a@example.org", substitutions={"-first-": "A", "-unused-": "x"}),
        recipient("b@example.org", substitutions={"-other-": "y"}),
    ]

    form = build_form(chunk(people, bulk=True, subject="Hi", text="Dear -first-"))

    variables = orjson.loads(values(form, "recipient-variables")[0])
    assert values(form, "text") == ["Dear %recipient.s0%"]
    assert variables["a@example.org"] == {"log_id": str(people[0].log_id), "s0": "A"}
    assert variables["b@example.org"] == {"log_id": str(people[1].log_id), "s0": "-first-"}


def test_bulk_variables_over_the_largest_message_are_refused_before_they_are_built() -> None:
    """bulk: 1,000 recipients with 3 keys each, all in the html, would carry 3,000 variables
    each (over 25 MB together): refused as unsendable by Mailgun."""
    people = [
        recipient(f"r{i}@example.org", substitutions={f"-k{i}-{j}-": "v" for j in range(3)})
        for i in range(1000)
    ]
    html = " ".join(key for r in people for key in r.substitutions)

    with pytest.raises(PermanentProviderError, match="over Mailgun's 25,000,000"):
        build_form(chunk(people, bulk=True, html=html))


def test_shared_common_substitutions_are_applied() -> None:
    """shared: substitutions common to every recipient are replaced in the text."""
    people = [
        recipient("a@example.org", substitutions={"-team-": "red"}),
        recipient("b@example.org", substitutions={"-team-": "red"}),
    ]

    form = build_form(chunk(people, subject="Team -team-", text="Go -team-"))

    assert values(form, "subject") == ["Team red"]
    assert values(form, "text") == ["Go red"]


def test_cc_bcc_and_reply_to() -> None:
    """cc, bcc and h:Reply-To are formatted addresses on chunk 0."""
    form = build_form(
        chunk(
            [ANN],
            cc=[Address(email="boss@example.com", name="The Boss")],
            bcc=[Address(email="audit@example.com")],
            reply_to=Address(email="help@example.com", name="Help"),
        )
    )

    assert values(form, "cc") == ["The Boss <boss@example.com>"]
    assert values(form, "bcc") == ["audit@example.com"]
    assert values(form, "h:Reply-To") == ["Help <help@example.com>"]


def test_no_cc_on_later_chunks() -> None:
    """Chunks after the first carry no cc/bcc."""
    form = build_form(chunk([ANN], index=1, cc=[Address(email="boss@example.com")]))

    assert values(form, "cc") == []


def test_custom_headers_and_tags() -> None:
    """Custom headers become h: fields; only the first 3 categories become o:tag."""
    form = build_form(chunk(headers={"X-Campaign": "spring"}, categories=["a", "b", "c", "d"]))

    assert values(form, "h:X-Campaign") == ["spring"]
    assert values(form, "o:tag") == ["a", "b", "c"]


def test_metadata_is_not_sent() -> None:
    """Metadata stays with the batch: it appears in no field."""
    form = build_form(chunk(metadata={"order": "A-17"}))

    assert not any("A-17" in v for _, v in form)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Doe, John", '"Doe, John" <j@example.com>'),
        ('Say "hi"', '"Say \\"hi\\"" <j@example.com>'),
        ("Zoë", "=?utf-8?q?Zo=C3=AB?= <j@example.com>"),
        (None, "j@example.com"),
        ("", "j@example.com"),
    ],
)
def test_format_address_quotes_names(name: str | None, expected: str) -> None:
    """Names with specials are quoted, non-ASCII ones encoded, missing ones omitted."""
    assert format_address("j@example.com", name) == expected


def test_format_address_keeps_non_ascii_address() -> None:
    """An internationalised address is kept as is, with its name still quoted."""
    assert format_address("zoë@example.com", "Z, A") == '"Z, A" <zoë@example.com>'


def test_invalid_chunk_is_refused_before_building() -> None:
    """The envelope rules apply: a reserved header raises with provider code mg."""
    with pytest.raises(PermanentProviderError) as caught:
        build_form(chunk(headers={"From": "x@example.com"}))

    assert caught.value.provider == "mg"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"id":"<2011.1@samples.mailgun.org>","message":"Queued. Thank you."}',
            "2011.1@samples.mailgun.org",
        ),
        (b'{"message":"Queued. Thank you."}', None),
        (b'{"id":""}', None),
        (b"not json", None),
        (b"[1]", None),
    ],
)
def test_parse_message_id(body: bytes, expected: str | None) -> None:
    """The 200 body's id loses its angle brackets; anything else gives None."""
    assert parse_message_id(body) == expected


def test_the_form_body_is_the_standard_librarys_encoding_byte_for_byte() -> None:
    """Every byte value, spaces, reserved and non-ASCII characters are quoted exactly as
    ``urllib.parse.urlencode`` quotes them, and so is a real bulk form."""
    every_byte = "".join(map(chr, range(256)))
    form = [
        ("h:X-Note", every_byte),
        ("subject", "Prix: 10 € & plus = 100% {{first_name}} ~_.-"),
        ("to", '"Zoë, Ltd" <zoe@example.org>'),
        ("", ""),
        ("emoji", "\U0001f4e7 mail"),
    ]
    assert urlencode(form) == urllib.parse.urlencode(form).encode()
    bulk = chunk(
        [recipient("a@example.org", "Ä B", {"{{n}}": "x&y=z"}), recipient("b@example.org")],
        bulk=True,
        text="Hi {{n}}\r\n<b>",
    )
    assert encoded_form(bulk) == urllib.parse.urlencode(build_form(bulk)).encode()


def test_a_message_without_files_is_urlencoded() -> None:
    sample = chunk([ANN], text="hi")
    assert encoded_body(sample) == (encoded_form(sample), URLENCODED)


def test_a_message_with_files_is_multipart_read_back_by_a_mime_parser() -> None:
    """Fields as text parts, then each file part (``inline`` named by its Content-ID); a
    quote or backslash in a name survives as a quoted-string."""
    files = (
        Attachment(filename='say "hi".txt', content_type="text/plain", content="aGk="),
        Attachment(
            filename="l.png",
            content_type="image/png",
            content="iVBO",
            disposition="inline",
            content_id="logo",
        ),
    )
    sample = chunk([ANN], text="hi", headers={'X-"Q\\': "v"}, attachments=files)
    body, content_type = encoded_body(sample)
    parsed = email.message_from_bytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body, policy=email.policy.HTTP
    )
    parts = [
        (p.get_param("name", header="content-disposition"), p.get_filename(), p.get_content())
        for p in parsed.iter_parts()
    ]
    assert ("text", None, "hi") in parts
    assert ('h:X-"Q\\', None, "v") in parts
    assert parts[-2:] == [
        ("attachment", 'say "hi".txt', "hi"),
        ("inline", "logo", b"\x89PN"),
    ]
