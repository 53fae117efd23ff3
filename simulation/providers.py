"""The simulated providers: SendGrid and Mailgun as the senders see them (their answers, in
the exact errors the real adapters raise), with a ledger of every acceptance, a query API
that sees acceptances once they are indexed, and signed-format webhooks posted back to us,
retried as each provider retries.

A provider call is a step (``send``): it may be refused cleanly, fail with a 5xx having
accepted nothing, or accept the mail and then answer 504, reset the connection or never
answer (a read timeout), or be the caller's last act. Whatever the caller hears, the ledger
holds the truth: what the provider accepted, for which request of which client.

Webhook events are built by the sandbox's own builders (``sandbox.events``) from the
request the real adapter builds (``build_payload`` / ``build_form``), so they are in the
providers' real wire formats, carry our correlation data exactly as the real ones do, and
depend on each recipient's address as the sandbox's do (``bounce…@``, ``sgdrop…@`` ...).
Each event is posted to the webhook process (a ``webhook`` step there); a post that fails or
gets no 2xx is retried with backoff for as long as the provider retries (SendGrid 24 h,
Mailgun 8 h).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson

from sandbox.events import mailgun_events, outcome_at, sendgrid_events
from sandbox.mailgun import parse_message
from shared.core.catalog import name_of
from shared.core.errors import ProviderError
from shared.core.models import Chunk
from shared.providers.base import Gate as RateGate
from shared.providers.base import LookupQuery, Receipt, RecipientAnswer
from shared.providers.mailgun import build_form
from shared.providers.responses import classify
from shared.providers.sendgrid import build_payload
from shared.providers.transport import translate
from simulation.faults import FAULTS
from simulation.processes import Gate, outside

#: Seconds after acceptance at which each step of a recipient's events is posted
#: (``processed``/``accepted``, then ``delivered``/``bounce``..., then engagement).
EVENT_DELAYS = (1.0, 4.0, 8.0)
#: Seconds between a provider's retries of a webhook post that failed.
RETRY_DELAYS = (30.0, 120.0, 600.0, 1800.0, 3600.0, 7200.0)
#: How long each provider retries a webhook post (an SMTP relay posts none).
RETRY_HORIZON = {"sg": 24 * 3600.0, "mg": 8 * 3600.0, "smtp": 0.0}
#: Seconds after acceptance before the query API shows a message.
INDEXING_DELAY = 20.0
#: How late a "late" webhook arrives.
LATE = 2 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Acceptance:
    """One recipient a provider accepted: the truth the invariants judge by."""

    provider: str
    batch_id: uuid.UUID
    chunk: int
    tag: str
    email: str
    at: float
    metadata: tuple[tuple[str, str], ...]
    fate: str
    """What the provider then does with it (``sandbox.events.Outcome`` as this provider
    plays it): ``drop``/``sgdrop`` means it never sent it; ``defer``/``sgdefer`` that it
    may still send it later."""

    @property
    def sent(self) -> bool:
        """Whether the provider sends it (or may yet): not a provider's own drop."""
        return self.fate not in ("drop", "sgdrop", "sgmgdrop")

    @property
    def deferred(self) -> bool:
        return self.fate in ("defer", "sgdefer")


#: Delivers one webhook body to us: the status we answered (0: no answer) and the fault the
#: delivery met on the way (``simulation.faults``: fail, duplicate, late, or None).
Post = Callable[[str, bytes], Awaitable[tuple[int, str | None]]]


@dataclass
class Ledger:
    accepted: list[Acceptance] = field(default_factory=list)
    webhooks_lost: list[str] = field(default_factory=list)
    """Webhook posts a provider gave up on (it retried past its horizon)."""


@dataclass
class SimProvider:
    code: str
    gate: Gate
    ledger: Ledger
    post: Post
    query_api: bool = True
    timeout: float = 10.0
    event_delays: tuple[float, ...] = EVENT_DELAYS
    max_recipients: int = 1000
    script: list[str | None] = field(default_factory=list)
    """How its first calls go whatever the schedule (``simulation.faults`` ``send`` kinds;
    None: normally): a scenario's own provider behaviour."""
    duplicate_posts: bool = False
    """Whether every webhook post is delivered twice (SendGrid sends duplicates)."""
    relay: bool = False
    """Whether it answers recipient by recipient (:func:`relay_answer`), as an SMTP relay
    does, and reports nothing afterwards: what it accepts is all we learn."""
    sent: int = 0
    pending_posts: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        self.name = name_of(self.code)

    async def send(self, chunk: Chunk, gate: RateGate | None = None) -> Receipt:
        if gate is not None:
            await gate()
        fault = self.gate.enter(f"provider:{self.code}.send", "send")
        scripted = self.script.pop(0) if self.script else None
        fault = fault or scripted
        await self.gate.pause()
        now = datetime.now(UTC).timestamp()
        if fault == "refused":
            raise _answer(self.code, 429, now)
        if fault == "reject_5xx":
            raise _answer(self.code, 500, now)
        if fault == "lost_silent":
            await asyncio.sleep(self.timeout)
            raise translate(self.code, self.name, httpx.ReadTimeout("timed out"), self.timeout)
        self.sent += 1
        if self.relay and fault not in FAULTS["send"]:
            receipt = self._relay(chunk)
            self.gate.die_if(fault)  # the caller's last act, if so
            return receipt
        # A relay that took the message and then lost the connection reports nothing after.
        message_id = self._accept(chunk, events=not self.relay)
        if fault == "accept_silent":
            await asyncio.sleep(self.timeout)
            raise translate(self.code, self.name, httpx.ReadTimeout("timed out"), self.timeout)
        if fault == "accept_5xx":
            raise _answer(self.code, 504, now)
        if fault == "accept_reset":
            error = httpx.RemoteProtocolError("peer closed connection without response")
            raise translate(self.code, self.name, error, self.timeout)
        self.gate.die_if(fault)
        return Receipt(self.code, 202 if self.code == "sg" else 200, message_id)

    def _relay(self, chunk: Chunk) -> Receipt:
        """A relay's answer: one per recipient; those it took (or may have: its answer was
        lost) go to the ledger, and no event follows."""
        answers = tuple(relay_answer(r.email) for r in chunk.recipients)
        taken = {a.email for a in answers if a.outcome in ("accepted", "unknown")}
        message_id = self._accept(chunk, only=taken, events=False)
        return Receipt(self.code, 250, message_id, recipients=answers, final=True)

    def _accept(self, chunk: Chunk, *, only: set[str] | None = None, events: bool = True) -> str:
        loop = asyncio.get_running_loop()
        at = loop.time()
        metadata = tuple(sorted(chunk.message.metadata.items()))
        for r in chunk.recipients:
            if only is not None and r.email not in only:
                continue
            self.ledger.accepted.append(
                Acceptance(
                    self.code,
                    chunk.batch_id,
                    chunk.index,
                    chunk.attempt or "",
                    r.email.lower(),
                    at,
                    metadata,
                    fate_of(self.code, r.email),
                )
            )
        message_id = f"{self.code}-{uuid.uuid4().hex[:16]}"
        if not events:
            return message_id
        for delay, body in self._events(chunk, message_id):
            self._schedule(delay, body, 0.0)
            if self.duplicate_posts:
                self._schedule(delay + 0.5, body, 0.0)
        return message_id

    def _events(self, chunk: Chunk, message_id: str) -> list[tuple[float, bytes]]:
        """Each post of the chunk's events: when (seconds after now), and its body."""
        now = datetime.now(UTC).timestamp()
        posts: list[tuple[float, bytes]] = []
        if self.code == "sg":
            events = sendgrid_events(build_payload(chunk), message_id, int(now), int(now))
            by_step: dict[int, list[dict[str, Any]]] = {}
            seen: dict[str, int] = {}
            for ev in events:
                k = seen.get(ev["email"], 0)
                seen[ev["email"]] = k + 1
                ev["timestamp"] = int(now + self._delay(k))
                by_step.setdefault(k, []).append(ev)
            for k, group in sorted(by_step.items()):
                posts.append((self._delay(k), orjson.dumps(group)))
            return posts
        message = parse_message(build_form(chunk))
        assert not isinstance(message, str), message  # noqa: S101 - the adapter's own form
        for recipient in message.recipients:
            for k, data in enumerate(mailgun_events(message, f"<{message_id}>", recipient, now)):
                data["timestamp"] = now + self._delay(k) + k / 1000
                token = uuid.uuid4().hex
                envelope = {
                    "signature": {
                        "timestamp": str(int(now)),
                        "token": token,
                        "signature": "0" * 64,
                    },
                    "event-data": data,
                }
                posts.append((self._delay(k), orjson.dumps(envelope)))
        return posts

    def _delay(self, step: int) -> float:
        return self.event_delays[min(step, len(self.event_delays) - 1)]

    def _schedule(self, delay: float, body: bytes, since: float, tries: int = 0) -> None:
        self.pending_posts += 1
        loop = asyncio.get_running_loop()
        loop.call_later(
            delay,
            lambda: loop.create_task(self._deliver(body, since, tries), context=outside()),
            context=outside(),
        )

    async def _deliver(self, body: bytes, first: float, tries: int) -> None:
        loop = asyncio.get_running_loop()
        first = first or loop.time()
        status, fault = await self.post(self.code, body)
        self.pending_posts -= 1
        if fault == "duplicate":
            self._schedule(30.0, body, loop.time())
        elif fault == "late":
            self._schedule(LATE, body, 0.0)  # it retries for its full horizon from then on
            return
        if 200 <= status < 300 or status == 406:
            return
        if loop.time() - first >= RETRY_HORIZON[self.code]:
            self.ledger.webhooks_lost.append(f"{self.code}: a post answered {status} for too long")
            return
        self._schedule(RETRY_DELAYS[min(tries, len(RETRY_DELAYS) - 1)], body, first, tries + 1)

    async def lookup(self, query: LookupQuery) -> frozenset[str] | None:
        fault = self.gate.enter(f"provider:{self.code}.lookup", "lookup")
        await self.gate.pause()
        if fault == "fail":
            raise _answer(self.code, 503, datetime.now(UTC).timestamp())
        self.gate.die_if(fault)
        if not self.query_api:
            return None
        indexed = asyncio.get_running_loop().time() - INDEXING_DELAY
        return frozenset(
            a.email
            for a in self.ledger.accepted
            if a.provider == self.code
            and a.batch_id == query.batch_id
            and a.chunk == query.chunk
            and a.tag == query.tag
            and a.at <= indexed
            and a.email in query.emails
        )

    async def lookup_available(self) -> bool:
        return self.query_api

    async def aclose(self) -> None:
        return None


def relay_answer(email: str) -> RecipientAnswer:
    """A relay's answer to one RCPT, from the address: ``rcpt4xx…@`` refused for now (451),
    ``rcpt5xx…@`` refused for good (550 5.1.1, to be suppressed), ``rcptlost…@`` taken but
    its answer lost (unknown), anyone else taken (250)."""
    if email.startswith("rcpt4xx"):
        return RecipientAnswer(email, "refused_transient", 451, "4.7.1 try again later")
    if email.startswith("rcpt5xx"):
        return RecipientAnswer(
            email, "refused_permanent", 550, "5.1.1 no such mailbox", suppress=True
        )
    if email.startswith("rcptlost"):
        return RecipientAnswer(email, "unknown", None, "connection lost")
    return RecipientAnswer(email, "accepted", 250, "2.1.5 ok")


def fate_of(code: str, email: str) -> str:
    """What provider ``code`` does with mail to ``email`` (as the sandbox plays it)."""
    return outcome_at(code, email).value


def _answer(code: str, status: int, now: float) -> ProviderError:
    """The error the real adapters raise for an HTTP answer ``status``."""
    body = orjson.dumps({"errors": [{"message": f"simulated {status}"}]})
    error = classify(code, status, body, {}, now=now)
    assert error is not None  # noqa: S101 - never a 2xx here
    return error
