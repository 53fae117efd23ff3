"""Email addresses and header-safe text: parsing every address we accept, and the checks any
value that ends up in a mail header must pass.

This module owns:

* :func:`text_problem` — refuses CR, LF, NUL and the other line breaks (header injection),
  other control characters, lone surrogates, and the same hidden inside RFC 2047 encoded-words
  (``=?UTF-8?Q?=0A?=``), which are decoded here (a small decoder, at least as lenient as
  the stdlib's) rather than trusted to ``email.header``.
* :func:`parse_address` — one address as ``Name <addr>``, ``"Quoted, Name" <addr>``,
  ``<addr>`` or a bare ``addr``. The display name is split off by our own parser (no
  ``email.utils.parseaddr``): multiple addresses, groups, comments, unbalanced brackets or
  quotes and control characters are refused.
* :func:`normalize_email` — the bare address, validated by ``email_validator`` (no DNS), at most
  254 characters, a dot in the domain, special-use domains (``.test``, ``.local``, ...)
  refused. The result keeps the local part as given and lowercases the domain (IDNA domains
  in their ASCII form whenever the local part is ASCII).
* :func:`split_address_list` — a comma-separated list, commas inside quotes kept.

Everything here is pure.
"""

from __future__ import annotations

import base64
import codecs
import re
from dataclasses import dataclass

from email_validator import EmailNotValidError, validate_email

from shared.core.models import Address

#: RFC 5321 limit on a whole address (the forward path), in characters.
MAX_ADDRESS_LENGTH = 254
#: Longest display name we accept.
MAX_NAME_LENGTH = 256
#: Longest ``Name <addr>`` text we try to parse at all.
MAX_ADDRESS_TEXT = 1024

#: The message for a value that would break out of its header line.
INJECTION_MESSAGE = "must not contain CR, LF, NUL or other line breaks (header injection)"
ENCODED_INJECTION_MESSAGE = (
    "must not hide CR, LF, NUL or other line breaks in an RFC 2047 encoded-word (header injection)"
)
_MULTIPLE_MESSAGE = "holds more than one address"
_BLANKS = " \t"

# Everything str.splitlines() splits on, plus NUL.
_INJECTION_RE = re.compile("[\r\n\x00\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# C0 except TAB, DEL, C1, and lone surrogates (which no encoder can write out).
_CONTROL_RE = re.compile("[\x01-\x08\x0e-\x1b\x1f\x7f-\x9f\ud800-\udfff]")
# An encoded-word's head; its text runs to the next "?=" and, as leniently as the stdlib's
# email.header.ecre, may even hold '?'. The end is found with str.find rather than a lazy
# ".*?" in the pattern: that rescanned the rest of the text from every head without an end,
# quadratic in the length (3.2 s for 56 KB of "=?a?q? ").
_ENCODED_HEAD_RE = re.compile(r"=\?([^?]*)\?([qQbB])\?")
_NOT_BLANK_RE = re.compile(r"\S")
# Codecs whose decoders are quadratic in the input (punycode's insertion loop): a hostile
# charset label must not choose them. No mail client uses them as a MIME charset.
_SLOW_CODECS = frozenset({"punycode", "idna"})
_RAW_BREAK_RE = re.compile(b"[\r\n\x00]")
_Q_ESCAPE_RE = re.compile(b"=([0-9A-Fa-f]{2})")
_NOT_BASE64_RE = re.compile(b"[^A-Za-z0-9+/]")
#: Encoded-words inside decoded encoded-words are followed this deep, then refused.
_MAX_DEPTH = 3
# Outside quotes, these cannot appear in a display name (RFC 5322 specials; '.' is allowed
# as obs-phrase does; '<', '>', ',' and '"' are handled by the splitter).
_PHRASE_SPECIALS = frozenset("()[]:;@\\")


class AddressError(ValueError):
    """An address (or the text holding it) is not acceptable.

    ``injection`` is true when the text holds a line break or NUL: callers treat that as an
    attack on a header, never as an ordinary bad address.
    """

    def __init__(self, reason: str, *, injection: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.injection = injection


@dataclass(frozen=True, slots=True)
class TextProblem:
    """Why a text cannot go into a header; ``injection`` marks line breaks and NUL."""

    message: str
    injection: bool


def text_problem(text: str) -> TextProblem | None:
    """Return why ``text`` cannot go into a mail header, or None when it can."""
    return _text_problem(text, 0)


def _text_problem(text: str, depth: int) -> TextProblem | None:
    if _INJECTION_RE.search(text):
        return TextProblem(INJECTION_MESSAGE, injection=True)
    if _CONTROL_RE.search(text):
        return TextProblem("must not contain control characters or lone surrogates", False)
    for charset, data in _encoded_runs(text):
        if depth >= _MAX_DEPTH:
            return TextProblem("nests RFC 2047 encoded-words too deeply", injection=False)
        if _RAW_BREAK_RE.search(data):
            return TextProblem(ENCODED_INJECTION_MESSAGE, injection=True)
        inner = _text_problem(_decode_charset(data, charset), depth + 1)
        if inner is not None:
            if inner.injection:
                return TextProblem(ENCODED_INJECTION_MESSAGE, injection=True)
            return TextProblem(f"{inner.message} (inside an RFC 2047 encoded-word)", False)
    return None


def _encoded_runs(text: str) -> list[tuple[str, bytes]]:
    """Decode every encoded-word; adjacent ones (only whitespace between, same charset) are
    joined, as decoders join them, so a sequence split across words is seen whole."""
    runs: list[tuple[str, bytes]] = []
    if "=?" not in text:  # no encoded word can start: skip the regex (the common case)
        return runs
    charsets: list[str] = []
    parts: list[list[bytes]] = []  # joined once at the end: += on bytes would copy each time
    previous_end = 0
    head = _ENCODED_HEAD_RE.search(text)
    while head is not None:
        end = text.find("?=", head.end())
        if end < 0:  # no later head can have an end either
            break
        charset = head.group(1).split("*", 1)[0].strip().lower()
        payload = text[head.end() : end].encode("utf-8", "replace")
        data = _decode_q(payload) if head.group(2) in "qQ" else _decode_b(payload)
        joins = charsets and charsets[-1] == charset and _blank(text, previous_end, head.start())
        if joins:
            parts[-1].append(data)
        else:
            charsets.append(charset)
            parts.append([data])
        previous_end = end + 2
        head = _ENCODED_HEAD_RE.search(text, previous_end)
    return [(charset, b"".join(data)) for charset, data in zip(charsets, parts, strict=True)]


def _blank(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is only whitespace, without copying it."""
    return _NOT_BLANK_RE.search(text, start, end) is None


def _decode_q(payload: bytes) -> bytes:
    return _Q_ESCAPE_RE.sub(lambda m: bytes([int(m.group(1), 16)]), payload.replace(b"_", b" "))


def _decode_b(payload: bytes) -> bytes:
    """Decode base64 the lenient way: junk dropped, padding repaired, a dangling char ignored."""
    data = _NOT_BASE64_RE.sub(b"", payload)
    if len(data) % 4 == 1:
        data = data[:-1]
    return base64.b64decode(data + b"=" * (-len(data) % 4))


def _decode_charset(data: bytes, charset: str) -> str:
    try:
        codec = codecs.lookup(charset)
    except LookupError:
        codec = None
    if codec is None or codec.name in _SLOW_CODECS:
        return data.decode("utf-8", "replace")
    try:
        return data.decode(codec.name, "replace")
    except (LookupError, ValueError):  # a codec that is not a text codec
        return data.decode("utf-8", "replace")


def split_address_list(text: str) -> list[str]:
    """Split a comma-separated address list; commas in quoted names do not split.

    Empty items (``"a@x.org,,b@x.org,"``) are dropped; spaces and tabs around items are
    stripped, line breaks are not (so :func:`parse_address` still sees them).
    """
    if '"' not in text:
        items = text.split(",")
    else:
        items = []
        start = 0
        in_quote = escaped = False
        for index, char in enumerate(text):
            if escaped:
                escaped = False
            elif in_quote:
                escaped = char == "\\"
                in_quote = char != '"'
            elif char == '"':
                in_quote = True
            elif char == ",":
                items.append(text[start:index])
                start = index + 1
        items.append(text[start:])
    return [item.strip(_BLANKS) for item in items if item.strip(_BLANKS)]


def parse_address(text: str, *, ascii_only: bool = False) -> Address:
    """Parse one address with an optional display name into a normalised :class:`Address`.

    Raises:
        AddressError: the text is not exactly one valid address.
    """
    if len(text) > MAX_ADDRESS_TEXT:
        raise AddressError(f"is longer than {MAX_ADDRESS_TEXT} characters")
    plain = _plain(text)
    if plain is not None:
        return Address(email=plain)
    _check_text(text)
    phrase, angle = _split_angle(text.strip(_BLANKS))
    if angle is None:
        return Address(email=normalize_email(phrase, ascii_only=ascii_only))
    name = display_name(phrase)
    return Address(email=normalize_email(angle, ascii_only=ascii_only), name=name)


# Plain ASCII dot-atom addresses with an alphabetic TLD: by far the most common case, and
# email-validator's answer for them is fixed (local part as given, domain lower-cased). It
# costs ~33 µs an address, most of a 100-recipient request's CPU, so those skip it.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# \Z, not $: $ also matches before a trailing newline, which is header injection.
_PLAIN = re.compile(rf"({_ATOM}(?:\.{_ATOM})*)@((?:{_LABEL}\.)+([A-Za-z]{{2,63}}))\Z")
#: Special-use TLDs email-validator refuses; the fast path must refuse them too (by deferring).
_SPECIAL_TLDS = frozenset({"arpa", "invalid", "local", "localhost", "onion", "test"})


def _plain(text: str) -> str | None:
    """The normalised form of a plain ASCII dot-atom address given bare (no display name, no
    blanks, no encoded word), or None when it needs the full parse."""
    if len(text) > MAX_ADDRESS_LENGTH or "=?" in text:
        return None
    plain = _PLAIN.match(text)
    if plain and len(plain.group(1)) <= 64 and plain.group(3).lower() not in _SPECIAL_TLDS:
        return f"{plain.group(1)}@{plain.group(2).lower()}"
    return None


def address_key(address: str) -> str:
    """The one form under which an address is compared, de-duplicated, suppressed, located
    and hashed into its log id: its lower case. (The local part is case-sensitive in
    theory; no mailbox provider treats it so, and the original lowercased too.)"""
    return address.lower()


def normalize_email(text: str, *, ascii_only: bool = False) -> str:
    """Validate a bare address and return its normalised form.

    With ``ascii_only`` an address whose local part is not ASCII is refused (providers refuse
    Unicode in a sender address).

    Raises:
        AddressError: the address is invalid.
    """
    if len(text) > MAX_ADDRESS_LENGTH:
        raise AddressError(f"is longer than {MAX_ADDRESS_LENGTH} characters")
    plain = _plain(text)
    if plain is not None:
        return plain
    _check_text(text)
    try:
        result = validate_email(text, check_deliverability=False)
    except EmailNotValidError as exc:
        raise AddressError(str(exc)) from exc
    if result.ascii_email is None and ascii_only:
        raise AddressError("must be an ASCII address (providers refuse Unicode here)")
    return result.ascii_email or result.normalized


def display_name(text: str) -> str | None:
    """Check and clean a display name given as its own value (``{"name": ...}``).

    Whitespace runs collapse to one space; an empty name is None.

    Raises:
        AddressError: control characters, line breaks or too long.
    """
    _check_text(text)  # before collapsing whitespace, which would hide line breaks
    name = " ".join(text.split())
    if len(name) > MAX_NAME_LENGTH:
        raise AddressError(f"display name is longer than {MAX_NAME_LENGTH} characters")
    return name or None


def _check_text(text: str) -> None:
    problem = text_problem(text)
    if problem is not None:
        raise AddressError(problem.message, injection=problem.injection)


def _split_angle(text: str) -> tuple[str, str | None]:
    """Split ``phrase <addr>`` into the unquoted display name and the address.

    Returns ``(text, None)`` when there is no angle-addr (a bare address).
    """
    in_quote = escaped = False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif in_quote:
            escaped = char == "\\"
            in_quote = char != '"'
        elif char == '"':
            in_quote = True
        elif char == "<":
            return _unquote_phrase(text[:index]), _angle_content(text[index + 1 :])
        elif char == ">":
            raise AddressError("has an unbalanced '>'")
        elif char == ",":
            raise AddressError(_MULTIPLE_MESSAGE)
    if in_quote:
        raise AddressError("has an unterminated quoted string")
    return text, None


def _angle_content(rest: str) -> str:
    close = rest.find(">")
    if close < 0 or "<" in rest[:close]:
        raise AddressError("has an unbalanced '<'")
    tail = rest[close + 1 :]
    if "<" in tail or "," in tail:
        raise AddressError(_MULTIPLE_MESSAGE)
    if ">" in tail:
        raise AddressError("has an unbalanced '>'")
    if tail.strip():
        raise AddressError("has text after the address")
    return rest[:close].strip()


def _unquote_phrase(phrase: str) -> str:
    """Turn a display-name phrase into plain text (quotes removed, escapes resolved)."""
    out: list[str] = []
    in_quote = escaped = False
    for char in phrase:
        if escaped:
            out.append(char)
            escaped = False
        elif in_quote and char == "\\":
            escaped = True
        elif char == '"':
            in_quote = not in_quote
        elif not in_quote and char in _PHRASE_SPECIALS:
            raise AddressError(
                f"has an unquoted {char!r} in the display name; put the name in double quotes"
            )
        else:
            out.append(char)
    return "".join(out)
