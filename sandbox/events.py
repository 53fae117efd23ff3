"""What happens to each accepted recipient, and the provider webhook events that report it.

The outcome is chosen by the recipient's local part (``bounce…@`` hard bounce, ``defer…@``
deferred, ``complaint…@``, ``drop…@``, ``sgdrop…@`` dropped by SendGrid only, ``unsub…@``,
``open…@``, ``sgdefer…@`` deferred by SendGrid only, ``sgmgdrop…@`` dropped by SendGrid and
Mailgun and delivered by any other provider; anything else is delivered).
Events are built only when their webhook delay has passed, from the accepted request itself,
in the exact shapes of SendGrid's Event Webhook and Mailgun's ``event-data``.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from sandbox.mailgun import MailgunMessage


class Outcome(StrEnum):
    """The fate of one recipient in the sandbox."""

    DELIVERED = "delivered"
    BOUNCE = "bounce"
    """A recipient-side hard bounce (the mailbox does not exist)."""
    DEFER = "defer"
    """Temporarily refused by the receiving server; nothing follows."""
    COMPLAINT = "complaint"
    """Delivered, then reported as spam."""
    DROP = "drop"
    """Not attempted: the provider dropped it (its own suppression list)."""
    UNSUBSCRIBE = "unsubscribe"
    """Delivered, then the recipient unsubscribed."""
    OPEN = "open"
    """Delivered, then opened."""
    SENDGRID_DROP = "sgdrop"
    """SendGrid drops it for a reason of its own (provider-side: its spam checker), while
    Mailgun delivers it normally: the case where failing over to another provider helps."""
    SENDGRID_DEFER = "sgdefer"
    """SendGrid's attempts are deferred (and nothing follows), while Mailgun delivers it: the
    case where handing a long deferral over to another provider helps."""
    EARLY_DROP = "sgmgdrop"
    """Dropped by SendGrid (its spam checker) and by Mailgun (retries given up), delivered by
    any provider after them in a chain (SES, an SMTP relay): the walk down a chain of three
    or more."""


_PREFIXES = (
    ("bounce", Outcome.BOUNCE),
    ("defer", Outcome.DEFER),
    ("complaint", Outcome.COMPLAINT),
    ("drop", Outcome.DROP),
    ("unsub", Outcome.UNSUBSCRIBE),
    ("open", Outcome.OPEN),
    ("sgdrop", Outcome.SENDGRID_DROP),
    ("sgdefer", Outcome.SENDGRID_DEFER),
    ("sgmgdrop", Outcome.EARLY_DROP),
)

#: The outcomes that only some providers play, by provider: anyone else delivers them.
_PLAYED_BY: dict[Outcome, frozenset[str]] = {
    Outcome.SENDGRID_DROP: frozenset({"sg"}),
    Outcome.SENDGRID_DEFER: frozenset({"sg"}),
    Outcome.EARLY_DROP: frozenset({"sg", "mg"}),
}

#: SendGrid steps posted for each outcome, in order (keys of ``_SENDGRID_STEP``).
SENDGRID_STEPS: dict[Outcome, tuple[str, ...]] = {
    Outcome.DELIVERED: ("processed", "delivered"),
    Outcome.BOUNCE: ("processed", "bounce"),
    Outcome.DEFER: ("processed", "deferred"),
    Outcome.COMPLAINT: ("processed", "delivered", "spamreport"),
    Outcome.DROP: ("processed", "dropped"),
    Outcome.UNSUBSCRIBE: ("processed", "delivered", "unsubscribe"),
    Outcome.OPEN: ("processed", "delivered", "open"),
    Outcome.SENDGRID_DROP: ("processed", "dropped-spam"),
    Outcome.SENDGRID_DEFER: ("processed", "deferred"),
    Outcome.EARLY_DROP: ("processed", "dropped-spam"),
}

#: Mailgun steps posted for each outcome, in order (keys of ``_MAILGUN_STEP``).
MAILGUN_STEPS: dict[Outcome, tuple[str, ...]] = {
    Outcome.DELIVERED: ("accepted", "delivered"),
    Outcome.BOUNCE: ("accepted", "bounce"),
    Outcome.DEFER: ("accepted", "defer"),
    Outcome.COMPLAINT: ("accepted", "delivered", "complained"),
    Outcome.DROP: ("accepted", "drop"),
    Outcome.UNSUBSCRIBE: ("accepted", "delivered", "unsubscribed"),
    Outcome.OPEN: ("accepted", "delivered", "opened"),
    Outcome.SENDGRID_DROP: ("accepted", "delivered"),
    Outcome.SENDGRID_DEFER: ("accepted", "delivered"),
    Outcome.EARLY_DROP: ("accepted", "drop-old"),
}

_MTA_IP = "198.51.100.7"
_READER_IP = "203.0.113.9"
_USER_AGENT = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko)"
_SG_FILTER = "filter0001.16648"
_TO_HEADER_ADDRESSES = 10

_SENDGRID_STEP: dict[str, dict[str, Any]] = {
    "processed": {"event": "processed"},
    "delivered": {"event": "delivered", "response": "250 2.0.0 OK", "ip": _MTA_IP, "tls": 1},
    "bounce": {
        "event": "bounce",
        "reason": "550 5.1.1 The email account that you tried to reach does not exist.",
        "status": "5.1.1",
        "type": "bounce",
        "bounce_classification": "Invalid Address",
        "ip": _MTA_IP,
        "tls": 1,
    },
    "deferred": {
        "event": "deferred",
        "response": "451 4.7.1 Please try again later",
        "attempt": "1",
        "ip": _MTA_IP,
        "tls": 1,
    },
    "dropped": {"event": "dropped", "reason": "Bounced Address", "status": "5.0.0"},
    "dropped-spam": {
        "event": "dropped",
        "reason": "Spam Content (if Spam Checker app is enabled)",
        "status": "5.0.0",
    },
    "spamreport": {"event": "spamreport"},
    "unsubscribe": {"event": "unsubscribe"},
    "open": {"event": "open", "useragent": _USER_AGENT, "ip": _READER_IP, "sg_machine_open": False},
}

_ENGAGEMENT: dict[str, Any] = {
    "ip": _READER_IP,
    "geolocation": {"country": "US", "region": "CA", "city": "San Francisco"},
    "client-info": {
        "client-type": "browser",
        "client-os": "Windows",
        "device-type": "desktop",
        "client-name": "Chrome",
        "user-agent": _USER_AGENT,
    },
}

_MAILGUN_STEP: dict[str, dict[str, Any]] = {
    "accepted": {"event": "accepted", "log-level": "info", "method": "HTTP"},
    "delivered": {
        "event": "delivered",
        "log-level": "info",
        "delivery-status": {
            "tls": True,
            "mx-host": "mx.sandbox.invalid",
            "attempt-no": 1,
            "description": "",
            "session-seconds": 0.2,
            "code": 250,
            "message": "OK",
            "certificate-verified": True,
        },
    },
    "bounce": {
        "event": "failed",
        "log-level": "error",
        "severity": "permanent",
        "reason": "bounce",
        "delivery-status": {
            "attempt-no": 1,
            "code": 550,
            "message": "5.1.1 The email account that you tried to reach does not exist.",
            "description": "",
            "bounce-type": "hard",
            "session-seconds": 0.1,
        },
    },
    "defer": {
        "event": "failed",
        "log-level": "warn",
        "severity": "temporary",
        "reason": "generic",
        "delivery-status": {
            "attempt-no": 1,
            "code": 451,
            "message": "4.7.1 Please try again later",
            "description": "",
            "retry-seconds": 600,
            "session-seconds": 0.1,
        },
    },
    "drop": {
        "event": "failed",
        "log-level": "error",
        "severity": "permanent",
        "reason": "suppress-bounce",
        "delivery-status": {
            "attempt-no": 1,
            "code": 605,
            "message": "",
            "description": "Not delivering to previously bounced address",
            "session-seconds": 0.0,
        },
    },
    "drop-old": {
        "event": "failed",
        "log-level": "error",
        "severity": "permanent",
        "reason": "old",
        "delivery-status": {
            "attempt-no": 8,
            "code": 421,
            "message": "4.7.0 Try again later",
            "description": "Too old",
            "session-seconds": 0.1,
        },
    },
    "complained": {"event": "complained", "log-level": "warn"},
    "unsubscribed": {"event": "unsubscribed", "log-level": "info", **_ENGAGEMENT},
    "opened": {"event": "opened", "log-level": "info", **_ENGAGEMENT},
}

_FLAGS = {
    "is-routed": False,
    "is-authenticated": True,
    "is-system-test": False,
    "is-test-mode": False,
}


def outcome_for(address: str) -> Outcome:
    """The sandbox outcome for ``address``, chosen by the prefix of its local part."""
    local = address.partition("@")[0].lower()
    for prefix, outcome in _PREFIXES:
        if local.startswith(prefix):
            return outcome
    return Outcome.DELIVERED


def outcome_at(provider: str, address: str) -> Outcome:
    """The outcome for ``address`` at ``provider`` (its catalog code): an outcome only some
    providers play is a delivery anywhere else."""
    outcome = outcome_for(address)
    played = _PLAYED_BY.get(outcome)
    return Outcome.DELIVERED if played is not None and provider not in played else outcome


def sendgrid_message_id(message_id: str, personalization: int, accepted_at: int) -> str:
    """The ``sg_message_id`` of one personalization: ``<X-Message-Id>.filter….<n>``."""
    return f"{message_id}.{_SG_FILTER}.{accepted_at:X}.{personalization}"


def sendgrid_events(
    payload: Mapping[str, Any], message_id: str, accepted_at: int, now: int
) -> list[dict[str, Any]]:
    """Every Event Webhook event of an accepted Mail Send request, recipient by recipient.

    ``custom_args`` (top level, overridden by the personalization's) are top-level keys;
    SendGrid's own keys win over custom ones with the same name.
    """
    top_args = payload.get("custom_args") or {}
    categories = payload.get("categories") or []
    common: dict[str, Any] = {"smtp-id": f"<{message_id}@ismtpd0001p1sandbox.sendgrid.net>"}
    if categories:
        common["category"] = categories[0] if len(categories) == 1 else list(categories)
    events: list[dict[str, Any]] = []
    for index, personalization in enumerate(payload["personalizations"]):
        args = {**top_args, **(personalization.get("custom_args") or {})}
        sg_message_id = sendgrid_message_id(message_id, index, accepted_at)
        for email in _personalization_recipients(personalization):
            for step in SENDGRID_STEPS[outcome_for(email)]:
                events.append(
                    {
                        **args,
                        **common,
                        **_SENDGRID_STEP[step],
                        "email": email,
                        "timestamp": now,
                        "sg_event_id": _event_id(),
                        "sg_message_id": sg_message_id,
                    }
                )
    return events


def mailgun_events(
    message: MailgunMessage, message_id: str, recipient: str, now: float
) -> list[dict[str, Any]]:
    """The ``event-data`` objects for one recipient of an accepted Mailgun message, in order."""
    to_header = recipient if message.recipient_variables else _to_header(message.to)
    common: dict[str, Any] = {
        "recipient": recipient,
        "recipient-domain": recipient.partition("@")[2],
        "envelope": {
            "sender": message.sender,
            "transport": "smtp",
            "targets": recipient,
            "sending-ip": _MTA_IP,
        },
        "flags": _FLAGS,
        "message": {
            "headers": {
                "to": to_header,
                "message-id": message_id.strip("<>"),
                "from": message.from_header,
                "subject": message.subject,
            },
            "attachments": [],
            "size": message.size,
        },
        "campaigns": [],
        "tags": list(message.tags),
        "user-variables": message.user_variables(recipient),
    }
    return [
        {**common, **_MAILGUN_STEP[step], "id": _event_id(22), "timestamp": now + k / 1000}
        for k, step in enumerate(MAILGUN_STEPS[outcome_for(recipient)])
    ]


def _to_header(to: tuple[str, ...]) -> str:
    # A shared message may list 1,000 addresses; repeating them in every event of every
    # recipient would make the webhook traffic quadratic, so the header is abbreviated.
    shown = ", ".join(to[:_TO_HEADER_ADDRESSES])
    return shown if len(to) <= _TO_HEADER_ADDRESSES else f"{shown}, ..."


def _personalization_recipients(personalization: Mapping[str, Any]) -> list[str]:
    return [
        entry["email"] for kind in ("to", "cc", "bcc") for entry in personalization.get(kind) or ()
    ]


def _event_id(length: int = 0) -> str:
    """A random event id: SendGrid's padded base64, or Mailgun's ``length`` base64url chars."""
    raw = os.urandom(16)
    if length:
        return base64.urlsafe_b64encode(raw).decode()[:length]
    return base64.urlsafe_b64encode(raw).decode()
