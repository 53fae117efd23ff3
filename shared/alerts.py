"""Alerts to operators: a Slack/Discord-compatible incoming webhook (the live setting
``alerts.webhook_url``), for circuits opening, error bursts, dead letters and deep queues.

An alert is a kind and a subject (``circuit_open`` / ``sg``) with a sentence. The same alert is
sent at most once per cool-off (``alerts.cool_off``) across every process: the first to claim
it in ``alerts_sent`` (a lightweight transaction whose row lives as long as the cool-off)
posts it; the others find it claimed. The body carries both ``text`` (Slack) and ``content``
(Discord). Sending never raises: an alert that cannot be claimed or posted is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from shared.db import Database
from shared.errors import DependencyUnavailable

log = logging.getLogger(__name__)

#: Seconds an alert post may take.
POST_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Alert:
    kind: str
    """``circuit_open``, ``error_burst``, ``dead_letters``, ``queue_depth``."""
    subject: str
    """What it is about (a provider code, a queue)."""
    text: str


@dataclass(frozen=True, slots=True)
class AlertConfig:
    url: str
    cool_off: int


def body(alert: Alert, scope: str, at: datetime) -> dict[str, Any]:
    """The JSON posted for ``alert`` (Slack reads ``text``, Discord ``content``)."""
    line = f"[Safedelivr {scope}] {alert.text}"
    return {
        "text": line,
        "content": line,
        "kind": alert.kind,
        "subject": alert.subject,
        "deployment": scope,
        "at": at.isoformat(),
    }


@dataclass
class Alerter:
    db: Database
    scope: str
    http: httpx.AsyncClient
    config: Callable[[], AlertConfig]

    async def send(self, alert: Alert) -> bool:
        """Post ``alert`` unless it was sent within the cool-off; True when this call sent it."""
        config = self.config()
        log.warning("alert %s/%s: %s", alert.kind, alert.subject, alert.text)
        if not config.url:
            return False
        now = datetime.now(UTC)
        try:
            row = await self.db.one(
                "INSERT INTO alerts_sent (scope, alert, sent_at) VALUES (?, ?, ?) "
                "IF NOT EXISTS USING TTL ?",
                (self.scope, f"{alert.kind}:{alert.subject}", now, config.cool_off),
            )
        except DependencyUnavailable as exc:
            log.warning("alert not sent (cannot claim it): %s", exc)
            return False
        if not (row and row["[applied]"]):
            return False  # sent within the cool-off, by this process or another
        try:
            answer = await self.http.post(
                config.url, json=body(alert, self.scope, now), timeout=POST_TIMEOUT
            )
        except httpx.HTTPError as exc:
            log.warning("alert not delivered to the sink: %s", exc)
            return False
        if answer.status_code >= 300:
            log.warning("the alert sink answered %d", answer.status_code)
            return False
        return True
