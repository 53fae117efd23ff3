"""The body of ``POST /v1/batches`` as pydantic models, and its validation: the shape the
OpenAPI document declares (``services.api.schema`` re-exports the models), and the rules a
schema cannot state as validators on them, calling ``shared.delivery.validation``'s pure rules.
:func:`parse` validates a decoded body into a ``BatchRequest`` (``validation.parse_batch_request``
is its public name), words pydantic's own errors as the rules word theirs (:func:`refusal`),
and :func:`field_errors` keys any model's errors by field path.

The rules run only when a body is validated with :class:`Limits` (the run-time recipient cap,
configured providers and bulk threshold): ``BatchIn.model_validate(body)`` alone checks the
shape, as the document states it. What the validators find goes into the validation's context
(:class:`_Parse`), and the model's after-validator builds the request from it: the fields keep
the types the document declares.

Here, in the delivery layer rather than the API, because ``validation.parse_batch_request``
has callers the API cannot serve (``shared.ops.alerts``, ``services.hooks.notice``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NoReturn, Self, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from shared.core import lanes
from shared.core.addresses import (
    MAX_NAME_LENGTH,
    AddressError,
    address_key,
    normalize_email,
    parse_address,
    split_address_list,
)
from shared.core.catalog import CODES
from shared.core.models import Address, Attachment, Message
from shared.delivery import validation
from shared.delivery.validation import (
    MAX_ATTACHMENTS,
    MAX_CATEGORIES,
    MAX_COPY_ADDRESSES,
    MAX_HEADERS,
    MAX_REJECTED_LENGTH,
    MAX_SUBJECT_LENGTH,
    MAX_SUBSTITUTIONS,
    NO_RECIPIENTS,
    TOO_MANY_RECIPIENTS,
    BatchRequest,
    Errors,
    InvalidRequest,
    RecipientInput,
    Rejected,
    SubstitutionRules,
    Wanted,
)


@dataclass(frozen=True, slots=True)
class Limits:
    """The run-time limits a batch is validated with."""

    max_recipients: int
    configured: tuple[str, ...] = CODES
    bulk_threshold: int = 1_000

    @property
    def cap(self) -> str:
        return f"at most {self.max_recipients} distinct recipients per batch"


@dataclass(frozen=True, slots=True)
class _Refused:
    """A ``to`` entry whose address is rejected: as given, why, and where (``""`` for a
    string entry, ``".email"`` for an object's)."""

    raw: str
    reason: str
    suffix: str


@dataclass(slots=True)
class _Parse:
    """One validation's context: the limits in, what the field validators found out (fields
    are validated in declaration order, so ``to`` sees the sender and the header text)."""

    limits: Limits
    sender: Address | None = None
    reply_to: Address | None = None
    header_text: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    substitutions: SubstitutionRules = field(default_factory=lambda: SubstitutionRules((), ()))
    entries: list[RecipientInput | _Refused] = field(default_factory=list)
    recipients: list[RecipientInput] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # the recipients' address keys
    rejected: dict[str, tuple[str, Rejected]] = field(default_factory=dict)  # key -> path, entry
    copies: dict[str, list[Address]] = field(default_factory=lambda: {"cc": [], "bcc": []})
    cc: dict[str, Address] = field(default_factory=dict)
    bcc: dict[str, Address] = field(default_factory=dict)
    categories: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)
    provider: str | None = None
    attachments: tuple[Attachment, ...] = ()


V = TypeVar("V")
R = TypeVar("R")


def _parsing(info: ValidationInfo) -> _Parse | None:
    """The validation's context when the rules apply, None for a shape check."""
    context = info.context
    return context if isinstance(context, _Parse) else None


#: Error types of the rules: their ``fields`` (suffix of the error's path -> message) are
#: reported as they are. The last two give the request's code when nothing else is wrong.
_RULES = "rules"
_OURS = frozenset({_RULES, TOO_MANY_RECIPIENTS, NO_RECIPIENTS})


def _refuse(errors: Mapping[str, str], kind: str = _RULES) -> NoReturn:
    """Fail the value under validation with every error the rules found in it, keyed by
    their path below it (one pydantic error carries them all, in their order)."""
    raise PydanticCustomError(kind, "invalid", {"fields": dict(errors)})


def _below(errors: Errors, prefix: str) -> Errors:
    """Errors keyed by their path below ``prefix`` (the rules key theirs from the body)."""
    return {path[len(prefix) :]: message for path, message in errors.items()}


def _ruled(rule: Callable[[V, Errors], R], value: V, field: str = "") -> R:
    """What ``rule`` makes of ``value``, or the value fails with every error it found (keyed
    below ``field``, the path the rule keys them from)."""
    errors: Errors = {}
    result = rule(value, errors)
    if errors:
        _refuse(_below(errors, field))
    return result


# --------------------------------------------------------------------------- rules


def _address_rule(value: str | AddressIn, info: ValidationInfo) -> str | AddressIn:
    """``from`` and ``reply_to``: a valid address, whose problems are field errors."""
    parse = _parsing(info)
    if parse is None:
        return value
    given = value if isinstance(value, str) else {"email": value.email, "name": value.name}
    address = _ruled(lambda v, errors: validation._address(v, "", errors), given)
    if info.field_name == "reply_to":
        parse.reply_to = address
    else:
        parse.sender = address
    return value


def _subject_rule(value: str | None, info: ValidationInfo) -> str | None:
    """Required here (a template's subject replaced the field before), header text, not
    blank."""
    parse = _parsing(info)
    if parse is None:
        return value
    parse.header_text.append(_ruled(validation._subject, value, "subject"))
    return value


def _body_rule(value: str, info: ValidationInfo) -> str:
    if _parsing(info) is not None:
        _ruled(lambda v, errors: validation._body(v, "", errors), value)
    return value


def _headers_rule(value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
    parse = _parsing(info)
    if parse is None:
        return value
    parse.headers = _ruled(validation._headers, value, "headers")
    parse.header_text.extend(parse.headers.values())
    return value


def _listed(value: object, info: ValidationInfo) -> object:
    """An address list given as a comma-separated string is its items, so an error names
    the item (``cc[1]``) and the limits count addresses, not characters."""
    if _parsing(info) is not None and isinstance(value, str):
        return split_address_list(value)
    return value


def _to_items(value: object, info: ValidationInfo) -> object:
    """``to`` as a list, refused unread when far longer than the cap could allow; and the
    one scan for where the entries' substitution keys occur."""
    parse = _parsing(info)
    if parse is None:
        return value
    items = _listed(value, info)
    if isinstance(items, list):
        if len(items) > 2 * parse.limits.max_recipients + 100:
            _refuse({"": parse.limits.cap}, TOO_MANY_RECIPIENTS)
        address_text = validation._address_text(parse.sender, parse.reply_to)
        parse.substitutions = SubstitutionRules(parse.header_text, address_text)
        parse.substitutions.find_keys(items)
    return items


def _recipient_rule(
    item: object, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
) -> str | RecipientIn:
    """A ``to`` entry: a recipient, or rejected (a bad address is reported in the 202 and
    does not fail the batch), or a field error (its shape, header injection anywhere)."""
    parse = _parsing(info)
    if parse is None:
        entry: str | RecipientIn = handler(item)
        return entry
    if isinstance(item, str):
        try:
            address = parse_address(item, ascii_only=True)
        except AddressError as exc:
            if exc.injection:
                _refuse({"": exc.reason})
            parse.entries.append(_Refused(item, exc.reason, ""))
        else:
            parse.entries.append(RecipientInput(email=address.email, name=address.name))
        return item
    recipient: RecipientIn = handler(item)
    errors: Errors = {}
    name = validation._name(recipient.name, ".name", errors)
    given = recipient.substitutions or {}
    substitutions = parse.substitutions.check(given, ".substitutions", errors)
    try:
        email = normalize_email(recipient.email.strip(" \t"), ascii_only=True)
    except AddressError as exc:
        if exc.injection:
            errors[".email"] = exc.reason
        elif not errors:
            parse.entries.append(_Refused(recipient.email, exc.reason, ".email"))
            return recipient
    if errors:
        _refuse(errors)
    parse.entries.append(RecipientInput(email=email, name=name, substitutions=substitutions))
    return recipient


def _recipients_rule(value: list[Any], info: ValidationInfo) -> list[Any]:
    """The distinct recipients (the first occurrence of an address wins), the rejected
    entries once each, and the cap on distinct valid addresses."""
    parse = _parsing(info)
    if parse is None:
        return value
    for index, entry in enumerate(parse.entries):
        if isinstance(entry, _Refused):
            rejected = Rejected(email=entry.raw[:MAX_REJECTED_LENGTH], reason=entry.reason)
            path = f"to[{index}]{entry.suffix}"
            parse.rejected.setdefault(address_key(entry.raw), (path, rejected))
        elif (key := address_key(entry.email)) not in parse.seen:
            parse.seen.add(key)
            parse.recipients.append(entry)
    if len(parse.recipients) > parse.limits.max_recipients:
        _refuse({"": parse.limits.cap}, TOO_MANY_RECIPIENTS)
    return value


def _copy_rule(
    item: object, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
) -> str | AddressIn:
    """A ``cc`` or ``bcc`` entry: not a recipient, so a bad address is a field error."""
    value: str | AddressIn = handler(item)
    parse = _parsing(info)
    if parse is not None:
        errors: Errors = {}
        given = value if isinstance(value, str) else {"email": value.email, "name": value.name}
        address = validation._address(given, "", errors)
        if errors:
            _refuse(errors)
        if address is not None:
            parse.copies[str(info.field_name)].append(address)
    return value


def _copies_rule(value: list[Any], info: ValidationInfo) -> list[Any]:
    """No address twice across ``to``, ``cc`` and ``bcc`` (providers refuse that)."""
    parse = _parsing(info)
    if parse is None:
        return value
    name = str(info.field_name)
    taken = parse.seen if name == "cc" else parse.seen | parse.cc.keys()
    found: dict[str, Address] = {}
    errors: Errors = {}
    for index, address in enumerate(parse.copies[name]):
        key = address_key(address.email)
        if key in taken or key in found:
            errors[f"[{index}]"] = "is listed more than once across to, cc and bcc"
        else:
            found[key] = address
    if errors:
        _refuse(errors)
    if name == "cc":
        parse.cc = found
    else:
        parse.bcc = found
    return value


def _categories_rule(value: list[str], info: ValidationInfo) -> list[str]:
    parse = _parsing(info)
    if parse is None:
        return value
    parse.categories = _ruled(validation._categories, value, "categories")
    return value


def _metadata_rule(value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
    parse = _parsing(info)
    if parse is None:
        return value
    parse.metadata = _ruled(validation._metadata, value, "metadata")
    return value


def _provider_rule(
    value: object, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
) -> Any:
    """One of the providers configured here, by name or code in any case."""
    parse = _parsing(info)
    if parse is not None:
        errors: Errors = {}
        parse.provider = validation._provider(value, parse.limits.configured, errors)
        if errors:
            _refuse(_below(errors, "provider"))
    return handler(value)


def _attachments_rule(
    value: object, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
) -> Any:
    """Each attachment's rules, on the value as given so that every entry's errors are
    reported at once in the rules' words (the total size is the model's: it depends on the
    chain)."""
    parse = _parsing(info)
    if parse is not None:
        parse.attachments = _ruled(validation._attachments, value, "attachments")
    return handler(value)


def _priority_rule(
    value: object, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
) -> Any:
    if _parsing(info) is not None and value is not None:
        try:
            lanes.lane(value, 0, 0)
        except lanes.ScheduleError as exc:
            _refuse({"": str(exc)})
    return handler(value)


def _list_rule(value: object, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
    if _parsing(info) is not None and value is not None and not validation.list_name(value):
        _refuse({"": validation.LIST_NAME_RULE})
    return handler(value)


def _settled(value: object, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
    """The template and schedule fields: the API settles them before the rules run (the
    template's content replaces them, ``send_at`` becomes the schedule), so a body that
    still holds one reaches a caller that has neither."""
    if _parsing(info) is not None:
        _refuse({"": "unknown field"})
    return handler(value)


# --------------------------------------------------------------------------- models


class BodyIn(BaseModel):
    """A request body: strict types, no unknown fields."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class AddressIn(BodyIn):
    """An address as an object; a string ``"Name <addr@example.com>"`` works too."""

    email: str = Field(max_length=320, examples=["shop@example.com"])
    name: str | None = Field(None, max_length=256, examples=["Shop"])


class RecipientIn(AddressIn):
    """A ``to`` entry as an object, with its own substitutions (``{{key}}`` → value)."""

    substitutions: dict[str, str] | None = Field(
        None, max_length=MAX_SUBSTITUTIONS, examples=[{"first_name": "Ann"}]
    )


class AttachmentIn(BodyIn):
    """A file the message carries; each copy carries them all."""

    filename: str = Field(
        max_length=validation.MAX_FILENAME_LENGTH,
        description="1 to 255 characters, no control characters or path separators.",
        examples=["invoice.pdf"],
    )
    content_type: str = Field(description="`type/subtype`.", examples=["application/pdf"])
    content: str = Field(
        description="The file, base64 (RFC 4648, padded, without line breaks). All of a "
        "batch's files together are at most 7 MiB decoded (less when a provider of the chain "
        "takes smaller messages).",
        examples=["JVBERi0xLjQK"],
    )
    disposition: Literal["attachment", "inline"] | None = Field(
        None,
        description="`inline`: shown in the html where it refers to `cid:<content_id>`. "
        "Default: attachment.",
    )
    content_id: str | None = Field(
        None,
        max_length=validation.MAX_CONTENT_ID_LENGTH,
        description="Required for an inline attachment, and only for one.",
        examples=["logo"],
    )


class TrackingIn(BodyIn):
    """What to track in a batch's copies."""

    opens: bool | None = None
    clicks: bool | None = None


def _form(obj: str, *, listed: bool = False) -> Callable[[object], str | None]:
    """The union member a JSON value is validated as, by its JSON type: only that member's
    errors are reported (an untagged union reports every member's)."""

    def tag(value: object) -> str | None:
        if isinstance(value, str):
            return "str"
        if listed:
            return "list" if isinstance(value, list) else None
        return obj if isinstance(value, dict | BaseModel) else None

    return tag


_RECIPIENT_FORMS = "must be an address string or an object {email, name, substitutions}"
_LIST_FORMS = "must be a list of addresses or a comma-separated string"
_FORMS = "forms"


def _forms(obj: str, message: str, *, listed: bool = False) -> Discriminator:
    return Discriminator(
        _form(obj, listed=listed), custom_error_type=_FORMS, custom_error_message=message
    )


_Address = Annotated[
    Annotated[str, Tag("str")] | Annotated[AddressIn, Tag("AddressIn")],
    _forms("AddressIn", validation._ADDRESS_FORMS),
]
_Sender = Annotated[_Address, AfterValidator(_address_rule)]
_Recipient = Annotated[
    Annotated[str, Tag("str")] | Annotated[RecipientIn, Tag("RecipientIn")],
    _forms("RecipientIn", _RECIPIENT_FORMS),
    WrapValidator(_recipient_rule),
]
_Recipients = Annotated[
    Annotated[str, Tag("str")]
    | Annotated[list[_Recipient], AfterValidator(_recipients_rule), Tag("list")],
    _forms("", _LIST_FORMS, listed=True),
    BeforeValidator(_to_items),
]
_Copy = Annotated[_Address, WrapValidator(_copy_rule)]
# The limit counts addresses: on the list (a comma-separated string is split into one
# before it is read, ``_listed``), never on the string's characters.
_Copies = Annotated[
    Annotated[str, Tag("str")]
    | Annotated[
        list[_Copy],
        Field(max_length=MAX_COPY_ADDRESSES),
        AfterValidator(_copies_rule),
        Tag("list"),
    ],
    _forms("", _LIST_FORMS, listed=True),
]
_Body = Annotated[str, AfterValidator(_body_rule)]


class BatchIn(BodyIn):
    """``POST /v1/batches``: one message to many recipients."""

    # By alias only: ``from_`` and ``list_`` are Python's names, not the body's.
    model_config = ConfigDict(
        validate_by_name=False,
        json_schema_extra={
            "examples": [
                {
                    "from": "Shop <shop@example.com>",
                    "to": ["ann@example.com", {"email": "bob@example.com", "name": "Bob"}],
                    "subject": "Your order",
                    "text": "Thanks!",
                    "html": "<p>Thanks!</p>",
                }
            ]
        },
    )

    # Validated in this order: ``to`` after what its substitutions are checked against.
    from_: _Sender = Field(alias="from", description="The sender.")
    reply_to: _Sender | None = None
    subject: Annotated[
        Annotated[str, Field(max_length=MAX_SUBJECT_LENGTH)] | None,
        AfterValidator(_subject_rule),
    ] = Field(
        None,
        validate_default=True,
        description="Required unless the batch names a `template_id`.",
    )
    html: _Body | None = Field(None, description="At least one of html and text.")
    text: _Body | None = None
    headers: (
        Annotated[dict[str, str], Field(max_length=MAX_HEADERS), AfterValidator(_headers_rule)]
        | None
    ) = Field(
        None,
        description="Extra headers. Refused (422 under `headers.<name>`, in any case): "
        "those we set ourselves (`From`, `Sender`, `Return-Path`, `Message-ID`, "
        "`List-Unsubscribe`, `List-Unsubscribe-Post`: ask for ours with `unsubscribe`, ...), "
        "those that steer a provider (`X-Mailgun-*`, `X-SG-*`, `X-SMTPAPI`, `X-Twilio-*`), "
        "`Resent-*`, `Authentication-Results` and `ARC-*`.",
    )
    to: _Recipients = Field(
        description="A comma-separated string or a list; duplicates collapse, invalid "
        "entries are reported in `rejected` and the rest are sent."
    )
    template_id: Annotated[str | None, WrapValidator(_settled)] = Field(
        None,
        description="Send one of your templates instead of subject/html/text: its live "
        "version (and, during a canary rollout, the canary to its share of recipients).",
    )
    version: Annotated[Annotated[int, Field(ge=1)] | None, WrapValidator(_settled)] = Field(
        None, description="With `template_id`: this version, not the live one."
    )
    data: Annotated[dict[str, Any] | None, WrapValidator(_settled)] = Field(
        None,
        description="With `template_id`: the variables the whole batch shares. A variable "
        "not in `data` is per recipient: each `to` entry's `substitutions` must give it.",
    )
    send_at: Annotated[str | None, WrapValidator(_settled)] = Field(
        None,
        description="RFC 3339 time to send at (up to the configured horizon ahead): the "
        "batch is `scheduled` until then, and can be cancelled "
        "(`POST /v1/batches/{id}/cancel`).",
        examples=["2026-12-01T09:00:00Z"],
    )
    cc: Annotated[_Copies | None, BeforeValidator(_listed)] = None
    bcc: Annotated[_Copies | None, BeforeValidator(_listed)] = None
    provider: Annotated[str | None, WrapValidator(_provider_rule)] = Field(
        None,
        description="Pin the batch to one provider (`sendgrid`, `mailgun`, or its code): only "
        "it is used, with no failover or spill-over to another; when it is at its rate limit "
        "or paused, the work waits for it.",
    )
    bulk: bool | None = Field(
        None,
        description="One copy per recipient, personalised: the default already (kept for "
        "existing clients; `false` does not make the message shared).",
    )
    priority: Annotated[Literal["transactional", "bulk"] | None, WrapValidator(_priority_rule)] = (
        Field(
            None,
            description="The lane the batch is sent in: `bulk` work has queues of its own, so it "
            "never delays `transactional` mail. Default: transactional up to "
            "SAFEDELIVR_API_BULK_THRESHOLD recipients (1,000 unless configured), bulk above.",
        )
    )
    shared: bool | None = Field(
        None,
        description="One message to all the recipients of a chunk, so each sees the others' "
        "addresses; needed for cc/bcc with more than one recipient. Off by default.",
    )
    categories: (
        Annotated[list[str], Field(max_length=MAX_CATEGORIES), AfterValidator(_categories_rule)]
        | None
    ) = None
    metadata: Annotated[dict[str, str], AfterValidator(_metadata_rule)] | None = Field(
        None, description="Keys of A-Z, a-z, 0-9, `_` and `-`; echoed in webhooks."
    )
    tracking: TrackingIn | None = Field(
        None,
        description="Open and click tracking for this batch (default: your preferences, "
        "off unless you turned it on). Opens and clicks are counted once per recipient "
        "and in total; they never change a recipient's outcome.",
    )
    unsubscribe: bool | None = Field(
        None,
        description="List-Unsubscribe with one-click unsubscribe (RFC 2369, RFC 8058) in "
        "each copy (default: on when the batch names a `list` or goes in the `bulk` lane, as "
        "Gmail and Yahoo require of bulk senders, else your preferences; `false` turns it "
        "off). A shared message cannot carry it: a `bulk` one goes without, and the answer's "
        "`warnings` says so.",
    )
    list_: Annotated[
        Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")] | None,
        WrapValidator(_list_rule),
    ] = Field(
        None,
        alias="list",
        description="The list or campaign this mail belongs to: an unsubscribe from it "
        "stops only mail naming the same list (without one, all of your mail).",
    )

    attachments: Annotated[
        Annotated[list[AttachmentIn], Field(max_length=MAX_ATTACHMENTS)] | None,
        WrapValidator(_attachments_rule),
    ] = Field(None, description="Files every copy carries (at most 10).")

    _request: BatchRequest | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _whole(self, info: ValidationInfo) -> Self:
        """The rules across fields, once every field is valid; then the request."""
        parse = _parsing(info)
        if parse is None:
            return self
        errors: Errors = {}
        if not any(b and b.strip() for b in (self.html, self.text)):
            errors["html"] = errors["text"] = "at least one of html and text must be non-empty"
        bulk, shared, copies = bool(self.bulk), bool(self.shared), bool(parse.cc or parse.bcc)
        if bulk and copies:
            # Each personalised copy would carry the cc/bcc too: up to 1,000 copies per chunk.
            errors["bulk"] = "cc and bcc cannot be combined with bulk (one copy per recipient)"
        if bulk and shared:
            errors["shared"] = "cannot be combined with bulk: true (one copy per recipient)"
        personal = validation.one_copy_each(
            shared=shared, recipients=len(parse.seen), copies=copies
        )
        if personal is None:
            errors["shared"] = (
                "cc and bcc go with one shared message: set shared to true (every recipient "
                "then sees the others) or send the copies as a batch of their own"
            )
        threshold = parse.limits.bulk_threshold
        priority = validation._priority(self.priority, len(parse.recipients), threshold, errors)
        chain = (parse.provider,) if parse.provider else parse.limits.configured
        limit = validation.attachments_limit(chain)
        too_large = validation.attachments_size_problem(parse.attachments, limit)
        if too_large is not None:
            errors["attachments"] = too_large
        if errors:
            _refuse(errors)
        if not parse.recipients:
            refused = validation.no_recipients(dict(parse.rejected.values()))
            _refuse(refused.fields, NO_RECIPIENTS)
        if parse.sender is None:  # pragma: no cover - a valid ``from`` always sets it
            raise ValueError("from is required")
        message = Message(
            sender=parse.sender,
            subject=self.subject or "",
            html=self.html or None,
            text=self.text or None,
            reply_to=parse.reply_to,
            cc=tuple(parse.cc.values()),
            bcc=tuple(parse.bcc.values()),
            headers=parse.headers,
            categories=parse.categories,
            metadata=parse.metadata,
            bulk=bool(personal),
            provider=parse.provider,
            priority=priority,
            attachments=parse.attachments,
        )
        tracking = self.tracking or TrackingIn()
        self._request = BatchRequest(
            message=message,
            recipients=tuple(parse.recipients),
            rejected=tuple(entry for _, entry in parse.rejected.values()),
            wants=Wanted(tracking.opens, tracking.clicks, self.unsubscribe, self.list_),
        )
        return self

    def request(self) -> BatchRequest:
        """The request this body asks for (validated with :class:`Limits`)."""
        if self._request is None:
            raise ValueError("validated without Limits: only the shape was checked")
        return self._request


def parse(raw: object, limits: Limits) -> BatchRequest:
    """Validate a decoded ``POST /v1/batches`` body with ``limits``.

    Raises:
        InvalidRequest: with every field error, or ``too_many_recipients``, or
            ``no_recipients`` when every entry is rejected.
    """
    try:
        return BatchIn.model_validate(raw, context=_Parse(limits)).request()
    except ValidationError as exc:
        raise refusal(exc, limits) from None


# --------------------------------------------------------------------------- errors


def refusal(exc: ValidationError, limits: Limits) -> InvalidRequest:
    """A batch body's validation errors as the one ``InvalidRequest``: the rules' errors as
    they word them, pydantic's worded alike (:func:`_worded`). Any field error makes the
    code ``invalid_fields`` (the cap among them, under ``to``); else the cap's or
    ``no_recipients``."""
    fields: Errors = {}
    kinds: set[str] = set()
    for error in exc.errors(include_url=False):
        path = _batch_path(error["loc"])
        kind = error["type"]
        if kind in _OURS:
            kinds.add(kind)
            for below, message in error["ctx"]["fields"].items():
                fields.setdefault(path + below if path else below, message)
        else:
            kinds.add(_RULES)
            fields.setdefault(path or "body", _worded(error))
    if _RULES in kinds:
        return InvalidRequest(fields)
    if TOO_MANY_RECIPIENTS in kinds:
        return InvalidRequest(
            fields, code=TOO_MANY_RECIPIENTS, message=f"too many recipients: {limits.cap}"
        )
    return InvalidRequest(fields, code=NO_RECIPIENTS, message=fields["to"])


#: The fields whose value is a union of forms (its member's tag follows the field in an
#: error's location), and those of them that are lists (the item's tag follows its index).
_UNIONS = frozenset({"from", "reply_to", "to", "cc", "bcc"})
_LISTS = frozenset({"to", "cc", "bcc"})


def _batch_path(loc: tuple[int | str, ...]) -> str:
    """A batch error's location as the rules name paths: ``to[3].email``,
    ``headers."X\\r\\nBcc"`` (a key made printable by ``validation._path_key``). The union
    members' tags are dropped by their place, so a key that looks like one stays."""
    parts = list(loc)
    if len(parts) > 1 and parts[0] in _UNIONS:
        del parts[1]
    if len(parts) > 2 and parts[0] in _LISTS and isinstance(parts[1], int):
        del parts[2]
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            key = validation._path_key(part)
            path += f".{key}" if path else key
    return path


#: pydantic's errors of a container, worded per field as the rules word them.
_BY_FIELD: Mapping[tuple[str, str], str] = {
    ("dict_type", "headers"): "must be an object of header names to string values",
    ("dict_type", "metadata"): "must be an object of string keys to string values",
    ("dict_type", "substitutions"): "must be an object of string keys to string values",
    ("list_type", "categories"): "must be a list of strings",
    ("model_type", "tracking"): 'must be an object like {"opens": true, "clicks": true}',
    ("too_long", "headers"): f"must hold at most {MAX_HEADERS} headers",
    ("too_long", "categories"): f"must hold at most {MAX_CATEGORIES} categories",
    ("too_long", "substitutions"): f"must hold at most {MAX_SUBSTITUTIONS} keys",
    ("too_long", "cc"): f"must list at most {MAX_COPY_ADDRESSES} addresses",
    ("too_long", "bcc"): f"must list at most {MAX_COPY_ADDRESSES} addresses",
    ("too_long", "attachments"): f"must hold at most {MAX_ATTACHMENTS} attachments",
    ("list_type", "attachments"): "must be a list of attachment objects",
    ("model_type", "attachments"): "must be an object {filename, content_type, content}",
    ("literal_error", "disposition"): 'must be "attachment" or "inline"',
}


def _worded(error: Any) -> str:
    """One of pydantic's own errors in the rules' words."""
    kind: str = error["type"]
    loc = error["loc"]
    # A union member's tag (``cc``'s ``list``) is not a field: the list's limit is ``cc``'s.
    named = [part for part in loc if isinstance(part, str)]
    if len(loc) > 1 and loc[0] in _UNIONS and isinstance(loc[1], str):
        named.remove(loc[1])
    last = named[-1] if named else ""
    # An address object's email (a key of headers or metadata may be called so too).
    email = last == "email" and loc[0] in _UNIONS
    if not loc and kind == "model_type":
        return "must be a JSON object"
    if kind == "missing" or (kind == _FORMS and error["input"] is None and len(loc) == 1):
        return "is required"
    if kind == "string_type":
        return "is required" if error["input"] is None and email else "must be a string"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "bool_type":
        return "must be true or false"
    if kind == "string_too_long":
        if last == "name" and loc[0] in _UNIONS:
            return f"display name is longer than {MAX_NAME_LENGTH} characters"
        return f"must be at most {error['ctx']['max_length']} characters"
    message: str = _BY_FIELD.get((kind, last), error["msg"])
    return message


def field_errors(exc: ValidationError) -> dict[str, str]:
    """pydantic's errors keyed by field path (``to[3].email``; a body that is not an
    object is ``body``)."""
    out: dict[str, str] = {}
    for error in exc.errors(include_url=False):
        path = ""
        for part in error["loc"]:
            if isinstance(part, str) and _is_type_tag(part):
                continue
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        out.setdefault(path or "body", error["msg"])
    return out


def _is_type_tag(part: str) -> bool:
    """Whether a part of a pydantic error location names a union member's type (``str``,
    ``RecipientIn``, ``list[union[str,RecipientIn]]``) rather than a field: our fields are
    lower-case names, so these never collide with one."""
    return "[" in part or part[:1].isupper() or part in _TYPE_TAGS


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
