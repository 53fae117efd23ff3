"""The domain model shared by every service: messages, recipients, chunks and their codecs.

Frozen pydantic models; ``encode``/``decode`` pairs use orjson and are the only way these
objects cross the broker or land in a Cassandra blob.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from shared.core.lanes import Priority

#: Our custom arg (SendGrid) / user variable (Mailgun) carrying an attempt's tag. Not
#: ``attempt``: SendGrid's own ``deferred`` events have an ``attempt`` field, which wins.
ATTEMPT_ARG = "sd_attempt"

#: Headers a message may not set (lower case): we set them ourselves, or providers refuse to
#: let a request override them. Refused at validation and again by every adapter, so failover
#: cannot change what a recipient sees.
RESERVED_HEADERS: frozenset[str] = frozenset(
    {
        "to",
        "from",
        "subject",
        "reply-to",
        "cc",
        "bcc",
        "content-type",
        "content-transfer-encoding",
        "dkim-signature",
        "received",
        "message-id",
        "mime-version",
        "sender",  # an address header: it would bypass the check on ``from``
        "return-path",  # where bounces go: a sender's own would lose them
        "x-smtpapi",
        # A receiving server's verdict on SPF/DKIM/DMARC (RFC 8601): one the sender wrote
        # could pass for a verdict of a hop the message never took.
        "authentication-results",
    }
)
#: Header families that steer a provider (Mailgun's ``X-Mailgun-Variables``/``-Tag``/...,
#: SendGrid's ``X-SG-*`` and its legacy ``X-SMTPAPI`` JSON): a request setting one could turn
#: tracking on, re-tag or re-route the message behind the API's back. ``Resent-*`` (RFC 5322
#: 3.6.6: ``Resent-From``, ``-Sender``, ``-To``...) are address and identity fields that mail
#: clients show as who sent the message, around the check on ``from``; ``ARC-*`` (RFC 8617:
#: ``ARC-Seal``, ``ARC-Message-Signature``, ``ARC-Authentication-Results``) are the
#: authentication chain of the hops a message took, only theirs to add.
RESERVED_HEADER_PREFIXES: tuple[str, ...] = (
    "x-mailgun-",
    "x-sg-",
    "x-smtpapi",
    "x-twilio-",
    "resent-",
    "arc-",
)
#: Headers we set ourselves on each recipient's copy (``shared.engagement.engagement``): a request
#: may not set them, so ours always win (a sender's own List-Unsubscribe would take the
#: recipients' unsubscribes away from the suppression list, and RFC 8058 allows one HTTPS URI
#: in it, so the two cannot be merged). Unlike :data:`RESERVED_HEADERS`, a chunk on its way to
#: a provider does carry them.
UNSUBSCRIBE_HEADERS: frozenset[str] = frozenset({"list-unsubscribe", "list-unsubscribe-post"})


def is_reserved_header(name: str) -> bool:
    """Whether a message on its way to a provider may not carry the header ``name`` (any
    case): nobody sets these but us or the provider."""
    lower = name.lower()
    return lower in RESERVED_HEADERS or lower.startswith(RESERVED_HEADER_PREFIXES)


def is_request_reserved_header(name: str) -> bool:
    """Whether a request may not set the header ``name`` (any case): the reserved ones, and
    the unsubscribe headers we add at send time."""
    return is_reserved_header(name) or name.lower() in UNSUBSCRIBE_HEADERS


#: Summary states of a recipient (as in the original): an outcome ends ``queued``.
State = Literal["queued", "success", "failed"]

#: What a provider can report about a recipient, in our terms (``shared.core.webhook_events``
#: maps each provider's own event names onto these).
Reported = Literal[
    "sent",
    "deferred",
    "delivered",
    "bounced",
    "dropped",
    "complained",
    "unsubscribed",
    "opened",
    "clicked",
]

#: Detailed, provider-neutral events of a recipient: the reported ones and our own.
Event = Literal["queued", Reported, "failed"]

#: Events that settle a recipient's summary state.
OUTCOME_STATE: dict[str, State] = {
    "delivered": "success",
    "bounced": "failed",
    "dropped": "failed",
    "complained": "failed",
    "unsubscribed": "failed",
    "failed": "failed",
}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Address(_Frozen):
    email: str
    name: str | None = None


class Recipient(_Frozen):
    """One recipient of a batch, with its log row id."""

    log_id: uuid.UUID
    email: str
    name: str | None = None
    substitutions: dict[str, str] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    """Headers of this recipient's copy only (List-Unsubscribe carries their own token); set
    at send time (``shared.engagement.engagement``), never stored."""


class Engagement(_Frozen):
    """What a batch's mail carries beyond its content: open and click tracking and a one-click
    unsubscribe (``shared.engagement.engagement`` puts them in each recipient's copy)."""

    opens: bool = False
    clicks: bool = False
    unsubscribe: bool = False
    """List-Unsubscribe (RFC 2369) with one-click unsubscribe (RFC 8058)."""
    list: str | None = None
    """The list or campaign the mail belongs to: an unsubscribe from it stops only the mail
    that names the same list (None: the unsubscribe stops all of the sender's mail)."""

    @property
    def any(self) -> bool:
        return self.opens or self.clicks or self.unsubscribe


class TemplateCopy(_Frozen):
    """One template version rendered for a batch (per-recipient variables as markers)."""

    version: int
    subject: str
    html: str | None = None
    text: str | None = None


class TemplateUse(_Frozen):
    """Which template a batch was made from (``shared.templates.template_use``): the live version's
    copy is the message itself; the canary's, when any, goes to the first chunks."""

    id: uuid.UUID
    version: int
    canary: TemplateCopy | None = None
    canary_chunks: int = 0
    canary_since: datetime | None = None
    """When the canary's rollout started (its judge compares the batches since)."""


class Attachment(_Frozen):
    """A file a message carries (validated by ``shared.delivery.validation``)."""

    filename: str
    content_type: str
    """``type/subtype``, e.g. ``application/pdf``."""
    content: str
    """The file's bytes, base64 (RFC 4648, padded): how every provider's API takes them."""
    disposition: Literal["attachment", "inline"] = "attachment"
    content_id: str | None = None
    """An inline part's Content-ID (its html refers to it as ``cid:<content_id>``)."""

    @property
    def size(self) -> int:
        """The decoded size in bytes, from the base64 text's length (no decoding)."""
        padding = self.content[-2:].count("=")
        return len(self.content) // 4 * 3 - padding


class Message(_Frozen):
    """What is sent: everything of a batch except its recipients."""

    sender: Address = Field(alias="from")
    subject: str
    html: str | None = None
    text: str | None = None
    reply_to: Address | None = None
    cc: tuple[Address, ...] = ()
    bcc: tuple[Address, ...] = ()
    headers: dict[str, str] = Field(default_factory=dict)
    categories: tuple[str, ...] = ()
    metadata: dict[str, str] = Field(default_factory=dict)
    bulk: bool = False
    """One personalised message per recipient instead of one shared message."""
    provider: str | None = None
    """The provider code the batch pins: only it is used (no failover, no spill-over)."""
    engagement: Engagement | None = None
    """Tracking and unsubscribe (None: neither)."""
    template: TemplateUse | None = None
    """The template the batch was made from (None: its content came with the request)."""
    priority: Priority | None = None
    """The lane decided at acceptance (``shared.core.lanes``); None: transactional."""
    attachments: tuple[Attachment, ...] = ()
    """Files carried by every copy, in order."""

    @property
    def lane(self) -> Priority:
        return self.priority or "transactional"

    def encode(self) -> bytes:
        data = self.model_dump(mode="json", by_alias=True)
        for optional in ("engagement", "template", "priority"):
            if data.get(optional) is None:
                # Absent rather than null: a process of the previous release (which forbids
                # unknown fields) still reads every batch that does not use it.
                del data[optional]
        if not data["attachments"]:
            del data["attachments"]  # likewise
        return orjson.dumps(data)

    @classmethod
    def decode(cls, raw: bytes) -> Message:
        return cls.model_validate(orjson.loads(raw))


def chain_for(message: Message, chain: Sequence[str]) -> tuple[str, ...]:
    """The providers a batch's work may go through: the one it pins, or the running chain."""
    return (message.provider,) if message.provider else tuple(chain)


class Chunk(_Frozen):
    """A slice of a batch small enough for one provider request."""

    batch_id: uuid.UUID
    index: int
    message: Message
    recipients: tuple[Recipient, ...]
    attempt: str = ""
    """The attempt's tag (``c.<n>``, ``r.<n>``): sent to the provider, echoed in its events."""


class ChunkJob(_Frozen):
    """The body of a ``<ns>.<batch_uuid>[.retry.<n>]`` message: which chunk to send.

    Recipients are not carried: the consumer reads them (and their current state) from the
    batch partition, so a redelivered or duplicated job never acts on stale data.
    """

    batch_id: uuid.UUID
    chunk: int
    attempt: int = 0
    check: int | None = None
    """A delayed check of the attempt (its lease or its evidence), by sequence number."""

    def encode(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))

    @classmethod
    def decode(cls, raw: bytes) -> ChunkJob:
        return cls.model_validate(orjson.loads(raw))


class BatchJob(_Frozen):
    """The body of a ``batch.<batch_uuid>`` message."""

    batch_id: uuid.UUID

    def encode(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))

    @classmethod
    def decode(cls, raw: bytes) -> BatchJob:
        return cls.model_validate(orjson.loads(raw))


class LogJob(_Frozen):
    """The body of a ``log.<ns>.<log_uuid>[.retry.<n>]`` message: re-send ONE recipient.

    Attempt ``n`` of the recipient's re-send line was planned by a hand-off (a provider-side
    failure reported by a webhook) or decided after attempt ``n-1`` failed. With ``deferral``
    it is instead a deadline check: hand the recipient over if the attempt so tagged is still
    deferred.
    """

    batch_id: uuid.UUID
    chunk: int
    log_id: uuid.UUID
    attempt: int = 0
    check: int | None = None
    """A delayed check of the attempt (its lease or its evidence), by sequence number."""
    deferral: str | None = None
    """The tag of an attempt whose deferral deadline this job checks."""

    def encode(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))

    @classmethod
    def decode(cls, raw: bytes) -> LogJob:
        return cls.model_validate(orjson.loads(raw))
