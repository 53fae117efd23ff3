"""Provider ``smtp`` end to end on real RabbitMQ and Cassandra: a batch pinned to the
sandbox's SMTP relay (aiosmtpd, through the real adapter and its pool) is delivered, and its
recipients' logs say the relay accepted it, which is all a relay will ever say.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared.delivery.recipient_answers import ACCEPTED_BY_RELAY
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.integration.stack import Stack, emails, fast_settings, full_stack


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings, chain="sg,mg,smtp"), db) as s:
        yield s


async def test_a_batch_pinned_to_the_relay_is_accepted_by_relay(stack: Stack) -> None:
    """Every recipient ends delivered through smtp, with the relay's acceptance as reason,
    and the relay (not SendGrid or Mailgun) got each of them once."""
    to = emails(3)
    batch_id = await stack.submit(to, provider="smtp")

    async with stack.consuming():
        logs = await stack.final(batch_id, len(to))

    for email in to:
        log = logs[email]
        assert (log["state"], log["providers"]) == ("success", {"smtp": "delivered"}), log
        assert [(t["provider"], t["event"], t["detail"]) for t in log["timeline"]] == [
            ("smtp", "delivered", ACCEPTED_BY_RELAY)
        ]
        assert await stack.accepted(email) == {"sendgrid": 0, "mailgun": 0, "smtp": 1}
