"""The send path under faults, over the in-memory world (``tests/fakes/world.py``): each way a
provider call can fail (unreachable, rate limiting with Retry-After, permanent refusal, a
timeout or a 5xx answer whose outcome is unknown) on each attempt of the chain; every attempt
failing; a job delivered twice at once or redelivered after the process died at an await;
malformed and forged jobs; a provider that accepted only part of a chunk. Each test asserts
outcomes: what every recipient ends as, the attempts recorded, what each provider was asked to
send (every recipient accepted exactly once), and what was dead-lettered."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta

import orjson
import pytest

from services.consumers import protocol
from shared.core.errors import PermanentProviderError, ProviderError, TransientProviderError
from shared.core.models import BatchJob, Chunk, ChunkJob, LogJob
from shared.delivery.attempts import chunk_line, recipient_line
from shared.delivery.precedence import visible
from shared.delivery.recipients import Report, log_id_for
from shared.infra.topology import batch_key, dispatch_key, log_key
from shared.providers.base import Receipt
from tests.fakes.broker import FakeMessage
from tests.fakes.world import World, answered, refused

A, B, C = "ann@example.org", "bob@example.org", "cat@example.org"
CHAIN = ("sg", "mg")

Fault = Callable[[str], ProviderError]


def _retry_after(code: str) -> ProviderError:
    return TransientProviderError(code, "429 slow down", status=429, retry_after=20)


def _permanent(code: str) -> ProviderError:
    return PermanentProviderError(code, "413 payload too large", status=413)


def _timeout(code: str) -> ProviderError:
    return TransientProviderError(code, "read timeout", outcome_unknown=True)


def _rate_limited(code: str) -> ProviderError:
    return TransientProviderError(code, "429 too many requests", status=429, retry_after=2)


def _refused(code: str) -> ProviderError:
    """The provider could not be reached: nothing went out, a clean failure."""
    return refused(code)


def _gateway_timeout(code: str) -> ProviderError:
    """A 504 answer: the whole request was written, so the provider may have taken it."""
    return answered(code, 504)


#: Each fault, with the kind its attempt's ``error`` column records.
FAULTS: dict[str, tuple[Fault, str]] = {
    "transient-retry-after": (_retry_after, "transient"),
    "permanent": (_permanent, "permanent"),
    "timeout-unknown": (_timeout, "transient"),
    "rate-limited": (_rate_limited, "transient"),
    "unreachable": (_refused, "transient"),
    "http-504-unknown": (_gateway_timeout, "transient"),
}


def _script(w: World, *faults: Fault) -> None:
    """Attempt ``n`` (sent through ``CHAIN[n % 2]``) fails with ``faults[n]``; later ones pass."""
    for n, fault in enumerate(faults):
        code = CHAIN[n % len(CHAIN)]
        w.providers[code].answers.append(fault(code))


def _calls(w: World) -> list[tuple[str, str, list[str]]]:
    """Every provider call as (attempt tag, provider, addresses), in attempt order."""
    out = [
        (c.attempt, code, sorted(r.email for r in c.recipients))
        for code, provider in w.providers.items()
        for c in provider.sent
    ]
    return sorted(out, key=lambda call: (call[0][0], int(call[0].split(".")[1])))


async def _evidence(w: World, batch_id: uuid.UUID) -> dict[str, set[str]]:
    """Each recipient's accepted attempts (one each means sent exactly once)."""
    rows = await w.recipients.batch_rows(batch_id)
    return {r["email"]: set(r["evidence"] or ()) for r in rows}


async def _reasons(w: World, batch_id: uuid.UUID) -> dict[str, str | None]:
    """Each recipient's visible reason (what the logs API shows)."""
    return {r["email"]: visible(r).reason for r in await w.recipients.batch_rows(batch_id)}


# -- one fault on one attempt ---------------------------------------------------------------


@pytest.mark.parametrize("failed_attempt", [0, 1, 2])
@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_fault_on_any_attempt_moves_the_chunk_on_and_sends_each_recipient_once(
    fault: str, failed_attempt: int
) -> None:
    """Attempts before it fail cleanly (the provider unreachable), the faulty one fails its
    way (one whose outcome is unknown is resolved by the query API, which finds nothing),
    the next accepts."""
    w = World(max_attempts=4)
    batch = await w.accept(A, B)
    make, kind = FAULTS[fault]
    _script(w, *[_refused] * failed_attempt, make)
    await w.settle()

    accepted = failed_attempt + 1
    assert _calls(w) == [(f"c.{n}", CHAIN[n % 2], [A, B]) for n in range(accepted + 1)]
    line = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert [a.provider for a in line] == [CHAIN[n % 2] for n in range(accepted + 1)]
    faulty = line[failed_attempt]
    assert faulty.error == f"{kind}|{make(faulty.provider).message}"
    if make(faulty.provider).outcome_unknown:
        assert (faulty.state, faulty.resolution) == ("resolved", "not_accepted")
    else:
        assert faulty.state == "rejected"
    # Retry-After never holds up a different provider; only wrapping the chain waits.
    assert (faulty.decision, faulty.next_provider, faulty.next_attempt, faulty.next_delay) == (
        "retry",
        CHAIN[accepted % 2],
        accepted,
        5 if accepted % 2 == 0 else 0,
    )
    assert line[-1].state == "accepted"
    assert await _evidence(w, batch.batch_id) == {A: {f"c.{accepted}"}, B: {f"c.{accepted}"}}
    assert await w.states(batch) == {A: "queued", B: "queued"}


@pytest.mark.parametrize("failed_attempt", [0, 1, 2])
async def test_a_timeout_the_provider_did_accept_ends_the_chunk_without_a_resend(
    failed_attempt: int,
) -> None:
    """The query API shows the timed-out request was taken: nothing is sent again."""
    w = World(max_attempts=4)
    batch = await w.accept(A, B)
    _script(w, *[_refused] * failed_attempt, _timeout)
    w.providers[CHAIN[failed_attempt % 2]].found = frozenset({A, B})
    await w.settle()

    assert len(_calls(w)) == failed_attempt + 1
    line = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert len(line) == failed_attempt + 1
    assert (line[-1].state, line[-1].resolution, line[-1].decision) == (
        "resolved",
        "accepted",
        "done",
    )
    tag = f"c.{failed_attempt}"
    assert await _evidence(w, batch.batch_id) == {A: {tag}, B: {tag}}


@pytest.mark.parametrize(("retry_after", "waited"), [(20, 20), (2, 5)])
async def test_retry_after_holds_back_the_same_provider_but_never_below_the_backoff(
    retry_after: float, waited: int
) -> None:
    """With one provider, its next attempt waits the longer of Retry-After and the backoff."""
    w = World(chain="sg", max_attempts=3)
    batch = await w.accept(A)
    w.providers["sg"].answers.append(
        TransientProviderError("sg", "429 slow down", status=429, retry_after=retry_after)
    )
    await w.settle()

    first, second = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (first.next_provider, first.next_delay) == ("sg", waited)
    assert first.finished_at is not None
    assert second.created_at - first.finished_at >= timedelta(seconds=waited)
    assert w.providers["sg"].emails() == [A, A]  # refused once, then accepted
    assert await _evidence(w, batch.batch_id) == {A: {"c.1"}}


async def test_a_refusing_provider_is_skipped_for_the_rest_of_the_chunk() -> None:
    """After a permanent refusal the chain cycles over the providers that remain."""
    w = World(max_attempts=6)
    batch = await w.accept(A)
    w.providers["sg"].answers.append(_permanent("sg"))
    w.providers["mg"].answers += [_refused("mg"), _refused("mg")]
    await w.settle()

    line = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert [(a.attempt, a.provider, a.state) for a in line] == [
        (0, "sg", "rejected"),
        (1, "mg", "rejected"),
        (3, "mg", "rejected"),
        (5, "mg", "accepted"),
    ]
    assert len(w.providers["sg"].sent) == 1
    assert await _evidence(w, batch.batch_id) == {A: {"c.5"}}


async def test_a_resend_line_skipping_an_excluded_provider_keeps_going() -> None:
    w = World(max_attempts=6)
    batch = await w.sent(A)
    a = log_id_for(batch.batch_id, A)
    w.providers["mg"].answers += [_refused("mg"), _refused("mg")]
    await w.recipients.reported(Report(
        batch.batch_id, batch.user_id, 0, a, provider="sg", provider_result="dropped",
        message_id=None, stage_rank=5, rank=0, when=w.clock.now + timedelta(seconds=5),
        event="dropped", state=None, reason="provider blocklist", evidence=None,
    ))  # fmt: skip  # what ingest writes for SendGrid's drop
    await w.dispatcher.handoff(
        batch_id=batch.batch_id, user_id=batch.user_id, chunk=0, log_id=a,
        cause="c.0", failed="sg", why="dropped: provider blocklist",
    )  # fmt: skip
    await w.settle()

    line = await w.attempts.line(batch.batch_id, recipient_line(a))
    assert [(x.attempt, x.provider) for x in line][:2] == [(0, "mg"), (1, "mg")]
    assert w.providers["sg"].emails() == [A]  # never handed back to the provider that dropped
    assert len(w.providers["mg"].sent) == 3
    assert line[-1].state == "accepted"


async def test_a_provider_adapter_that_crashes_is_treated_as_an_unknown_outcome() -> None:
    """An adapter bug (not a ProviderError) requeues the job; the call is presumed to have
    gone out, so the evidence (none) decides before the next provider sends."""
    w = World()
    batch = await w.accept(A)

    async def bug(chunk: Chunk) -> Receipt:
        raise RuntimeError("adapter bug")

    w.providers["sg"].answers.append(bug)
    await w.settle()

    assert _calls(w) == [("c.0", "sg", [A]), ("c.1", "mg", [A])]
    first, _ = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (first.state, first.resolution) == ("resolved", "not_accepted")
    assert await _evidence(w, batch.batch_id) == {A: {"c.1"}}
    assert w.dead == []


# -- every attempt failing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "last"),
    [
        ("rate-limited", "mg 429 too many requests"),
        ("unreachable", "mg could not reach Mailgun: ConnectError('connection refused')"),
    ],
)
async def test_when_every_attempt_fails_the_recipients_fail_with_a_visible_reason(
    fault: str, last: str
) -> None:
    w = World(max_attempts=4)
    batch = await w.accept(A, B)
    make, _ = FAULTS[fault]
    _script(w, *[make] * 4)
    await w.settle()

    assert _calls(w) == [(f"c.{n}", CHAIN[n % 2], [A, B]) for n in range(4)]
    reason = f"all 4 attempts failed across sg, mg; last: {last}"
    assert await _reasons(w, batch.batch_id) == {A: reason, B: reason}
    assert await w.states(batch) == {A: "failed", B: "failed"}
    line = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert [a.decision for a in line] == ["retry", "retry", "retry", "give_up"]
    assert line[-1].verdict == reason
    assert await w.counts(batch) == {"queued": 2, "failed": 2}
    assert await _evidence(w, batch.batch_id) == {A: set(), B: set()}


async def test_timeouts_on_every_attempt_give_up_after_the_evidence_says_no() -> None:
    """Unknown outcomes are each resolved (never guessed) before the next attempt."""
    w = World(max_attempts=3)
    batch = await w.accept(A)
    _script(w, _timeout, _timeout, _timeout)
    await w.settle()

    assert _calls(w) == [("c.0", "sg", [A]), ("c.1", "mg", [A]), ("c.2", "sg", [A])]
    line = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert [(a.state, a.resolution) for a in line] == [("resolved", "not_accepted")] * 3
    assert len(w.providers["sg"].lookups) + len(w.providers["mg"].lookups) == 3
    assert await w.states(batch) == {A: "failed"}
    reason = (await _reasons(w, batch.batch_id))[A]
    assert reason is not None and reason.startswith("all 3 attempts failed across sg, mg")


async def test_the_reason_of_a_give_up_after_a_timeout_does_not_claim_a_resend() -> None:
    w = World(max_attempts=2)
    batch = await w.accept(A)
    _script(w, _refused, _timeout)
    await w.settle()

    assert await w.states(batch) == {A: "failed"}
    reason = (await _reasons(w, batch.batch_id))[A]
    assert reason is not None
    assert "sent again" not in reason


async def test_refusal_by_every_provider_is_the_visible_reason_without_cycling() -> None:
    w = World(max_attempts=6)
    batch = await w.accept(A, B)
    _script(w, _permanent, _permanent)
    await w.settle()

    assert _calls(w) == [("c.0", "sg", [A, B]), ("c.1", "mg", [A, B])]
    reason = "rejected by every provider: 413 payload too large"
    assert await _reasons(w, batch.batch_id) == {A: reason, B: reason}
    rows = await w.rows(batch)
    assert rows[A]["providers"] == {
        "mg": "failed: 413 payload too large",
        "sg": "failed: 413 payload too large",
    }


# -- duplicates ----------------------------------------------------------------------------------


@pytest.mark.parametrize("copies", [2, 3])
@pytest.mark.parametrize("first_answer", ["accepts", "refuses"])
async def test_copies_of_one_job_delivered_at_once_call_the_provider_once(
    copies: int, first_answer: str
) -> None:
    w = World()
    batch = await w.accept(A, B)
    await w.step()  # the splitter
    if first_answer == "refuses":
        _script(w, _refused)
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None
    duplicates = [FakeMessage(message.routing_key, message.body) for _ in range(copies - 1)]
    settled = await asyncio.gather(w.deliver(message), *(w.deliver(d) for d in duplicates))
    await w.settle()

    assert set(settled) == {"ack"}
    assert len(w.providers["sg"].sent) == 1
    accepted = "c.0" if first_answer == "accepts" else "c.1"
    assert len(w.providers["mg"].sent) == (1 if first_answer == "refuses" else 0)
    assert await _evidence(w, batch.batch_id) == {A: {accepted}, B: {accepted}}


async def test_copies_of_a_retry_job_delivered_at_once_call_the_next_provider_once() -> None:
    w = World()
    batch = await w.accept(A)
    _script(w, _refused)
    while await w.step():
        if await w.broker.queue_depth(w.broker.topology.provider_queue("mg")):
            break
    message = await w.broker.get(w.broker.topology.provider_queue("mg"))
    assert message is not None and message.routing_key == dispatch_key("mg", batch.batch_id, 1)
    copy = FakeMessage(message.routing_key, message.body)
    await asyncio.gather(w.deliver(message), w.deliver(copy))
    await w.settle()

    assert _calls(w) == [("c.0", "sg", [A]), ("c.1", "mg", [A])]
    assert await _evidence(w, batch.batch_id) == {A: {"c.1"}}


async def test_copies_of_a_resend_job_delivered_at_once_send_the_recipient_once() -> None:
    w = World()
    batch = await w.sent(A, B)
    b = log_id_for(batch.batch_id, B)
    await w.dispatcher.handoff(
        batch_id=batch.batch_id, user_id=batch.user_id, chunk=0, log_id=b,
        cause="c.0", failed="sg", why="dropped: provider blocklist",
    )  # fmt: skip
    message = await w.broker.get(w.broker.topology.log_queue("mg"))
    assert message is not None
    copy = FakeMessage(message.routing_key, message.body)
    await asyncio.gather(w.deliver(message), w.deliver(copy))
    await w.settle()

    assert w.providers["mg"].emails() == [B]
    (resend,) = await w.attempts.line(batch.batch_id, recipient_line(b))
    assert resend.state == "accepted"


@pytest.mark.parametrize(
    "point", ["read", "calling", "before_call", "answered", "recorded", "effects"]
)
async def test_a_duplicate_arriving_at_any_point_of_a_refused_call_sends_nothing_twice(
    point: str,
) -> None:
    """A copy of the job runs to completion while the first delivery waits at ``point``."""
    w = World()
    batch = await w.accept(A, B)
    await w.step()
    _script(w, _refused)
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None

    async def duplicate(at: str, job: protocol.Job) -> None:
        if job.attempt == 0:
            del w.fault_points[point]
            assert await w.deliver(FakeMessage(message.routing_key, message.body)) == "ack"

    w.fault_points[point] = duplicate
    assert await w.deliver(message) == "ack"
    await w.settle()

    assert point not in w.fault_points  # the interleaving happened
    assert _calls(w) == [("c.0", "sg", [A, B]), ("c.1", "mg", [A, B])]
    assert await _evidence(w, batch.batch_id) == {A: {"c.1"}, B: {"c.1"}}
    line = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert [(a.provider, a.state) for a in line] == [("sg", "rejected"), ("mg", "accepted")]


# -- crashes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("point", "sg_calls"),
    [
        ("read", 1),
        ("calling", 0),  # marked calling, never called: resolved as not accepted
        ("before_call", 0),
        ("answered", 1),  # the refusal died with the process: resolved as not accepted
        ("recorded", 1),
        ("effects", 1),
        ("followed", 1),  # the retry was out already: its second copy is absorbed
    ],
)
async def test_a_crash_anywhere_on_a_refused_attempt_still_fails_over_exactly_once(
    point: str, sg_calls: int
) -> None:
    w = World()
    batch = await w.accept(A, B)
    _script(w, _refused)
    job = await w.crash_once(point, attempt=0)

    assert (job.provider, job.attempt) == ("sg", 0)
    assert len(w.providers["sg"].sent) == sg_calls
    assert [c.attempt for c in w.providers["mg"].sent] == ["c.1"]
    assert await _evidence(w, batch.batch_id) == {A: {"c.1"}, B: {"c.1"}}
    assert await w.states(batch) == {A: "queued", B: "queued"}
    assert w.dead == []


@pytest.mark.parametrize("point", ["answered", "recorded", "effects", "followed"])
async def test_a_crash_while_giving_up_fails_each_recipient_once(point: str) -> None:
    w = World(max_attempts=2)
    batch = await w.accept(A, B)
    _script(w, _refused, _refused)
    await w.crash_once(point, attempt=1)

    assert len(_calls(w)) == 2
    assert await w.states(batch) == {A: "failed", B: "failed"}
    assert await w.counts(batch) == {"queued": 2, "failed": 2}
    line = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert [a.decision for a in line] == ["retry", "give_up"]
    reasons = await _reasons(w, batch.batch_id)
    assert all(r and r.startswith("all 2 attempts failed") for r in reasons.values())


@pytest.mark.parametrize("point", ["looked", "resolved", "effects"])
async def test_a_crash_while_resolving_a_timeout_resends_only_the_unaccepted(point: str) -> None:
    """The query API says SendGrid took Ann; wherever the resolver dies, Bob alone goes to
    Mailgun, once."""
    w = World()
    batch = await w.accept(A, B)
    _script(w, _timeout)
    w.providers["sg"].found = frozenset({A})
    await w.crash_once(point, attempt=0)

    assert _calls(w) == [("c.0", "sg", [A, B]), ("c.1", "mg", [B])]
    assert await _evidence(w, batch.batch_id) == {A: {"c.0"}, B: {"c.1"}}
    first, _ = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (first.resolution, first.decision) == ("partial", "retry")


#: Where a process may die on a 504 whose query API found ``took``: a call resolved as
#: accepted by everyone has no effects or follow-up to die in.
CRASHES_ON_5XX = [
    (took, point)
    for took in (frozenset({A, B}), frozenset({A}), frozenset())
    for point in ("answered", "recorded", "looked", "resolved", "effects", "followed")
    if took != {A, B} or point not in ("effects", "followed")
]


@pytest.mark.parametrize(("took", "point"), CRASHES_ON_5XX)
async def test_a_crash_anywhere_on_a_5xx_call_sends_each_recipient_once(
    took: frozenset[str], point: str
) -> None:
    """SendGrid answers 504 having taken ``took`` (its query API says so); wherever the
    process dies, only the others go to Mailgun, once."""
    w = World()
    batch = await w.accept(A, B)
    _script(w, _gateway_timeout)
    w.providers["sg"].found = took
    await w.crash_once(point, attempt=0)

    rest = sorted({A, B} - took)
    assert _calls(w) == [("c.0", "sg", [A, B])] + ([("c.1", "mg", rest)] if rest else [])
    assert await _evidence(w, batch.batch_id) == {
        e: {"c.0" if e in took else "c.1"} for e in (A, B)
    }
    assert w.dead == []


# -- partial acceptance ----------------------------------------------------------------------


async def test_a_provider_that_took_part_of_a_retried_chunk_leaves_the_rest_to_the_chain() -> None:
    """Mailgun's timed-out attempt 1 reached Ann and Cat only: Bob goes on to attempt 2
    (SendGrid again, after the backoff), the others are never sent again."""
    w = World(max_attempts=4)
    batch = await w.accept(A, B, C)
    _script(w, _refused, _timeout)
    w.providers["mg"].found = frozenset({A, C})
    await w.settle()

    assert _calls(w) == [
        ("c.0", "sg", [A, B, C]),
        ("c.1", "mg", [A, B, C]),
        ("c.2", "sg", [B]),
    ]
    assert await _evidence(w, batch.batch_id) == {A: {"c.1"}, B: {"c.2"}, C: {"c.1"}}
    line = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (line[1].resolution, line[1].next_delay) == ("partial", 5)


async def test_when_the_rest_of_a_partly_taken_chunk_runs_out_of_attempts_only_it_fails() -> None:
    w = World(max_attempts=2)
    batch = await w.accept(A, B)
    _script(w, _timeout, _refused)
    w.providers["sg"].found = frozenset({A})
    await w.settle()

    assert _calls(w) == [("c.0", "sg", [A, B]), ("c.1", "mg", [B])]
    assert await w.states(batch) == {A: "queued", B: "failed"}
    reasons = await _reasons(w, batch.batch_id)
    assert reasons[A] is None
    assert reasons[B] == (
        "all 2 attempts failed across sg, mg; last: mg could not reach Mailgun: "
        "ConnectError('connection refused')"
    )
    assert (await w.rows(batch))[A]["event"] == "sent"
    assert await w.counts(batch) == {"queued": 2, "failed": 1}


# -- malformed and forged jobs ---------------------------------------------------------------


def _json(value: object) -> bytes:
    return orjson.dumps(value)


def _chunk(b: uuid.UUID, attempt: int = 0) -> bytes:
    return ChunkJob(batch_id=b, chunk=0, attempt=attempt).encode()


#: Deliveries no consumer can process, for an existing batch ``b``.
MALFORMED: dict[str, Callable[[uuid.UUID], tuple[str, bytes]]] = {
    "not-json": lambda b: (dispatch_key("sg", b, 0), b"not json"),
    "not-utf8": lambda b: (dispatch_key("sg", b, 0), b"\xff\xfe\x00"),
    "truncated": lambda b: (dispatch_key("sg", b, 0), _chunk(b)[:-3]),
    "json-array": lambda b: (dispatch_key("sg", b, 0), b"[]"),
    "json-null": lambda b: (dispatch_key("sg", b, 0), b"null"),
    "missing-chunk": lambda b: (dispatch_key("sg", b, 0), _json({"batch_id": str(b)})),
    "missing-batch-id": lambda b: (dispatch_key("sg", b, 0), _json({"chunk": 0})),
    "bad-uuid-in-body": lambda b: (
        dispatch_key("sg", b, 0),
        _json({"batch_id": "not-a-uuid", "chunk": 0}),
    ),
    "fractional-chunk": lambda b: (
        dispatch_key("sg", b, 0),
        _json({"batch_id": str(b), "chunk": 0.5}),
    ),
    "log-missing-log-id": lambda b: (
        log_key("sg", uuid.uuid1()),
        _json({"batch_id": str(b), "chunk": 0}),
    ),
    "unknown-provider": lambda b: (f"zz.{b}", _chunk(b)),
    "retry-zero": lambda b: (f"sg.{b}.retry.0", _chunk(b)),
    "retry-not-a-number": lambda b: (f"sg.{b}.retry.x", _chunk(b)),
    "retry-misspelt": lambda b: (f"sg.{b}.again.1", _chunk(b, 1)),
    "bad-uuid-in-key": lambda b: ("sg.not-a-uuid", _chunk(b)),
    "extra-segment": lambda b: (f"sg.{b}.retry.1.x", _chunk(b, 1)),
    "empty-key": lambda b: ("", _chunk(b)),
    "log-without-id": lambda b: ("log.sg", _chunk(b)),
    "batch-key-to-sender": lambda b: (f"log.batch.{b}", BatchJob(batch_id=b).encode()),
    "batch-not-json": lambda b: (batch_key(b), b"{"),
    "batch-missing-id": lambda b: (batch_key(b), b"{}"),
    "batch-extra-segment": lambda b: (f"batch.{b}.x", BatchJob(batch_id=b).encode()),
    "batch-bad-uuid": lambda b: ("batch.not-a-uuid", BatchJob(batch_id=b).encode()),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_a_malformed_job_is_dead_lettered_and_the_consumer_goes_on(case: str) -> None:
    w = World()
    batch = await w.accept(A)
    key, body = MALFORMED[case](batch.batch_id)
    poison = FakeMessage(key, body)

    assert await w.deliver(poison) == "reject"
    assert w.dead == [poison]
    assert _calls(w) == []
    assert await w.attempts.lines(batch.batch_id) == {}
    await w.settle()  # the batch's own jobs are untouched by it
    assert _calls(w) == [("c.0", "sg", [A])]
    assert await _evidence(w, batch.batch_id) == {A: {"c.0"}}


@pytest.mark.parametrize("chunk", [-1, 1, 99])
async def test_a_job_for_a_chunk_the_batch_does_not_have_is_dead_lettered(chunk: int) -> None:
    w = World()
    batch = await w.accept(A)
    body = ChunkJob(batch_id=batch.batch_id, chunk=chunk).encode()
    poison = FakeMessage(dispatch_key("sg", batch.batch_id, 0), body)

    assert await w.deliver(poison) == "reject"
    assert await w.attempts.lines(batch.batch_id) == {}


@pytest.mark.parametrize(
    "forged",
    [
        lambda b: (dispatch_key("mg", b, 1), ChunkJob(batch_id=b, chunk=0, attempt=1).encode()),
        lambda b: (dispatch_key("sg", b, 3), ChunkJob(batch_id=b, chunk=0, attempt=3).encode()),
        lambda b: (dispatch_key("sg", b, 0), ChunkJob(batch_id=b, chunk=0, check=4).encode()),
        lambda b: (
            log_key("mg", log_id_for(b, A)),
            LogJob(batch_id=b, chunk=0, log_id=log_id_for(b, A)).encode(),
        ),
    ],
    ids=["retry-without-decision", "skipped-attempts", "check-of-nothing", "unplanned-resend"],
)
async def test_a_job_that_no_decision_leads_to_is_acked_without_a_send(
    forged: Callable[[uuid.UUID], tuple[str, bytes]],
) -> None:
    """A well-formed job nobody planned (a replay, a forgery) sends nothing and records no
    attempt: the line starts only where the protocol says."""
    w = World()
    batch = await w.accept(A)
    await w.step()  # split: attempt 0 is queued, not yet claimed
    key, body = forged(batch.batch_id)

    assert await w.deliver(FakeMessage(key, body)) == "ack"
    assert _calls(w) == []
    assert await w.attempts.lines(batch.batch_id) == {}
    await w.settle()
    assert _calls(w) == [("c.0", "sg", [A])]


async def test_replaying_every_job_of_a_finished_batch_sends_nothing_more() -> None:
    """Everything the broker ever carried for a batch that failed over, delivered again."""
    w = World()
    batch = await w.accept(A, B)
    _script(w, _refused)
    await w.settle()
    before = _calls(w)
    carried = [m for m in w.broker.take() if not m.routing_key.startswith("hook.")]
    assert len(carried) >= 3  # the batch job, and a job per attempt

    for message in carried:
        replay = FakeMessage(message.routing_key, message.body)
        assert await w.deliver(replay) == "ack"
    await w.settle()

    assert _calls(w) == before
    assert await _evidence(w, batch.batch_id) == {A: {"c.1"}, B: {"c.1"}}
    assert w.dead == []
