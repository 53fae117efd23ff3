"""Unit tests for shared.core.addresses: address parsing, normalisation and header-safe text."""

from __future__ import annotations

import base64
import re

import pytest

from shared.core.addresses import (
    ENCODED_INJECTION_MESSAGE,
    INJECTION_MESSAGE,
    MAX_ADDRESS_TEXT,
    MAX_NAME_LENGTH,
    AddressError,
    display_name,
    normalize_email,
    parse_address,
    split_address_list,
    text_problem,
)


def _wrap(text: str) -> str:
    """One RFC 2047 base64 encoded-word holding ``text``."""
    return "=?utf-8?b?" + base64.b64encode(text.encode()).decode() + "?="


# -- parse_address: valid forms ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "email", "name"),
    [
        ("ann@x.org", "ann@x.org", None),
        ("  ann@x.org  ", "ann@x.org", None),
        ("Ann <ann@x.org>", "ann@x.org", "Ann"),
        ("<ann@x.org>", "ann@x.org", None),
        ("Ann<ann@x.org>", "ann@x.org", "Ann"),
        ("Ann < ann@x.org >", "ann@x.org", "Ann"),
        ('"Doe, Ann" <ann@x.org>', "ann@x.org", "Doe, Ann"),
        ('"Ann (Sales)" <ann@x.org>', "ann@x.org", "Ann (Sales)"),
        ('"A \\" B" <ann@x.org>', "ann@x.org", 'A " B'),
        ('"" <ann@x.org>', "ann@x.org", None),
        ("  Ann   B.   Lee  <ann@x.org>  ", "ann@x.org", "Ann B. Lee"),
        ("Zoë Ünal <zoe@x.org>", "zoe@x.org", "Zoë Ünal"),
        ("Ann <Ann.Lee@Mail.X.ORG>", "Ann.Lee@mail.x.org", "Ann"),
        ("ann+tag@x.org", "ann+tag@x.org", None),
        ("a@bücher.de", "a@xn--bcher-kva.de", None),
        ("é@x.org", "é@x.org", None),
    ],
)
def test_parse_address_accepts_valid_forms(text: str, email: str, name: str | None) -> None:
    """Bare, angle and quoted-name forms parse to the normalised address and clean name."""
    address = parse_address(text)
    assert (address.email, address.name) == (email, name)


# -- parse_address: invalid forms -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Ann <ann@x.org", "unbalanced '<'"),
        ("Ann <<ann@x.org>", "unbalanced '<'"),
        ("ann@x.org>", "unbalanced '>'"),
        ("Ann <ann@x.org>>", "unbalanced '>'"),
        ('"Ann <ann@x.org>', "unterminated quoted string"),
        ("ann@x.org, bob@x.org", "more than one address"),
        ("Ann <ann@x.org>, Bob <bob@x.org>", "more than one address"),
        ("<ann@x.org> <bob@x.org>", "more than one address"),
        ("Ann <ann@x.org> trailing", "text after the address"),
        ("Ann (Sales) <ann@x.org>", "unquoted '('"),
        ("Ann: <ann@x.org>", "unquoted ':'"),
        ("Ann; <ann@x.org>", "unquoted ';'"),
        ("Ann [x] <ann@x.org>", "unquoted '['"),
        ("Ann \\ <ann@x.org>", "unquoted '\\\\'"),
        ("evil@attacker.org <ann@x.org>", "unquoted '@'"),
        ("ann@x.org)<evil@attacker.org>", "unquoted '@'"),
        ('"evil@attacker.org,"@x.org', "Quoting"),
        ('"Ann" ann@x.org', "after close quote"),
        ("ann", "@-sign"),
        ("", "@-sign"),
        ("Ann <>", "@-sign"),
        ("ann@@x.org", "@-sign"),
        ("ann@localhost", "period"),
        ("ann@x", "period"),
        ("ann@x.test", "special-use"),
        ("ann@[192.0.2.1]", "bracketed IP"),
        ("Ann\x01 <ann@x.org>", "control characters"),
    ],
)
def test_parse_address_refuses_invalid_forms(text: str, reason: str) -> None:
    """Each malformed address is refused with a reason naming the problem."""
    with pytest.raises(AddressError, match=re.escape(reason)) as caught:
        parse_address(text)
    assert caught.value.injection is False


def test_parse_address_refuses_overlong_text() -> None:
    """Text longer than MAX_ADDRESS_TEXT is refused before any parsing."""
    with pytest.raises(AddressError, match=f"longer than {MAX_ADDRESS_TEXT}"):
        parse_address('"' + "a" * MAX_ADDRESS_TEXT + '" <ann@x.org>')


def test_parse_address_refuses_overlong_display_name() -> None:
    """A display name longer than MAX_NAME_LENGTH is refused."""
    with pytest.raises(AddressError, match="display name is longer"):
        parse_address("a" * (MAX_NAME_LENGTH + 1) + " <ann@x.org>")


@pytest.mark.parametrize(
    "text",
    [
        "Ann\r\n <ann@x.org>",
        "Ann\n<ann@x.org>",
        "Ann\x00 <ann@x.org>",
        "ann@x.org\r\nBcc: evil@attacker.org",
        "=?UTF-8?Q?Ann=0ABcc:_evil@attacker.org?= <ann@x.org>",
        '"=\\?utf-8?q?=0A?=" <ann@x.org>',
    ],
)
def test_parse_address_flags_header_injection(text: str) -> None:
    """Line breaks or NUL, raw or encoded (even behind quoting), are flagged as injection."""
    with pytest.raises(AddressError) as caught:
        parse_address(text)
    assert caught.value.injection is True


def test_parse_address_ascii_only_refuses_unicode_local_part() -> None:
    """With ascii_only, an address whose local part is not ASCII is refused."""
    with pytest.raises(AddressError, match="ASCII"):
        parse_address("Zoë <zoë@x.org>", ascii_only=True)


def test_parse_address_ascii_only_converts_idn_domain() -> None:
    """With ascii_only, an internationalised domain is given in its ASCII form."""
    assert parse_address("a@BÜCHER.de", ascii_only=True).email == "a@xn--bcher-kva.de"


# -- normalize_email --------------------------------------------------------------------------


def test_normalize_email_keeps_local_part_and_lowercases_domain() -> None:
    """The local part keeps its case; the domain is lowercased."""
    assert normalize_email("Ann.LEE@Example.COM") == "Ann.LEE@example.com"


def test_normalize_email_accepts_254_characters() -> None:
    """An address of exactly 254 characters is accepted."""
    address = "a" * 64 + "@" + "b" * 63 + "." + "c" * 63 + "." + "d" * 57 + ".com"
    assert len(address) == 254
    assert normalize_email(address) == address


def test_normalize_email_refuses_255_characters() -> None:
    """An address longer than 254 characters is refused."""
    address = "a" * 64 + "@" + "b" * 63 + "." + "c" * 63 + "." + "d" * 58 + ".com"
    with pytest.raises(AddressError, match="longer than 254"):
        normalize_email(address)


def test_normalize_email_refuses_display_name() -> None:
    """A bare-address field does not accept the ``Name <addr>`` form."""
    with pytest.raises(AddressError):
        normalize_email("Ann <ann@x.org>")


def test_normalize_email_flags_injection() -> None:
    """A line break in a bare address is flagged as injection."""
    with pytest.raises(AddressError) as caught:
        normalize_email("ann@x.org\n")
    assert caught.value.injection is True


# -- display_name -----------------------------------------------------------------------------


def test_display_name_collapses_whitespace() -> None:
    """Runs of spaces and tabs collapse to one space and the ends are trimmed."""
    assert display_name("  Ann \t  Lee ") == "Ann Lee"


def test_display_name_empty_is_none() -> None:
    """A blank name is no name."""
    assert display_name("   ") is None


def test_display_name_refuses_line_break() -> None:
    """A line break in a name is flagged as injection."""
    with pytest.raises(AddressError) as caught:
        display_name("Ann\r\nBcc: evil@attacker.org")
    assert caught.value.injection is True


# -- split_address_list -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "items"),
    [
        ("a@x.org, b@x.org", ["a@x.org", "b@x.org"]),
        (" a@x.org ,, b@x.org, ", ["a@x.org", "b@x.org"]),
        ("", []),
        ("a@x.org,\r\nb@x.org", ["a@x.org", "\r\nb@x.org"]),
        ('"Doe, Ann" <a@x.org>, b@x.org', ['"Doe, Ann" <a@x.org>', "b@x.org"]),
        ('"A \\", B" <a@x.org>,b@x.org', ['"A \\", B" <a@x.org>', "b@x.org"]),
    ],
)
def test_split_address_list(text: str, items: list[str]) -> None:
    """Commas split items except inside quoted strings; blanks are dropped."""
    assert split_address_list(text) == items


# -- text_problem -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Hello",
        "Tab\tseparated",
        "Zoë — ünïcode …",
        "=?utf-8?q?Caf=C3=A9_cr=C3=A8me?=",
        "=?UTF-8?B?SGVsbG8gV29ybGQ=?=",
        "=?x-unknown?q?hi?=",
        "=?hex?q?hi?=",
        "=?idna?q?hi?=",
        "=?utf-8?b?SGVsbG8?=",
        "=?utf-8?b?SGVsb?=",
        "=?utf-8?b?4oA=?= x =?utf-8?b?qA==?=",
        "=?utf-8?b?4oA=?= =?iso-8859-1?b?qA==?=",
        "a =? b ?= c",
        _wrap(_wrap(_wrap("hi"))),
    ],
)
def test_text_problem_accepts_safe_text(text: str) -> None:
    """Ordinary text and harmless encoded-words (any charset) pass."""
    assert text_problem(text) is None


@pytest.mark.parametrize(
    "text",
    ["a\rb", "a\nb", "a\x00b", "a\x0bb", "a\x0cb", "a\x1cb", "a\x85b", "a\u2028b", "a\u2029b"],
)
def test_text_problem_refuses_raw_line_breaks(text: str) -> None:
    """CR, LF, NUL and every other line break are header injection."""
    problem = text_problem(text)
    assert problem is not None
    assert (problem.message, problem.injection) == (INJECTION_MESSAGE, True)


@pytest.mark.parametrize("text", ["a\x01b", "a\x1bb", "a\x7fb", "a\x9bb", "a\ud800b"])
def test_text_problem_refuses_controls(text: str) -> None:
    """Other control characters and lone surrogates are refused, but not as injection."""
    problem = text_problem(text)
    assert problem is not None
    assert problem.injection is False
    assert "control characters" in problem.message


@pytest.mark.parametrize(
    "text",
    [
        "=?UTF-8?Q?=0A?=",
        "=?utf-8?q?=0d?=",
        "=?utf-8?q?=00?=",
        "Hi =?utf-8?Q?there=0D=0ABcc:_x@evil?=",
        "=?utf-8?b?Cg==?=",
        "=?utf-8?B?SGkNCkJjYzogeA?=",
        "=?utf-8*en?q?=0A?=",
        "=?utf-8?q?a?b=0A?=",
        "=?utf-7?q?+AAo-?=",
        "=?utf-8?b?4oCo?=",
        "=?iso-8859-1?q?=85?=",
        "=?utf-8?b?4oA=?= =?utf-8?b?qA==?=",
        "=?utf-8?q?=3D=3Futf-8=3Fq=3F=3D0A=3F=3D?=",
    ],
)
def test_text_problem_refuses_encoded_line_breaks(text: str) -> None:
    """Line breaks hidden in encoded-words (Q, B, charset tricks, split or nested) are injection."""
    problem = text_problem(text)
    assert problem is not None
    assert (problem.message, problem.injection) == (ENCODED_INJECTION_MESSAGE, True)


def test_text_problem_refuses_encoded_controls() -> None:
    """A control character hidden in an encoded-word is refused, but not as injection."""
    problem = text_problem("=?utf-8?q?=01?=")
    assert problem is not None
    assert problem.injection is False
    assert "inside an RFC 2047 encoded-word" in problem.message


def test_text_problem_refuses_deep_nesting() -> None:
    """Encoded-words nested more than three deep are refused."""
    problem = text_problem(_wrap(_wrap(_wrap(_wrap("hi")))))
    assert problem is not None
    assert "too deeply" in problem.message


@pytest.mark.parametrize(
    "address",
    [
        "ann@example.com",
        "Ann.Lee+tag@Mail.Example.ORG",
        "o'brien@x.org",
        "a!#$%&'*+/=?^_`{|}~-@sub-domain.example.co",
        "x@a-b.c-d.museum",
    ],
)
def test_fast_path_agrees_with_email_validator(address: str) -> None:
    """Plain ASCII addresses skip email-validator but normalise exactly as it would."""
    from email_validator import validate_email

    expected = validate_email(address, check_deliverability=False)

    assert normalize_email(address) == (expected.ascii_email or expected.normalized)


@pytest.mark.parametrize(
    "address",
    [
        "a@b.test",
        "a@b.local",
        "a..b@example.com",
        "a@-x.com",
        "a@localhost",
        "ann@example.com\n",
        "ann@example.com\r\nBcc: x@evil.com",
    ],
)
def test_fast_path_still_refuses_what_email_validator_refuses(address: str) -> None:
    """Special-use domains and malformed shapes fall through to the full check and fail."""
    with pytest.raises(AddressError):
        normalize_email(address)
