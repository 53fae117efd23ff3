"""The events a recipient's own token makes (pure): opens, clicks and unsubscribes, as
:class:`ProviderEvent` of the ``tracking`` provider, applied by the same ingest as a
provider's; and the unsubscribe token of a mail sent to the ``mailto:`` of List-Unsubscribe.

Two services make them: the tracking endpoint (the pixel, links and the one-click POST,
``services.tracking``) and the webhooks service (the ``mailto:`` form, as the providers'
inbound routes forward it, ``services.webhooks.inbound``). Services never import each other,
so what they share is here. An unsubscribe has one event id per recipient and list, however
it arrives: a one-click POST and a mail to the ``mailto:`` for the same copy are one
unsubscribe.

The ``mailto:`` token is the one the copy's List-Unsubscribe carries
(``shared.engagement.engagement.list_unsubscribe``): in the Subject (``unsubscribe <token>``,
which mail clients send as they found it, sometimes behind ``Re:``), or a plus-address
(``unsubscribe+<token>@...``) for senders who prefer it. Only a token that verifies with the
tracking keys, for the purpose ``unsubscribe``, counts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Final

from shared.core.catalog import TRACKER
from shared.core.keyring import KeyRing
from shared.core.webhook_events import Kind, ProviderEvent
from shared.engagement.engagement_tokens import MAX_TOKEN, Claim, read

#: A token's shape: ``<kid>.<payload>.<mac>``, URL-safe base64 (``engagement_tokens``).
_SIGNED: Final = r"[A-Za-z0-9]{1,16}\.[A-Za-z0-9_-]{1,2000}\.[A-Za-z0-9_-]{1,64}"
_IN_SUBJECT: Final = re.compile(rf"(?i)\bunsubscribe(?:\s+|%20)({_SIGNED})")
_IN_ADDRESS: Final = re.compile(rf"\+({_SIGNED})@")
#: Characters of a subject or address looked at (a token is at most MAX_TOKEN long).
MAX_LOOKED_AT: Final = 4 * MAX_TOKEN
#: Addresses looked at for a plus-address (an inbound mail's envelope and To).
MAX_ADDRESSES: Final = 50


def tracker_event(
    claim: Claim,
    kind: Kind,
    event_id: str,
    *,
    email: str = "",
    url: str | None = None,
    machine: str | None = None,
    raw: str | None = None,
) -> ProviderEvent:
    """The event a recipient's token stands for (``machine``: what prefetched it, if one)."""
    return ProviderEvent(
        provider=TRACKER,
        event_id=event_id,
        kind=kind,
        raw_event=raw or kind,
        email=email,
        occurred_at=datetime.now(UTC),
        batch_id=claim.batch_id,
        chunk=claim.chunk,
        log_id=claim.log_id,
        attempt=None,
        message_id=None,
        reason=f"by {machine}" if machine else None,
        provider_side=False,
        suppress=kind == "unsubscribed",
        url=url,
        machine=machine,
    )


def unsubscribe_event(claim: Claim, email: str, how: str) -> ProviderEvent:
    """The recipient's unsubscribe (suppressed for the sender, only from the claim's list if
    it names one); ``how`` says by which way (``one-click unsubscribe``, ``mailto
    unsubscribe``...). One id per recipient and list, whichever way it came."""
    return tracker_event(
        claim,
        "unsubscribed",
        f"unsubscribe:{claim.log_id}:{claim.scope or ''}",
        email=email,
        raw=how,
    )


def candidates(subject: str, addresses: Iterable[str]) -> list[str]:
    """The tokens a mail to the ``mailto:`` may carry, in the order they are tried: the
    Subject's, then each plus-address's. Unverified."""
    found = [m.group(1) for m in _IN_SUBJECT.finditer(subject[:MAX_LOOKED_AT])]
    for index, address in enumerate(addresses):
        if index >= MAX_ADDRESSES:
            break
        found += [m.group(1) for m in _IN_ADDRESS.finditer(address[:MAX_LOOKED_AT])]
    return found


def mailto_claim(subject: str, addresses: Iterable[str], ring: KeyRing) -> Claim | None:
    """The unsubscribe a mail to the ``mailto:`` asks for: the first of its tokens that
    verifies with ``ring`` as an unsubscribe token; None when it is not an unsubscribe."""
    for token in candidates(subject, addresses):
        claim = read(token, ring)
        if claim is not None and claim.purpose == "unsubscribe":
            return claim
    return None
