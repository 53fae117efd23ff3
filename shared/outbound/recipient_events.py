"""What users' webhooks are told about each recipient (pure): the events of the send path's
attempts and of providers' reports, built from our records, so a sender sees "SendGrid timed
out → confirmed not sent → Mailgun delivered" as it happens.

* an attempt (``recipient.attempt``): its provider, its id (the tag the provider echoes:
  ``c.0``, ``r.1``), its outcome (``accepted``, ``refused``, ``confirmed sent``, ``confirmed
  not sent``) and the evidence (``api``: the provider's own answer; ``webhook`` or ``provider
  query``: how a call without a clear answer was settled);
* a hand-over to another provider (``recipient.failed_over``);
* what a provider (or our tracking endpoint) reported (``recipient.delivered``, ...).

Each event's source id is stable (the attempt's tag and the recipient; the provider's event
id), so an event built twice -- a redelivered job, a provider's retried webhook -- is the
same webhook message (``shared.outbound.user_hooks.message_id``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Final

from shared.core.catalog import TRACKER
from shared.core.webhook_events import ProviderEvent
from shared.delivery.attempts import Attempt
from shared.outbound.user_hooks import Evidence, HookEvent

#: What the resolution of a call without a clear answer writes when no query API answered
#: (``services.consumers.resolution``): the rest went unconfirmed by any webhook.
NO_WEBHOOK: Final = "any webhook"
NO_QUERY: Final = "its query API"

#: Provider event kinds and the webhook event each one is.
REPORTED: Final[Mapping[str, str]] = {
    "sent": "recipient.sent",
    "delivered": "recipient.delivered",
    "deferred": "recipient.deferred",
    "bounced": "recipient.bounced",
    "dropped": "recipient.dropped",
    "complained": "recipient.complained",
    "unsubscribed": "recipient.unsubscribed",
    "opened": "recipient.opened",
    "clicked": "recipient.clicked",
}


def outcome_of(attempt: Attempt) -> str | None:
    """A settled attempt's outcome for the recipients still waiting on it (None: it says
    nothing to them, e.g. resolved as accepted, whose recipients the evidence named)."""
    if attempt.state == "accepted":
        return "accepted"
    if attempt.state == "rejected":
        return "refused"
    if attempt.state == "resolved" and attempt.decision != "done":
        return "confirmed not sent"
    return None


def evidence_of(attempt: Attempt) -> Evidence:
    """How the attempt's outcome is known: the provider's answer, or for a call without a
    clear answer the evidence looked at (its query API, else its webhooks)."""
    if attempt.state != "resolved":
        return "api"
    # The resolution names its evidence in the decision's words (``verdict``); ``error``
    # keeps what the call itself ended with (a timeout, a 5xx).
    said = f"{attempt.error or ''}\n{attempt.verdict or ''}"
    return "provider query" if NO_QUERY in said else "webhook"


def attempt_events(
    attempt: Attempt,
    batch_id: uuid.UUID,
    recipients: Iterable[Mapping[str, Any]],
    *,
    outcome: str,
    evidence: Evidence,
) -> list[HookEvent]:
    """``recipient.attempt`` for each of ``recipients`` (rows with ``log_id`` and ``email``),
    and ``recipient.failed_over`` when the attempt hands them to another provider."""
    # Told as of the call's start: the provider stamps what it did with the call (SendGrid to
    # the second) before its answer reaches us, so an answer's time could put "sent" before
    # the attempt that sent it; and a resolution rewrites ``finished_at``.
    at = attempt.started_at
    reason = _message(attempt.error) or None
    over = (
        attempt.decision == "retry"
        and attempt.next_provider is not None
        and attempt.next_provider != attempt.provider
        and outcome != "accepted"
    )
    events: list[HookEvent] = []
    for row in recipients:
        source = f"{batch_id}:{attempt.tag}:{row['log_id']}"
        common: dict[str, Any] = {
            "source_id": source,
            "occurred_at": at,
            "batch_id": batch_id,
            "log_id": row["log_id"],
            "email": str(row["email"]),
            "provider": attempt.provider,
            "attempt": attempt.attempt,
            "attempt_id": attempt.tag,
            "evidence": evidence,
        }
        events.append(HookEvent("recipient.attempt", outcome=outcome, reason=reason, **common))
        if over:
            events.append(
                HookEvent(
                    "recipient.failed_over",
                    outcome=f"to {attempt.next_provider}",
                    reason=attempt.verdict or reason,
                    **common,
                )
            )
    return events


def reported_event(
    ev: ProviderEvent, batch_id: uuid.UUID, log_id: uuid.UUID, email: str
) -> HookEvent | None:
    """The webhook event of a provider's (or our tracking endpoint's) report; None for kinds
    that name nothing we tell (``unknown``)."""
    kind = REPORTED.get(ev.kind)
    if kind is None:
        return None
    return HookEvent(
        kind,
        source_id=f"{ev.provider}:{ev.event_id}",
        occurred_at=ev.occurred_at,
        batch_id=batch_id,
        log_id=log_id,
        email=email or ev.email,
        provider=None if ev.provider == TRACKER else ev.provider,
        outcome=ev.kind,
        evidence="api" if ev.provider == TRACKER else "webhook",
        reason=ev.reason or ev.url,
        attempt_id=ev.attempt,
    )


def _message(error: str | None) -> str:
    """The message of an attempt's ``<kind>|<message>`` error."""
    return (error or "").partition("|")[2]
