"""Single-recipient re-sends and hand-offs under faults: real services end to end.

A provider-side drop or a deferral past its deadline hands one recipient over to another
provider through its own attempt line (``log.<ns>.<log_uuid>[.retry.<n>]``), claimed like a
chunk's; a crash after the claim finishes later instead of leaving the recipient queued, and
a failure reported afterwards by the provider we moved away from decides nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import orjson
import pytest
from prometheus_client import CollectorRegistry

from shared.core.errors import DependencyUnavailable
from shared.delivery.attempts import AttemptStore, recipient_line
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.ingest.ingest import Ingest, IngestMetrics
from shared.providers import sendgrid_events
from tests.integration.faults import FaultyDatabase, after
from tests.integration.harness import eventually
from tests.integration.stack import Stack, crash_at, fast_settings, full_stack, until


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings), db, webhooks={"deferred_deadline": 2}) as s:
        yield s


def _address(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}@example.com"


#: The World carries the kill at ``calling`` (README: what carries the moved cases).
SIMULATED = pytest.mark.simulated


@pytest.mark.parametrize(
    "point", [pytest.param("calling", marks=SIMULATED), "answered", "recorded"]
)
async def test_a_resend_killed_after_its_claim_still_ends(stack: Stack, point: str) -> None:
    """SendGrid drops the recipient on its side; the re-send via Mailgun is killed after its
    claim: it is redelivered and finished, never left queued, and Mailgun sends it once."""
    email = _address("sgdrop")
    batch_id = await stack.submit([email])
    await stack.split(batch_id)
    assert await stack.doomed(stack.queue("sg"), crash_at("none")) == "survived"

    died = await stack.doomed(stack.log_queue("mg"), crash_at(point), timeout=30)

    assert died == point
    async with stack.consuming():
        logs = await stack.final(batch_id, 1)
    assert (logs[email]["state"], logs[email]["event"]) == ("success", "delivered")
    assert await stack.accepted(email) == {"sendgrid": 1, "mailgun": 1}


async def test_a_long_deferral_is_handed_over_and_the_first_providers_late_failure_loses(
    stack: Stack,
) -> None:
    """SendGrid keeps deferring; after the deadline Mailgun gets the recipient and delivers
    it. SendGrid's later bounce of its own (superseded) attempt changes nothing: the
    recipient stays ``success`` and the stats do not count a failure."""
    email = _address("sgdefer")
    async with stack.consuming():
        batch_id = await stack.submit([email])
        logs = await stack.final(batch_id, 1)
        assert (logs[email]["state"], logs[email]["providers"]["mg"]) == ("success", "delivered")

        late = await stack.sendgrid_event(
            batch_id, email, "bounce", type="bounce", reason="550 5.1.1 no such user"
        )

    assert late.status_code == 200
    logs = await stack.logs(batch_id)
    assert (logs[email]["state"], logs[email]["event"]) == ("success", "delivered")
    assert any(e["event"] == "bounced" for e in logs[email]["timeline"])
    stats = await stack.batch_stats(batch_id)
    assert (stats["success"], stats["failed"], stats["bounced"]) == (1, 0, 0)
    line = await AttemptStore(stack.db).line(uuid.UUID(batch_id), recipient_line(_log(logs, email)))
    assert [(a.provider, a.cause) for a in line] == [("mg", "c.0")]


async def test_replayed_drops_hand_a_recipient_over_once(stack: Stack) -> None:
    """The same provider-side drop reported three times plans one re-send, not three."""
    email = _address("sgdrop")
    async with stack.consuming():
        batch_id = await stack.submit([email])
        await stack.final(batch_id, 1)
        for _ in range(3):
            resp = await stack.sendgrid_event(
                batch_id, email, "dropped", reason="Spam Content (if Spam Checker app is enabled)"
            )
            assert resp.status_code == 200
    logs = await stack.logs(batch_id)
    line = await AttemptStore(stack.db).line(uuid.UUID(batch_id), recipient_line(_log(logs, email)))
    assert len(line) == 1
    assert await stack.accepted(email) == {"sendgrid": 1, "mailgun": 1}


async def test_a_hand_off_that_died_half_way_is_finished_by_the_reports_retry(
    stack: Stack,
) -> None:
    """The intake plans the re-send of a SendGrid drop and dies before it is done (its last
    write times out); SendGrid retries the report, and the hand-off is finished: Mailgun
    sends the recipient once and it ends delivered, instead of staying queued."""
    email = _address("r")
    await stack.fault("sendgrid", webhooks=False, count=1)  # only our own reports below
    async with stack.consuming():
        batch_id = await stack.submit([email])
        await until(lambda: _accepted_by(stack, email, "sendgrid"))
        drop = _sendgrid_drop(batch_id, email)
        dying = _ingest(stack, FaultyDatabase(stack.db, after("superseded = superseded +")))
        with pytest.raises(DependencyUnavailable):
            await dying.apply_all(sendgrid_events.parse_events(drop).events)

        await _ingest(stack, stack.db).apply_all(sendgrid_events.parse_events(drop).events)

        logs = await stack.final(batch_id, 1)
    assert logs[email]["state"] == "success"
    assert await stack.accepted(email) == {"sendgrid": 1, "mailgun": 1}


async def _accepted_by(stack: Stack, email: str, provider: str) -> bool:
    return (await stack.accepted(email))[provider] == 1


def _sendgrid_drop(batch_id: str, email: str) -> bytes:
    event = {
        "email": email,
        "event": "dropped",
        "reason": "Spam Content (if Spam Checker app is enabled)",
        "timestamp": int(datetime.now(UTC).timestamp()),
        "sg_event_id": uuid.uuid4().hex,
        "batch_id": batch_id,
        "chunk": "0",
        "sd_attempt": "c.0",
    }
    return orjson.dumps([event])


def _ingest(stack: Stack, db: Database) -> Ingest:
    return Ingest.over(
        db,
        stack.api_app.state.resources.broker,
        stack.settings,
        IngestMetrics.create(CollectorRegistry()),
    )


def _log(logs: dict[str, dict[str, object]], email: str) -> uuid.UUID:
    return uuid.UUID(str(logs[email]["log_id"]))


async def test_without_a_query_api_the_resend_waits_for_the_webhook_window(
    settings: Settings, db: Database
) -> None:
    """Without SendGrid's Email Activity add-on and without webhooks, an accepted request
    whose answer was lost is sent again through Mailgun only after the webhook window: a
    possible duplicate, never a recipient failed to avoid one."""
    s = fast_settings(settings, webhook_window=4)
    async with full_stack(s, db, sandbox={"sendgrid_email_activity": False}) as stack:
        email = _address("r")
        await stack.fault("sendgrid", accept=True, latency_ms=4000, webhooks=False, count=1)
        async with stack.consuming():
            batch_id = await stack.submit([email])
            logs = await stack.final(batch_id, 1, timeout=60)

            async def both() -> bool:
                return await stack.accepted(email) == {"sendgrid": 1, "mailgun": 1}

            await eventually(both, timeout=30)
    assert logs[email]["state"] == "success"
    assert logs[email]["providers"]["sg"].startswith("unknown")
