"""The provider interface every adapter implements, and the receipt it returns."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from shared.core.models import Chunk

#: What a provider answered for one recipient of a call: taken; refused for now (another
#: provider may take it); refused for good; or not known (the call may have reached it).
Outcome = Literal["accepted", "refused_transient", "refused_permanent", "unknown"]


@dataclass(frozen=True, slots=True)
class RecipientAnswer:
    """A provider's answer for one recipient (an SMTP relay's RCPT reply, one SES call of a
    personal copy), when it answers recipient by recipient."""

    email: str
    outcome: Outcome
    code: int | None = None
    """The provider's own code (an SMTP reply code, an HTTP status), if it gave one."""
    text: str = ""
    """What it said, in its words."""
    message_id: str | None = None
    """Its id of the message this recipient got (when it differs per recipient)."""
    suppress: bool = False
    """A permanent refusal that says the address must not be mailed again (5.1.x)."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """A provider accepted a chunk: its HTTP status and message id (for webhook correlation).

    ``recipients`` answers recipient by recipient (None: the whole chunk, as above);
    ``final`` says an accepted answer is all there will ever be (a relay with no event feed):
    it then counts as delivered, "accepted by relay (no delivery report)"."""

    provider: str
    status: int
    message_id: str | None
    recipients: tuple[RecipientAnswer, ...] | None = None
    final: bool = False


@dataclass(frozen=True, slots=True)
class LookupQuery:
    """Which recipients of one attempt did the provider accept? (its query API)"""

    batch_id: uuid.UUID
    chunk: int
    tag: str
    """The attempt's tag, sent with the request (``c.<n>``, ``r.<n>``)."""
    since: datetime
    """When the call started: nothing of it can be older."""
    emails: frozenset[str]
    """The addresses (lower-case) of the attempt's recipients still without evidence."""


#: Awaited just before a request goes out; raises ``ProviderSkipped`` when it must not.
Gate = Callable[[], Awaitable[None]]


class Provider(Protocol):
    """Sends chunks. Raises subclasses of ``shared.core.errors.ProviderError`` on failure:

    * ``TransientProviderError`` for 429 (with ``retry_after``), 5xx, timeouts, connection
      errors; with ``outcome_unknown`` when the request was written and may have been accepted
      (a 5xx, a read timeout, a connection lost after sending);
    * ``ProviderMisconfigured`` for 401/403/404 (bad key, unknown domain);
    * ``PermanentProviderError`` for requests no provider will take (400 on our payload, 413).
    """

    #: Short code used in routing keys (``sg``, ``mg``).
    code: str
    #: Human name, for logs and the dashboard.
    name: str
    #: Most recipients (to+cc+bcc across personalisations) one request may carry.
    max_recipients: int

    async def send(self, chunk: Chunk, gate: Gate | None = None) -> Receipt:
        """Send ``chunk``; ``gate`` is awaited once the request is built and before it is
        sent (the shared rate limit: it raises ``ProviderSkipped`` to call it off), so that
        a slot is taken as close as possible to the request's arrival."""
        ...

    async def lookup(self, query: LookupQuery) -> frozenset[str] | None:
        """The addresses of ``query.emails`` the provider has a message for, from this
        attempt (its query API); None when the account has no usable query API. Raises a
        ``TransientProviderError`` when the query fails."""
        ...

    async def lookup_available(self) -> bool:
        """Whether the account can use the query API (checked at start-up)."""
        ...

    async def aclose(self) -> None: ...
