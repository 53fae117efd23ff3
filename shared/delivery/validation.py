"""The rules of the ``POST /v1/batches`` body, a :class:`BatchRequest` or an
:class:`InvalidRequest` carrying every field error out of :func:`parse_batch_request`.

The body is validated as ``shared.delivery.batch_in.BatchIn``, the model the OpenAPI document
states: its validators call this module's rules on the parsed fields. This module owns the
rules: the limits (subject, headers, categories, metadata, substitutions, the recipient cap),
header-injection refusal in every value bound for a header (via :mod:`shared.core.addresses`),
the split of ``to`` into accepted, rejected (a bad address is reported in the 202, it does not
fail the batch) and suppressed recipients, and :func:`body_hash` for Idempotency-Key
comparisons.

Rules worth knowing:

* ``null`` for an optional field means the field is absent.
* A ``to`` entry holding a line break or NUL is an attack, not a typo: 422, never "rejected".
* Every address must have an ASCII local part (the providers do not do SMTPUTF8);
  internationalised domains are accepted and converted to their ASCII (punycode) form.
* ``cc``/``bcc`` are not recipients: a bad address there is a 422 (``cc[0]``), and so is an
  address listed twice across ``to``, ``cc`` and ``bcc`` (providers refuse that).
* A substitution value may hold line breaks (bodies are multi-line) unless its key appears in
  the subject or a custom header value, where it would be substituted into a header. A key that
  appears in ``from`` or ``reply_to`` (SendGrid substitutes into reply-to) is stricter still:
  its value may not hold quotes or address punctuation either, which could turn one reply-to
  address into another, or into several.
* Every field error is reported at once. The rules across fields (html or text, cc/bcc with
  ``bulk`` or more than one recipient, ``bulk`` with ``shared``) are checked once every field
  is valid, and ``cc``/``bcc`` against ``to`` once ``to`` is: a body wrong both ways hears of
  the second on its next try.
* The cap counts distinct valid ``to`` addresses before suppression. A list with more than
  ``2 * max_recipients + 100`` entries is refused without reading it; a shorter one is read
  whole before the cap is applied (at most about twice the work of a batch at the cap).

Pure: no I/O; the suppression lookup is the caller's callback.
"""

from __future__ import annotations

import binascii
import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from shared.accounts.preferences import Preferences
from shared.core import lanes
from shared.core.addresses import (
    AddressError,
    address_key,
    display_name,
    normalize_email,
    parse_address,
    text_problem,
)
from shared.core.catalog import CATALOG, CODES, code_of
from shared.core.errors import SafedelivrError
from shared.core.models import (
    Address,
    Attachment,
    Engagement,
    Message,
    is_request_reserved_header,
)
from shared.core.substitution import Substitution

InvalidRequestCode = Literal["invalid_fields", "no_recipients", "too_many_recipients"]
INVALID_FIELDS: Final = "invalid_fields"
NO_RECIPIENTS: Final = "no_recipients"
TOO_MANY_RECIPIENTS: Final = "too_many_recipients"

MAX_SUBJECT_LENGTH = 998
MAX_HEADERS = 50
MAX_HEADER_NAME_LENGTH = 128
MAX_HEADER_VALUE_LENGTH = 998
MAX_CATEGORIES = 10
MAX_CATEGORY_LENGTH = 255
MAX_METADATA_BYTES = 10_000
MAX_COPY_ADDRESSES = 100
"""Most addresses in each of ``cc`` and ``bcc``."""
MAX_REJECTED_LENGTH = 320
"""A rejected entry is echoed back cut to this many characters."""
MAX_SUBSTITUTIONS = 100
MAX_SUBSTITUTION_KEY_LENGTH = 128
MAX_SUBSTITUTIONS_BYTES = 10_000
"""Per recipient, JSON-encoded (SendGrid's limit per personalization)."""
MAX_ATTACHMENTS = 10
MAX_FILENAME_LENGTH = 255
MAX_CONTENT_ID_LENGTH = 78
"""SES's limit (``Attachment.ContentId``), the smallest of the providers'."""
MAX_ATTACHMENTS_BYTES = 7 * 1024 * 1024
"""Decoded bytes of all of a batch's attachments together: as base64 (4/3 of it, 9.33 MiB)
they fit in the API's default body cap (``SAFEDELIVR_API_MAX_BODY_BYTES``, 10 MiB) with room
for the rest of the body. A chain whose smallest provider takes less lowers it
(:func:`attachments_limit`)."""
MIME_BASE64_SHARE = 0.7
"""Of a provider's largest message, what decoded attachments may fill: base64 in MIME is
about 1.37 times the file (4/3, plus a line break every 76 characters)."""


#: The top-level fields of a batch request.
FIELDS: Final = frozenset(
    [
        "from",
        "to",
        "subject",
        "html",
        "text",
        "reply_to",
        "cc",
        "bcc",
        "headers",
        "bulk",
        "priority",
        "shared",
        "tracking",
        "unsubscribe",
        "list",
        "categories",
        "metadata",
        "provider",
        "attachments",
    ]
)

_HEADER_NAME_RE = re.compile(r"[!-9;-~]+")  # RFC 5322 ftext: printable ASCII but ':'
_METADATA_KEY_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PATH_KEY_RE = re.compile(r"[!-~ ]{1,100}")
_BODY_FORBIDDEN_RE = re.compile("[\x00\ud800-\udfff]")
_ADDRESS_KEYS = frozenset({"email", "name"})
_ATTACHMENT_KEYS = frozenset({"filename", "content_type", "content", "disposition", "content_id"})
# RFC 6838 4.2 type and subtype names (restricted-name).
_CONTENT_TYPE_RE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
)
# A Content-ID's text between its angle brackets (RFC 2392 msg-id characters, no space).
_CONTENT_ID_RE = re.compile(rf"[A-Za-z0-9!#$%&'*+./=?^_`{{|}}~@-]{{1,{MAX_CONTENT_ID_LENGTH}}}")
# A file name may not hold control characters (C0, DEL, C1), path separators or surrogates.
_FILENAME_FORBIDDEN_RE = re.compile("[\x00-\x1f\x7f-\x9f/\\\\\ud800-\udfff]")
_ADDRESS_FORMS = "must be an address string or an object {email, name}"

Errors = dict[str, str]


class InvalidRequest(SafedelivrError):
    """The batch request cannot be accepted (HTTP 422).

    Attributes:
        code: ``invalid_fields``, ``no_recipients`` or ``too_many_recipients``.
        message: a one-line summary for the error body.
        fields: per-field messages, keyed like ``subject``, ``to[3]``, ``headers.X-Foo``.
    """

    status = 422

    def __init__(
        self,
        fields: Mapping[str, str],
        *,
        code: InvalidRequestCode = INVALID_FIELDS,
        message: str | None = None,
    ) -> None:
        self.fields = dict(fields)
        self.code: InvalidRequestCode = code
        self.message = message or f"the request has {len(self.fields)} invalid field(s)"
        super().__init__(self.message)


@dataclass(frozen=True, slots=True)
class RecipientInput:
    """A valid, distinct ``to`` address with its personalisation."""

    email: str
    name: str | None = None
    substitutions: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A ``to`` entry that is not a valid address, as given, and why."""

    email: str
    reason: str


@dataclass(frozen=True, slots=True)
class Wanted:
    """What a request asks of tracking and unsubscribe (None: the user's default)."""

    opens: bool | None = None
    clicks: bool | None = None
    unsubscribe: bool | None = None
    list: str | None = None

    @property
    def asks(self) -> bool:
        """Whether the request itself asks for something only personal copies can carry."""
        return bool(self.opens or self.clicks or self.unsubscribe)


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """An accepted batch request."""

    message: Message
    recipients: tuple[RecipientInput, ...]
    rejected: tuple[Rejected, ...] = ()
    suppressed: tuple[str, ...] = ()
    skipped: tuple[Rejected, ...] = ()
    """Every address left out by choice (suppressed, or inside the cooldown), with why."""
    wants: Wanted = field(default_factory=Wanted)
    warnings: tuple[str, ...] = ()
    """What the 202 answer tells the sender the batch goes without (``with_engagement``)."""

    @property
    def accepted(self) -> int:
        return len(self.recipients)

    @property
    def mailed(self) -> int:
        """Addresses this batch mails: recipients, cc and bcc. Quotas count these, so
        copies are not a way around them."""
        return len(self.recipients) + len(self.message.cc) + len(self.message.bcc)


def body_hash(body: object) -> bytes:
    """SHA-256 of the canonical JSON (keys sorted) of a decoded request body.

    Two bodies that differ only in key order or whitespace hash the same.
    """
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).digest()


#: Above these, validating a body is worth a worker thread (~10 ms of work and more), so one
#: large batch does not stall every other request on the event loop while it is checked.
LARGE_RECIPIENT_ENTRIES = 1_000
LARGE_TEXT_LENGTH = 512 * 1024
#: Characters of what is given per recipient (addresses, names, substitution keys and values)
#: above which the body is large: each may be checked as header text, encoded-words decoded,
#: at about 0.25 us a character (a body's character costs a hundredth of that).
LARGE_RECIPIENT_TEXT = 32 * 1024
#: What one substitution counts for beyond its characters: the checks of a key and value.
SUBSTITUTION_WEIGHT = 8


def is_large(raw: object) -> bool:
    """Whether validating the decoded body ``raw`` is heavy enough to run off the event loop:
    counted from its shape (list lengths, text lengths, and what each recipient brings),
    reading no further than it takes to know."""
    if not isinstance(raw, Mapping):
        return False
    entries = [v for k in ("to", "cc", "bcc") if isinstance(v := raw.get(k), list)]
    text = sum(len(v) for k in ("html", "text") if isinstance(v := raw.get(k), str))
    text += _attachments_length(raw.get("attachments"))
    if sum(map(len, entries)) > LARGE_RECIPIENT_ENTRIES or text > LARGE_TEXT_LENGTH:
        return True
    given = 0
    for entry in (e for listed in entries for e in listed):
        given += _given_length(entry)
        if given > LARGE_RECIPIENT_TEXT:
            return True
    return False


def _attachments_length(value: object) -> int:
    """The characters of the attachments' contents (their base64 is checked character by
    character): more than the most allowed counts as large without reading further."""
    if not isinstance(value, list):
        return 0
    if len(value) > MAX_ATTACHMENTS:
        return LARGE_TEXT_LENGTH + 1
    return sum(
        len(content)
        for item in value
        if isinstance(item, Mapping) and isinstance(content := item.get("content"), str)
    )


def _given_length(entry: object) -> int:
    """What one ``to``, ``cc`` or ``bcc`` entry weighs for :func:`is_large`. A substitution
    map with more keys than allowed is refused unread, but counting it would read it all:
    it is large without being read."""
    if isinstance(entry, str):
        return len(entry)
    if not isinstance(entry, Mapping):
        return 0
    size = sum(len(v) for k in ("email", "name") if isinstance(v := entry.get(k), str))
    substitutions = entry.get("substitutions")
    if isinstance(substitutions, Mapping):
        if len(substitutions) > MAX_SUBSTITUTIONS:
            return LARGE_RECIPIENT_TEXT + 1
        for key, value in substitutions.items():
            size += len(key) + (len(value) if isinstance(value, str) else 0) + SUBSTITUTION_WEIGHT
    return size


def parse_batch_request(
    raw: object,
    *,
    max_recipients: int,
    configured: Sequence[str] = CODES,
    bulk_threshold: int = 1_000,
) -> BatchRequest:
    """Validate a decoded ``POST /v1/batches`` body (suppression is :func:`drop_suppressed`):
    ``batch_in.BatchIn`` parses it, its validators applying this module's rules with these
    run-time limits.

    Raises:
        InvalidRequest: with every field error collected (``invalid_fields``), or
            ``too_many_recipients``, or ``no_recipients`` when every entry is rejected.
    """
    # Imported here: the model's validators are this module's rules, so it imports this one.
    from shared.delivery.batch_in import Limits, parse

    return parse(raw, Limits(max_recipients, tuple(configured), bulk_threshold))


#: A list or campaign name: what a one-click unsubscribe is scoped to.
_LIST_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")
LIST_NAME_RULE: Final = "must be 1-64 letters, digits and _.:- (starting with a letter or digit)"


def list_name(value: object) -> bool:
    """Whether ``value`` is a valid list or campaign name."""
    return isinstance(value, str) and bool(_LIST_NAME.match(value))


#: Why a bulk-lane batch goes without the one-click unsubscribe it would have by default
#: (the 202 answer's ``warnings``).
SHARED_NO_UNSUBSCRIBE: Final = (
    "bulk lane without one-click unsubscribe: shared messages cannot carry it (Gmail and "
    "Yahoo require it of bulk senders; send one copy per recipient, or say "
    '"unsubscribe": false)'
)
UNTRACKED_NO_UNSUBSCRIBE: Final = (
    "bulk lane without one-click unsubscribe: this deployment has no tracking endpoint to carry it"
)


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Whether each copy carries List-Unsubscribe and List-Unsubscribe-Post, and why not
    when the bulk lane's default could not apply."""

    on: bool
    warning: str | None = None


def unsubscribe_of(
    *,
    lane: lanes.Priority,
    asked: bool | None,
    preferred: bool,
    listed: bool,
    shared: bool,
    tracking: bool,
) -> Unsubscribe:
    """A batch's one-click unsubscribe: what the request says (``asked``), else on when the
    user prefers it, the batch names a list, or it goes in the bulk lane (Gmail and Yahoo
    require one-click unsubscribe of bulk senders). A shared message cannot carry it (one
    copy, no recipient's own token): it goes without, and in the bulk lane the answer says
    why (``unsubscribe: true`` asked of one is refused before, by :func:`with_engagement`).
    Without tracking the bulk lane's default does not apply either (the user asked nothing
    that could be refused) and the answer says so. Pure."""
    bulk = lane == "bulk"
    if asked is not None:
        return Unsubscribe(asked and not shared)
    if shared:
        return Unsubscribe(False, SHARED_NO_UNSUBSCRIBE if bulk else None)
    if preferred or listed:
        return Unsubscribe(True)
    if bulk:
        return Unsubscribe(True) if tracking else Unsubscribe(False, UNTRACKED_NO_UNSUBSCRIBE)
    return Unsubscribe(False)


def with_engagement(
    request: BatchRequest, prefs: Preferences, *, tracking: bool = True
) -> BatchRequest:
    """The request's message with its tracking and unsubscribe settled: what the request
    asks, else the user's preferences; a ``list`` and the bulk lane imply the unsubscribe
    header (:func:`unsubscribe_of`; ``tracking``: whether this deployment's mail carries
    tokens). Only personal copies can carry them: a shared message asked for them is a 422,
    and one that only inherits them goes without (with a warning in the bulk lane).

    Raises:
        InvalidRequest: tracking or unsubscribe asked of a shared message.
    """
    wants, message = request.wants, request.message
    shared = not message.bulk
    if shared and wants.asks:
        raise InvalidRequest(
            {
                "shared": "tracking and unsubscribe need one copy per recipient (each "
                "carries the recipient's own links): not with shared: true"
            }
        )
    unsubscribe = unsubscribe_of(
        lane=message.lane,
        asked=wants.unsubscribe,
        preferred=prefs.unsubscribe,
        listed=wants.list is not None,
        shared=shared,
        tracking=tracking,
    )
    if unsubscribe.warning is not None:
        request = dataclasses.replace(request, warnings=(*request.warnings, unsubscribe.warning))
    if shared:
        if wants.list is None:
            return request
        # No unsubscribe link in a shared message, but its list's unsubscribes still apply.
        return dataclasses.replace(
            request, message=message.model_copy(update={"engagement": Engagement(list=wants.list)})
        )
    engagement = Engagement(
        opens=prefs.track_opens if wants.opens is None else wants.opens,
        clicks=prefs.track_clicks if wants.clicks is None else wants.clicks,
        unsubscribe=unsubscribe.on,
        list=wants.list,
    )
    if not engagement.any and engagement.list is None:
        return request
    return dataclasses.replace(
        request, message=message.model_copy(update={"engagement": engagement})
    )


def _path_key(key: object) -> str:
    """A user-supplied key as it may appear in an error path: printable, bounded."""
    text = str(key)
    if _PATH_KEY_RE.fullmatch(text):
        return text
    return json.dumps(text[:100])  # quoted, control characters and surrogates escaped


def _text(value: object, path: str, errors: Errors, *, max_length: int) -> str | None:
    """A header-bound string: type, length and injection checked; None after an error."""
    if not isinstance(value, str):
        errors[path] = "must be a string"
        return None
    if len(value) > max_length:
        errors[path] = f"must be at most {max_length} characters"
        return None
    problem = text_problem(value)
    if problem is not None:
        errors[path] = problem.message
        return None
    return value


def _subject(value: object, errors: Errors) -> str:
    if value is None:
        errors["subject"] = "is required"
        return ""
    subject = _text(value, "subject", errors, max_length=MAX_SUBJECT_LENGTH)
    if subject is not None and not subject.strip():
        errors["subject"] = "must not be empty"
    return subject or ""


def _body(value: object, path: str, errors: Errors) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        errors[path] = "must be a string"
        return None
    if _BODY_FORBIDDEN_RE.search(value):
        errors[path] = "must not contain NUL or lone surrogates"
        return None
    return value


def _provider(value: object, configured: Sequence[str], errors: Errors) -> str | None:
    """The provider a batch pins (by name or code, any case), if it is one configured here."""
    if value is None:
        return None
    code = code_of(value) if isinstance(value, str) else None
    if code is None or code not in configured:
        names = ", ".join(CATALOG[c].name.lower() for c in configured if c in CATALOG)
        errors["provider"] = f"must name a provider configured here: {names}"
    return code


def _priority(
    value: object, recipients: int, threshold: int, errors: Errors
) -> lanes.Priority | None:
    """The batch's lane as stored: None for transactional, so a batch that is not bulk reads
    the same as before lanes existed (``Message.encode`` leaves it out)."""
    try:
        chosen = lanes.lane(value, recipients, threshold)
    except lanes.ScheduleError as exc:
        errors["priority"] = str(exc)
        return None
    return None if chosen == "transactional" else chosen


def one_copy_each(*, shared: bool, recipients: int, copies: bool) -> bool | None:
    """Whether each recipient gets a message of their own (``Message.bulk``); None when the
    request cannot be honoured as it stands.

    One copy each is the default, so recipients never see one another unless the sender asks
    with ``shared: true`` (``bulk: false`` no longer means shared: it showed every address to
    every recipient). cc and bcc go with one shared message: with a single recipient that is
    the same thing; with several, the sender must say ``shared``.
    """
    if shared:
        return False
    if copies:
        return None if recipients > 1 else False
    return True


def _address(value: object, path: str, errors: Errors) -> Address | None:
    """One address in either form; any problem is a field error."""
    if isinstance(value, str):
        try:
            return parse_address(value, ascii_only=True)
        except AddressError as exc:
            errors[path] = exc.reason
            return None
    if isinstance(value, dict):
        return _address_object(value, path, errors)
    errors[path] = _ADDRESS_FORMS
    return None


def _address_object(value: dict[Any, Any], path: str, errors: Errors) -> Address | None:
    _unknown_keys(value, _ADDRESS_KEYS, path, errors)
    name = _name(value.get("name"), f"{path}.name", errors)
    email = value.get("email")
    if not isinstance(email, str):
        errors[f"{path}.email"] = "is required" if email is None else "must be a string"
        return None
    try:
        email = normalize_email(email.strip(" \t"), ascii_only=True)
    except AddressError as exc:
        errors[f"{path}.email"] = exc.reason
        return None
    return Address(email=email, name=name)


def _unknown_keys(
    value: Mapping[Any, Any], known: frozenset[str], path: str, errors: Errors
) -> None:
    for key in value:
        if key not in known:
            errors[f"{path}.{_path_key(key)}"] = "unknown field"


def _name(value: object, path: str, errors: Errors) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        errors[path] = "must be a string"
        return None
    try:
        return display_name(value)
    except AddressError as exc:
        errors[path] = exc.reason
        return None


def _headers(value: object, errors: Errors) -> dict[str, str]:
    headers: dict[str, str] = {}
    if value is None:
        return headers
    if not isinstance(value, dict):
        errors["headers"] = "must be an object of header names to string values"
        return headers
    if len(value) > MAX_HEADERS:
        errors["headers"] = f"must hold at most {MAX_HEADERS} headers"
        return headers
    seen: set[str] = set()
    for name, header_value in value.items():
        path = f"headers.{_path_key(name)}"
        problem = _header_name_problem(name, seen)
        if problem is not None:
            errors[path] = problem
            continue
        seen.add(str(name).lower())
        checked = _text(header_value, path, errors, max_length=MAX_HEADER_VALUE_LENGTH)
        if checked is not None:
            headers[name] = checked
    return headers


#: Why a header a request may not set is refused (``shared.core.models``' reserved headers).
HEADER_RESERVED: Final = "is reserved: set it through the request's own field, or not at all"


def _header_name_problem(name: object, seen: set[str]) -> str | None:
    if (
        not isinstance(name, str)
        or len(name) > MAX_HEADER_NAME_LENGTH
        or not _HEADER_NAME_RE.fullmatch(name)
    ):
        return (
            f"is not a header field name (1 to {MAX_HEADER_NAME_LENGTH} printable ASCII "
            "characters, no space or colon)"
        )
    if is_request_reserved_header(name):
        return HEADER_RESERVED
    if name.lower() in seen:
        return "is given twice (header names are case-insensitive)"
    return None


def attachments_limit(chain: Sequence[str]) -> int:
    """The most decoded bytes a batch sent through ``chain`` may attach: the named limit, or
    less when the smallest provider's largest message (``shared.core.catalog``) cannot hold
    that much as base64."""
    smallest = min((CATALOG[c].max_message_bytes for c in chain if c in CATALOG), default=None)
    if smallest is None:
        return MAX_ATTACHMENTS_BYTES
    return min(MAX_ATTACHMENTS_BYTES, int(smallest * MIME_BASE64_SHARE))


def _attachments(
    value: object, errors: Errors, *, limit: int | None = None
) -> tuple[Attachment, ...]:
    """The ``attachments`` list: each entry checked (:func:`_attachment`), then their decoded
    size together against ``limit`` (None: by the caller, who knows the chain). Linear in
    the contents' length (one strict base64 pass each, in C)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        errors["attachments"] = "must be a list of attachment objects"
        return ()
    if len(value) > MAX_ATTACHMENTS:
        errors["attachments"] = f"must hold at most {MAX_ATTACHMENTS} attachments"
        return ()
    found: list[Attachment] = []
    names: set[str] = set()
    for index, item in enumerate(value):
        attachment = _attachment(item, f"attachments[{index}]", errors)
        if attachment is None:
            continue
        if attachment.content_id is not None:
            if attachment.content_id in names:
                errors[f"attachments[{index}].content_id"] = "is given twice"
                continue
            names.add(attachment.content_id)
        found.append(attachment)
    problem = None if limit is None else attachments_size_problem(found, limit)
    if problem is not None:
        errors["attachments"] = problem
    return tuple(found)


def attachments_size_problem(attachments: Sequence[Attachment], limit: int) -> str | None:
    """Why ``attachments`` are too large together for ``limit`` decoded bytes, or None."""
    total = sum(a.size for a in attachments)
    if total <= limit:
        return None
    return f"must be at most {limit:,} bytes together once decoded (these are {total:,})"


def _attachment(item: object, path: str, errors: Errors) -> Attachment | None:
    """One attachment object; every problem is an error under ``path``."""
    if not isinstance(item, Mapping):
        errors[path] = "must be an object {filename, content_type, content}"
        return None
    before = len(errors)
    _unknown_keys(item, _ATTACHMENT_KEYS, path, errors)
    filename = item.get("filename")
    problem = _filename_problem(filename)
    if problem is not None:
        errors[f"{path}.filename"] = problem
    content_type = item.get("content_type")
    if not isinstance(content_type, str) or not _CONTENT_TYPE_RE.fullmatch(content_type):
        errors[f"{path}.content_type"] = (
            "is required" if content_type is None else "must be a type/subtype like text/csv"
        )
    content = item.get("content")
    problem = _base64_problem(content)
    if problem is not None:
        errors[f"{path}.content"] = problem
    disposition = item.get("disposition", "attachment")
    if disposition is None:
        disposition = "attachment"
    if disposition not in ("attachment", "inline"):
        errors[f"{path}.disposition"] = 'must be "attachment" or "inline"'
    content_id = item.get("content_id")
    if disposition == "inline":
        if content_id is None:
            errors[f"{path}.content_id"] = "is required for an inline attachment"
        elif not isinstance(content_id, str) or not _CONTENT_ID_RE.fullmatch(content_id):
            errors[f"{path}.content_id"] = (
                f"must be 1 to {MAX_CONTENT_ID_LENGTH} printable ASCII characters, "
                'no space, quotes or angle brackets (html refers to it as "cid:<content_id>")'
            )
    elif content_id is not None and disposition == "attachment":
        errors[f"{path}.content_id"] = "is only for an inline attachment"
    if len(errors) > before:
        return None
    return Attachment(
        filename=str(filename),
        content_type=str(content_type),
        content=str(content),
        disposition="inline" if disposition == "inline" else "attachment",
        content_id=content_id if isinstance(content_id, str) else None,
    )


def _filename_problem(value: object) -> str | None:
    if value is None:
        return "is required"
    if not isinstance(value, str):
        return "must be a string"
    if not value.strip() or len(value) > MAX_FILENAME_LENGTH:
        return f"must be 1 to {MAX_FILENAME_LENGTH} characters"
    if _FILENAME_FORBIDDEN_RE.search(value):
        return "must not contain control characters or path separators (/ or \\)"
    return None


def _base64_problem(value: object) -> str | None:
    """Why ``value`` is not strict base64 (RFC 4648: its alphabet, padded, no line breaks),
    or None."""
    if value is None:
        return "is required"
    if not isinstance(value, str):
        return "must be a string"
    if not value:
        return "must not be empty"
    if not value.isascii():
        return "must be base64 (RFC 4648 alphabet, padded, without line breaks)"
    try:
        binascii.a2b_base64(value, strict_mode=True)
    except binascii.Error:
        return "must be base64 (RFC 4648 alphabet, padded, without line breaks)"
    return None


def _categories(value: object, errors: Errors) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        errors["categories"] = "must be a list of strings"
        return ()
    if len(value) > MAX_CATEGORIES:
        errors["categories"] = f"must hold at most {MAX_CATEGORIES} categories"
        return ()
    found: list[str] = []
    for index, item in enumerate(value):
        path = f"categories[{index}]"
        category = _text(item, path, errors, max_length=MAX_CATEGORY_LENGTH)
        if category is None:
            continue
        if not category.strip():
            errors[path] = "must not be empty"
        elif category in found:
            errors[path] = "is listed twice"
        else:
            found.append(category)
    return tuple(found)


def _metadata(value: object, errors: Errors) -> dict[str, str]:
    metadata: dict[str, str] = {}
    if value is None:
        return metadata
    if not isinstance(value, dict):
        errors["metadata"] = "must be an object of string keys to string values"
        return metadata
    for key, item in value.items():
        path = f"metadata.{_path_key(key)}"
        if not isinstance(key, str) or not _METADATA_KEY_RE.fullmatch(key):
            errors[path] = "key must be 1 to 64 of A-Z, a-z, 0-9, '_' and '-'"
            continue
        checked = _text(item, path, errors, max_length=MAX_METADATA_BYTES)
        if checked is not None:
            metadata[key] = checked
    if len(orjson.dumps(metadata)) > MAX_METADATA_BYTES:
        errors["metadata"] = f"must be at most {MAX_METADATA_BYTES} bytes as JSON"
    return metadata


def _address_text(*addresses: Address | None) -> tuple[str, ...]:
    """The text of the addresses a provider may substitute into (display names and addresses)."""
    return tuple(t for a in addresses if a is not None for t in (a.email, a.name) if t)


# In a display name or an address, these would end the name, open another address or quote.
_ADDRESS_PUNCTUATION_RE: Final = re.compile(r'["\\<>,;:@()\[\]]')


def _substitution_key_problem(key: str) -> str | None:
    if not key or len(key) > MAX_SUBSTITUTION_KEY_LENGTH:
        return f"key must be 1 to {MAX_SUBSTITUTION_KEY_LENGTH} characters"
    problem = text_problem(key)
    return None if problem is None else f"key {problem.message}"


class SubstitutionRules:
    """The rules of the ``to`` entries' substitutions: a value whose key occurs in the subject
    or a header value is header text, one whose key occurs in ``from`` or ``reply_to`` may not
    reshape an address either, any other may not hold NUL or lone surrogates."""

    def __init__(self, header_text: Iterable[str], address_text: Iterable[str]) -> None:
        self.header_text = tuple(header_text)
        self.address_text = tuple(address_text)
        self._in_headers: set[str] = set()  # keys found in header_text
        self._in_addresses: set[str] = set()  # keys found in address_text
        # Recipients tend to share their substitution keys: check each distinct key once.
        self._key_problems: dict[str, str | None] = {}

    def find_keys(self, items: Sequence[object]) -> None:
        """Which substitution keys of the entries occur in the header and address text: one
        scan of that text for all of them (a search of it per key was keys x text: 100,000
        keys over 50 KB of headers took 8 s). Keys too long to be valid are left out."""
        keys = {
            key: ""
            for item in items
            if isinstance(item, dict)
            and isinstance(given := item.get("substitutions"), dict)
            and len(given) <= MAX_SUBSTITUTIONS  # refused unread
            for key in given
            if isinstance(key, str) and len(key) <= MAX_SUBSTITUTION_KEY_LENGTH
        }
        if keys:
            finder = Substitution(keys)
            self._in_headers = finder.occurring(self.header_text)
            self._in_addresses = finder.occurring(self.address_text)

    def check(self, value: Mapping[str, str], path: str, errors: Errors) -> dict[str, str]:
        """The valid substitutions of one entry; each problem is an error under ``path``."""
        found: dict[str, str] = {}
        for key, text in value.items():
            problem = self._problem(key, text)
            if problem is not None:
                errors[f"{path}.{_path_key(key)}"] = problem
            else:
                found[key] = text
        if len(orjson.dumps(found)) > MAX_SUBSTITUTIONS_BYTES:
            errors[path] = f"must be at most {MAX_SUBSTITUTIONS_BYTES} bytes as JSON"
        return found

    def _problem(self, key: str, text: str) -> str | None:
        if key not in self._key_problems:
            self._key_problems[key] = _substitution_key_problem(key)
        key_problem = self._key_problems[key]
        if key_problem is not None:
            return key_problem
        if key in self._in_addresses:
            problem = text_problem(text)
            if problem is not None:
                return f"{problem.message} (the key is used in from or reply_to)"
            if _ADDRESS_PUNCTUATION_RE.search(text):
                return (
                    'must not contain quotes or address punctuation ( " \\ < > , ; : @ ( ) [ ] ) '
                    "(the key is used in from or reply_to)"
                )
            return None
        if key in self._in_headers:
            problem = text_problem(text)
            return None if problem is None else f"{problem.message} (the key is used in a header)"
        if _BODY_FORBIDDEN_RE.search(text):
            return "must not contain NUL or lone surrogates"
        return None


def no_recipients(rejected: Mapping[str, Rejected]) -> InvalidRequest:
    """``no_recipients``: every ``to`` entry was rejected (``rejected``: path -> entry)."""
    summary = no_recipients_summary(len(rejected), 0)
    detail = {path: f"is rejected: {e.reason}" for path, e in rejected.items()}
    return InvalidRequest({"to": summary, **detail}, code=NO_RECIPIENTS, message=summary)


def drop_suppressed(request: BatchRequest, listed: Mapping[str, str]) -> BatchRequest:
    """``request`` without the recipients, cc and bcc addresses on the sender's suppression
    list (``listed``: address key -> reason); they are reported in ``suppressed``, and with
    their reasons in ``skipped``. The one rule for every interface that accepts a batch: a
    suppressed address is not mailed whichever field names it (and an address inside the
    cooldown is dropped by the same rule, with the reason ``cooldown``).

    Raises:
        InvalidRequest: ``no_recipients`` when no recipient is left.
    """
    if not listed:
        return request
    keep = tuple(r for r in request.recipients if address_key(r.email) not in listed)
    dropped = tuple(r.email for r in request.recipients if address_key(r.email) in listed)
    if not keep:
        summary = no_recipients_summary(len(request.rejected), len(dropped))
        detail = {
            f"to.{email}": f"{email} is suppressed: {listed[address_key(email)]}"
            for email in dropped
        }
        raise InvalidRequest({"to": summary, **detail}, code=NO_RECIPIENTS, message=summary)
    message = request.message
    copies = (*message.cc, *message.bcc)
    dropped += tuple(a.email for a in copies if address_key(a.email) in listed)
    message = message.model_copy(
        update={
            "cc": tuple(a for a in message.cc if address_key(a.email) not in listed),
            "bcc": tuple(a for a in message.bcc if address_key(a.email) not in listed),
        }
    )
    skipped = tuple(Rejected(email, listed[address_key(email)]) for email in dropped)
    return dataclasses.replace(
        request,
        message=message,
        recipients=keep,
        suppressed=(*request.suppressed, *dropped),
        skipped=(*request.skipped, *skipped),
    )


def addresses_of(request: BatchRequest) -> list[str]:
    """Every address the batch would mail: its recipients, then cc and bcc."""
    message = request.message
    return [
        *(r.email for r in request.recipients),
        *(a.email for a in (*message.cc, *message.bcc)),
    ]


def no_recipients_summary(rejected: int, suppressed: int) -> str:
    return f"no deliverable recipient: {rejected} rejected, {suppressed} suppressed"
