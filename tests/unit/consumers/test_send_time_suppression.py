"""Suppressions checked again at send time (``services.consumers.screening``), over the
in-memory world: an address suppressed after its batch was accepted is never mailed, ends
``dropped``/``failed`` on its own row and counts ``failed`` once, whichever attempt finds it
(the first, a failover, a re-send) and wherever the process dies or the check fails."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from services.consumers import protocol
from shared.core.batch_ids import accepted_at
from shared.core.errors import DependencyUnavailable
from shared.core.models import Address, BatchJob, Chunk, Engagement, Message, Recipient
from shared.delivery.attempts import chunk_line, recipient_line
from shared.delivery.batchstore import NewBatch
from shared.delivery.precedence import visible
from shared.delivery.recipients import Report, log_id_for
from shared.infra.topology import batch_key
from shared.outbound.hook_store import Endpoint
from shared.outbound.user_hooks import FakeUserHooks
from shared.providers.base import Receipt
from tests.fakes.broker import FakeMessage
from tests.fakes.world import World, refused

A, B, C = "ann@example.org", "bob@example.org", "cat@example.org"
X, Y, Z = "xavier@example.org", "yves@example.org", "zoe@example.org"


class Died(BaseException):
    """The process died here (nothing in the process may handle it)."""


async def _accept(w: World, *emails: str, chunk_size: int = 10, **message: object) -> NewBatch:
    """Store a batch as the API does (its message with ``message``'s fields) and publish it."""
    batch_id = uuid.uuid1()
    batch = NewBatch(
        batch_id=batch_id,
        user_id=uuid.uuid4(),
        message=Message.model_validate(
            {"from": {"email": "news@example.com"}, "subject": "Hi", "text": "Hello", **message}
        ),
        recipients=[
            Recipient(log_id=log_id_for(batch_id, e), email=e, name=None, substitutions={})
            for e in emails
        ],
        chunk_size=chunk_size,
    )
    w.clock.now = max(w.clock.now, accepted_at(batch_id) + timedelta(milliseconds=1))
    await w.batches.write(batch)
    await w.batches.index(batch)
    await w.broker.publish(batch_key(batch_id), BatchJob(batch_id=batch_id).encode())
    return batch


async def _suppress(w: World, batch: NewBatch, *emails: str, reason: str = "bounced") -> None:
    for email in emails:
        await w.suppressions.add(batch.user_id, email, reason=reason, source="sg")


def _mailed(w: World) -> list[str]:
    """Every address any provider was asked to mail (to, cc, bcc), in call order."""
    out: list[str] = []
    for provider in w.providers.values():
        for chunk in provider.sent:
            out += [r.email for r in chunk.recipients]
            out += [a.email for a in (*chunk.message.cc, *chunk.message.bcc)]
    return out


async def _outcomes(w: World, batch: NewBatch) -> dict[str, tuple[str, str, str | None]]:
    """Each recipient's (state, event, reason) as the logs API shows them."""
    out = {}
    for r in await w.recipients.batch_rows(batch.batch_id):
        seen = visible(r)
        out[r["email"]] = (seen.state, seen.event, seen.reason)
    return out


async def _run_dying_once(w: World, point: str) -> None:
    """Run the world until the process dies at ``point`` once; the broker redelivers the
    unacked message, and the world runs to the end."""
    died: list[str] = []

    async def die(at: str, job: protocol.Job) -> None:
        del w.fault_points[point]
        died.append(at)
        raise Died(at)

    w.fault_points[point] = die
    for _ in range(100):
        if died:
            break
        for name in w._work_queues():
            message = await w.broker.get(name)
            if message is None:
                continue
            try:
                await w.deliver(message)
            except Died:
                again = FakeMessage(message.routing_key, message.body)
                again.deliveries = message.deliveries + 1
                w.broker.queues[name].append(again)
            break
    assert died, f"the send path never reached {point!r}"
    await w.settle()


DROPPED_B = ("failed", "dropped", "suppressed: bounced")


# -- what the check does ----------------------------------------------------------------------


async def test_a_recipient_suppressed_after_acceptance_is_not_sent_and_ends_dropped() -> None:
    """Bob bounced elsewhere after his batch was accepted: Ann and Cat go, Bob is dropped,
    counted failed once."""
    w = World()
    batch = await w.accept(A, B, C)
    await _suppress(w, batch, B)
    await w.settle()

    assert _mailed(w) == [A, C]
    outcomes = await _outcomes(w, batch)
    assert outcomes[B] == DROPPED_B
    assert outcomes[A][:2] == outcomes[C][:2] == ("queued", "sent")
    assert await w.counts(batch) == {"queued": 3, "failed": 1}
    stat = await w.stat_row(batch, B)
    assert stat is not None and stat["outcome"] == "failed"
    assert w.counter("recipients_suppressed") == 1
    rows = await w.rows(batch)
    assert rows[B]["own"] and rows[B]["providers"] is None  # never handed to a provider


async def test_when_every_recipient_is_suppressed_no_provider_is_called() -> None:
    """The chunk ends cleanly: its attempt accepted for nobody, nothing left in any queue."""
    w = World()
    batch = await w.accept(A, B)
    await _suppress(w, batch, A, B)
    await w.settle()

    assert _mailed(w) == []
    assert await w.states(batch) == {A: "failed", B: "failed"}
    assert await w.counts(batch) == {"queued": 2, "failed": 2}
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (attempt.provider, attempt.state, attempt.decision) == ("sg", "accepted", "done")
    assert w.dead == [] and w.broker.next_due() is None


async def test_users_webhooks_are_told_once_that_the_suppressed_was_dropped() -> None:
    """Bob's drop reaches the user's endpoint as ``recipient.dropped`` with its reason; told
    again by the retry of a drop whose write failed, it is the same webhook message."""
    hooks = FakeUserHooks()
    w = World(user_hooks=hooks)
    batch = await w.accept(A, B)
    endpoint = Endpoint(
        user_id=batch.user_id, endpoint_id=uuid.uuid4(), url="https://hooks.example/x",
        events=frozenset(), secret="whsec_x", created_at=datetime.now(UTC),
    )  # fmt: skip
    hooks.add(batch.user_id, endpoint)
    await _suppress(w, batch, B)
    w.db.fail("recipients.suppressed", DependencyUnavailable("cassandra", "write timeout"))
    await w.settle()

    queued = [q for q in hooks.queued[endpoint.endpoint_id] if q.type == "recipient.dropped"]
    assert len(queued) == 2 and len({q.msg_id for q in queued}) == 1
    data = orjson.loads(queued[0].body)["data"]
    assert (data["email"], data["reason"], data["outcome"]) == (B, "suppressed: bounced", "dropped")


async def test_a_suppression_is_read_once_per_chunk_in_one_query() -> None:
    """Two chunks of three recipients: two reads of the suppression list, one each."""
    w = World()
    await w.accept(*(f"r{i}@example.org" for i in range(6)), chunk_size=3)
    await w.settle()

    assert w.db.calls.count("suppressions.suppressed") == 2


async def test_a_full_chunk_with_its_copies_is_checked_in_one_read() -> None:
    """A thousand recipients (a provider request's most) with a cc: one read, no more."""
    w = World()
    emails = [f"r{i:04d}@example.org" for i in range(999)]
    batch = await _accept(w, *emails, chunk_size=1000, cc=[{"email": X}])
    await _suppress(w, batch, emails[500])
    await w.settle()

    assert w.db.calls.count("suppressions.suppressed") == 1
    (chunk,) = w.providers["sg"].sent
    assert len(chunk.recipients) == 998
    assert (await _outcomes(w, batch))[emails[500]] == DROPPED_B


async def test_a_bounce_arriving_between_attempts_is_seen_by_the_failover() -> None:
    """SendGrid refuses the chunk; before Mailgun's turn Bob bounces in another batch: the
    retry sends Ann alone."""
    w = World()
    batch = await w.accept(A, B)

    async def bounce_then_refuse(chunk: Chunk) -> Receipt:
        await _suppress(w, batch, B)
        raise refused("sg")

    w.providers["sg"].answers.append(bounce_then_refuse)
    await w.settle()

    assert [[r.email for r in c.recipients] for c in w.providers["sg"].sent] == [[A, B]]
    assert w.providers["mg"].emails() == [A]
    outcomes = await _outcomes(w, batch)
    assert outcomes[B] == DROPPED_B
    assert (await w.rows(batch))[B]["providers"] == {"sg": "failed: " + refused("sg").message}
    assert await w.counts(batch) == {"queued": 2, "failed": 1}


async def test_a_resend_of_one_recipient_checks_the_list_again() -> None:
    """SendGrid dropped Ann for a reason of its own; before Mailgun re-sends her she
    unsubscribed: the re-send mails nobody and she ends failed, counted once."""
    w = World()
    batch = await w.sent(A)
    a = log_id_for(batch.batch_id, A)
    await w.recipients.reported(Report(
        batch.batch_id, batch.user_id, 0, a, provider="sg", provider_result="dropped",
        message_id=None, stage_rank=5, rank=0, when=w.clock.now + timedelta(seconds=5),
        event="dropped", state=None, reason="provider blocklist", evidence=None,
    ))  # fmt: skip  # what ingest writes for SendGrid's own drop
    await _suppress(w, batch, A, reason="unsubscribed")
    await w.dispatcher.handoff(
        batch_id=batch.batch_id, user_id=batch.user_id, chunk=0, log_id=a,
        cause="c.0", failed="sg", why="dropped: provider blocklist",
    )  # fmt: skip
    await w.settle()

    assert w.providers["mg"].sent == []
    assert (await _outcomes(w, batch))[A] == ("failed", "dropped", "suppressed: unsubscribed")
    (resend,) = await w.attempts.line(batch.batch_id, recipient_line(a))
    assert (resend.provider, resend.state) == ("mg", "accepted")
    assert await w.counts(batch) == {"queued": 1, "failed": 1}


async def test_a_delivery_reported_later_for_an_earlier_attempt_outranks_the_drop() -> None:
    """Our drop says only that this attempt did not mail Bob: the provider's word about an
    earlier attempt (late evidence) still decides, and the stats follow it."""
    w = World()
    batch = await w.accept(A, B)
    await _suppress(w, batch, B)
    await w.settle()
    b = log_id_for(batch.batch_id, B)
    await w.recipients.reported(Report(
        batch.batch_id, batch.user_id, 0, b, provider="sg", provider_result="delivered",
        message_id=None, stage_rank=6, rank=6, when=accepted_at(batch.batch_id),
        event="delivered", state="success", reason=None, evidence=None,
    ))  # fmt: skip

    assert (await _outcomes(w, batch))[B][:2] == ("success", "delivered")
    assert await w.counts(batch) == {"queued": 2, "success": 1}


async def test_suppressed_cc_and_bcc_addresses_are_left_out_of_the_request() -> None:
    """The recipients go; of the copies only the address still allowed is mailed."""
    w = World()
    batch = await _accept(w, A, B, cc=[{"email": X}, {"email": Y}], bcc=[{"email": Z}])
    await _suppress(w, batch, Y, Z)
    await w.settle()

    (chunk,) = w.providers["sg"].sent
    assert [r.email for r in chunk.recipients] == [A, B]
    assert (chunk.message.cc, chunk.message.bcc) == ((Address(email=X),), ())
    assert await w.counts(batch) == {"queued": 2}


async def test_copies_alone_are_never_mailed_when_every_recipient_is_suppressed() -> None:
    w = World()
    batch = await _accept(w, A, cc=[{"email": X}])
    await _suppress(w, batch, A)
    await w.settle()

    assert _mailed(w) == []
    assert await w.states(batch) == {A: "failed"}


async def test_mail_naming_a_list_is_checked_against_the_lists_unsubscribes() -> None:
    """Bob unsubscribed from the list "news" only: its mail leaves him out, with why."""
    w = World()
    batch = await _accept(w, A, B, engagement=Engagement(list="news").model_dump())
    await w.suppressions.add(
        batch.user_id, B, reason="unsubscribed", source="tracker", scope="news"
    )
    await w.settle()

    assert _mailed(w) == [A]
    assert (await _outcomes(w, batch))[B] == (
        "failed",
        "dropped",
        "suppressed: unsubscribed (news)",
    )


# -- faults ----------------------------------------------------------------------------------


async def test_a_failed_read_of_the_list_is_retried_and_nothing_goes_unchecked() -> None:
    """The read times out: the delivery is retried in place, the second read drops Bob, and
    the provider is called once, without him."""
    w = World()
    batch = await w.accept(A, B)
    await _suppress(w, batch, B)
    w.db.fail("suppressions.suppressed", DependencyUnavailable("cassandra", "read timeout"))
    await w.settle()

    assert w.db.calls.count("suppressions.suppressed") == 2
    assert _mailed(w) == [A]
    assert (await _outcomes(w, batch))[B] == DROPPED_B
    assert await w.counts(batch) == {"queued": 2, "failed": 1}
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert attempt.state == "accepted"


@pytest.mark.parametrize(
    ("operation", "applied"),
    [
        ("recipients.suppressed", False),  # the states never landed
        ("recipients.suppressed", True),  # they landed, the answer was lost
        ("stats.outcomes", True),  # the outcome rows landed, the states were never sent
    ],
)
async def test_a_drop_whose_write_fails_is_written_again_and_counted_once(
    operation: str, applied: bool
) -> None:
    """Two dropped at once (outcome rows, then states): whichever write fails, the retry
    ends both dropped, counted once each, and Ann sent once."""
    w = World()
    batch = await w.accept(A, B, C)
    await _suppress(w, batch, B, C)
    w.db.fail(operation, DependencyUnavailable("cassandra", "write timeout"), applied=applied)
    await w.settle()

    assert _mailed(w) == [A]
    outcomes = await _outcomes(w, batch)
    assert outcomes[B] == outcomes[C] == DROPPED_B
    assert await w.counts(batch) == {"queued": 3, "failed": 2}
    assert w.dead == []


@pytest.mark.parametrize(
    "point",
    [
        "screened",  # after the read, before any write
        "dropped",  # after the drop is written, before the request is built
        "before_call",  # the request built, not sent
    ],
)
async def test_a_crash_between_the_check_and_the_call_never_sends_the_suppressed(
    point: str,
) -> None:
    """The process dies holding the call: the attempt is resolved as not sent (no evidence)
    and the next one checks again; Bob is never mailed and counted failed once, Ann is sent
    once."""
    w = World()
    batch = await w.accept(A, B)
    await _suppress(w, batch, B)
    await _run_dying_once(w, point)

    assert _mailed(w) == [A]
    assert (await _outcomes(w, batch))[B] == DROPPED_B
    assert await w.counts(batch) == {"queued": 2, "failed": 1}
    assert await w.stat_row(batch, B) is not None
    assert w.dead == []


async def test_copies_of_one_job_at_once_drop_the_suppressed_once_and_send_the_rest_once() -> None:
    w = World()
    batch = await w.accept(A, B)
    await _suppress(w, batch, B)
    await w.step()  # the splitter
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None
    copy = FakeMessage(message.routing_key, message.body)
    settled = await asyncio.gather(w.deliver(message), w.deliver(copy))
    await w.settle()

    assert set(settled) == {"ack"}
    assert _mailed(w) == [A]
    assert (await _outcomes(w, batch))[B] == DROPPED_B
    assert await w.counts(batch) == {"queued": 2, "failed": 1}


async def test_a_redelivered_job_after_the_chunk_ended_changes_nothing() -> None:
    """The chunk's job delivered again once everything is done: no call, no second count."""
    w = World()
    batch = await w.accept(A, B)
    await _suppress(w, batch, B)
    await w.step()
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None
    again = FakeMessage(message.routing_key, message.body)
    assert await w.deliver(message) == "ack"
    await w.settle()
    assert await w.deliver(again) == "ack"
    await w.settle()

    assert _mailed(w) == [A]
    assert await w.counts(batch) == {"queued": 2, "failed": 1}
    assert w.counter("recipients_suppressed") == 1
