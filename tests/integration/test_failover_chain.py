"""A chain of four providers on real RabbitMQ, Cassandra and the sandbox: a batch walks
SendGrid → Mailgun → Amazon SES → the SMTP relay and each recipient is sent once; and mail
that SendGrid and Mailgun each drop on their side reaches its recipient through SES."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from shared.delivery.attempts import AttemptStore, chunk_line
from shared.delivery.recipient_answers import ACCEPTED_BY_RELAY
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.integration.stack import Stack, emails, fast_settings, full_stack

CHAIN = "sg,mg,ses,smtp"


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings, chain=CHAIN, max_attempts=6), db) as s:
        yield s


async def test_a_batch_fails_over_down_the_whole_chain_and_is_sent_once(
    stack: Stack, db: Database
) -> None:
    """SendGrid refuses (429), Mailgun answers 503 and its query API finds nothing, SES
    throttles every call (429): the relay takes the chunk, and nobody else ever did."""
    to = emails(3)
    await stack.fault("sendgrid", status=429, count=1)
    await stack.fault("mailgun", status=503, count=1)
    # SES is called once per recipient for personal copies: each call is throttled.
    await stack.fault("ses", status=429, count=len(to))
    batch_id = await stack.submit(to)

    async with stack.consuming():
        logs = await stack.final(batch_id, len(to), timeout=120)

    line = await AttemptStore(db).line(uuid.UUID(batch_id), chunk_line(0))
    assert [(a.attempt, a.provider) for a in line] == [
        (0, "sg"),
        (1, "mg"),
        (2, "ses"),
        (3, "smtp"),
    ]
    assert [a.state for a in line[:3]] == ["rejected", "resolved", "rejected"]
    assert line[3].state == "accepted"
    for email in to:
        log = logs[email]
        assert (log["state"], log["event"]) == ("success", "delivered"), log
        assert log["timeline"][-1]["detail"] == ACCEPTED_BY_RELAY
        assert await stack.accepted(email) == {"sendgrid": 0, "mailgun": 0, "smtp": 1}


async def test_mail_sendgrid_and_mailgun_each_drop_on_their_side_is_delivered_by_ses(
    stack: Stack,
) -> None:
    """Dropped by SendGrid's spam checker, then by Mailgun (retries given up): each drop
    hands the recipient on, once, and SES delivers it; a plain recipient goes through
    SendGrid alone."""
    tag = uuid.uuid4().hex[:8]
    walker, plain = f"sgmgdrop.{tag}@example.com", f"ann.{tag}@example.com"
    batch_id = await stack.submit([walker, plain])

    async with stack.consuming():
        logs = await stack.final(batch_id, 2, timeout=120)

    assert (logs[walker]["state"], logs[walker]["event"]) == ("success", "delivered")
    assert logs[walker]["providers"]["sg"].startswith("dropped")
    assert logs[walker]["providers"]["mg"].startswith("dropped")
    assert logs[walker]["providers"]["ses"] == "delivered"
    assert await stack.accepted(walker) == {"sendgrid": 1, "mailgun": 1, "ses": 1}
    assert (logs[plain]["state"], logs[plain]["providers"]) == ("success", {"sg": "delivered"})
    assert await stack.accepted(plain) == {"sendgrid": 1, "mailgun": 0}


async def test_a_recipient_one_provider_refuses_for_now_goes_on_alone(
    stack: Stack, db: Database
) -> None:
    """SES answers each personal copy on its own: the one it throttles goes on to the relay
    by her own line, the others stay with SES; each is sent once."""
    to = emails(3)
    await stack.fault("sendgrid", status=429, count=1)
    await stack.fault("mailgun", status=429, count=1)
    await stack.fault("ses", status=429, count=1)
    batch_id = await stack.submit(to)

    async with stack.consuming():
        logs = await stack.final(batch_id, len(to), timeout=120)

    counts = [await stack.accepted(email) for email in to]
    assert sorted(counts, key=lambda c: sorted(c)) == [
        {"sendgrid": 0, "mailgun": 0, "ses": 1},
        {"sendgrid": 0, "mailgun": 0, "ses": 1},
        {"sendgrid": 0, "mailgun": 0, "smtp": 1},
    ]
    assert {log["state"] for log in logs.values()} == {"success"}
    line = await AttemptStore(db).line(uuid.UUID(batch_id), chunk_line(0))
    assert [(a.provider, a.state) for a in line] == [
        ("sg", "rejected"),
        ("mg", "rejected"),
        ("ses", "accepted"),
    ]
