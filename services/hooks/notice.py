"""Telling a user their webhook endpoint was disabled: a mail through Safedelivr itself,
sent like operators' alert mail (``shared.ops.alerts``): a batch of the system account, stored
and then published through the outbox, so a crash after storing still sends it."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared.accounts.accounts import ensure_user, get_user
from shared.core.errors import DependencyUnavailable
from shared.delivery.acceptance import Acceptance
from shared.delivery.batchstore import NewBatch, new_batch_id
from shared.delivery.validation import InvalidRequest, parse_batch_request
from shared.infra.db import Database
from shared.ops.alerts import ALERT_CHUNK, SYSTEM_LOGIN
from shared.outbound.hook_store import Endpoint

log = logging.getLogger(__name__)


def mail_body(endpoint: Endpoint, reason: str, dashboard_url: str) -> dict[str, Any]:
    """The ``POST /v1/batches``-shaped body of the notice (without from and to; pure)."""
    return {
        "subject": "Your Safedelivr webhook endpoint was disabled",
        "text": (
            f"We stopped sending events to your webhook endpoint\n\n  {endpoint.url}\n\n"
            f"because {reason}.\n\nEvents that could not be delivered are kept in its "
            "delivery log for 30 days. Once the endpoint answers again, enable it "
            f'(PATCH /v1/webhooks/{endpoint.endpoint_id} with {{"enabled": true}}) and '
            f"replay what it missed.\n\nDashboard: {dashboard_url}\n"
            f"Endpoint id: {endpoint.endpoint_id}\n"
        ),
        "categories": ["safedelivr-webhook-disabled"],
    }


@dataclass
class DisabledMail:
    """Mails a user that one of their endpoints was disabled (never raises)."""

    db: Database
    acceptance: Acceptance
    mail_from: str
    dashboard_url: str

    async def __call__(self, endpoint: Endpoint, reason: str) -> None:
        try:
            user = await get_user(self.db, endpoint.user_id)
        except DependencyUnavailable as exc:
            log.warning("webhook notice not mailed: %s", exc)
            return
        if not self.mail_from:
            log.info("webhook notice not mailed: SAFEDELIVR_HOOKS_MAIL_FROM is not set")
            return
        if user is None or not user.email:
            log.info("webhook notice not mailed: user %s has no address", endpoint.user_id)
            return
        try:
            parsed = parse_batch_request(
                {
                    "from": self.mail_from,
                    "to": [user.email],
                    **mail_body(endpoint, reason, self.dashboard_url),
                },
                max_recipients=ALERT_CHUNK,
            )
        except InvalidRequest as exc:
            log.warning("webhook notice not mailed: %s %s", exc, exc.fields)
            return
        try:
            system = await ensure_user(self.db, SYSTEM_LOGIN)
            batch = NewBatch(
                batch_id=new_batch_id(datetime.now(UTC).timestamp()),
                user_id=system,
                message=parsed.message,
                recipients=parsed.recipients,
                chunk_size=ALERT_CHUNK,
            )
            await self.acceptance.store(batch)
        except DependencyUnavailable as exc:
            log.warning("webhook notice not mailed (not stored): %s", exc)
            return
        if await self.acceptance.publish(batch.batch_id):  # else the outbox relay will
            with contextlib.suppress(DependencyUnavailable):
                await self.acceptance.outbox.done(batch.batch_id)
        log.info("webhook notice for %s mailed as batch %s", endpoint.endpoint_id, batch.batch_id)
