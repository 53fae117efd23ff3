"""Outbound webhooks: after the provider's delay, build, batch, sign and post events; retry.

Accepting mail only appends a small job to a queue; a scheduler task releases each job once
its delay has passed and only then builds its events. SendGrid events are collected into
batches (``Tuning.sendgrid_batch_size`` events or ``Tuning.sendgrid_batch_wait`` seconds);
Mailgun events are posted one per request, each recipient's events in order; SES events
likewise, each a signed SNS notification (each message's in order). A failed POST
(connection error, timeout, 408, 429, 5xx) is retried after ``Tuning.retry_delays`` and then
dropped; any other 4xx is final (Mailgun's 406 means exactly that). Everything is counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

import httpx
import orjson
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from sandbox import signing
from sandbox.events import mailgun_events, sendgrid_events
from sandbox.mailgun import MailgunMessage
from sandbox.ses_feed import SesMessage, event_records, notification, subscription_confirmation
from sandbox.tuning import Tuning

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SendGridJob:
    """An accepted Mail Send request awaiting its events."""

    message_id: str
    payload: Mapping[str, Any]
    accepted_at: int
    recipients: int


@dataclass(frozen=True, slots=True)
class MailgunJob:
    """An accepted Mailgun message awaiting its events."""

    message_id: str
    message: MailgunMessage

    @property
    def recipients(self) -> int:
        return len(self.message.recipients)


@dataclass(frozen=True, slots=True)
class SesJob:
    """An accepted SES message awaiting its events (each a signed SNS notification)."""

    message: SesMessage

    @property
    def recipients(self) -> int:
        return len(self.message.recipients)


Job = SendGridJob | MailgunJob | SesJob


@dataclass(slots=True)
class DeliveryCounters:
    """Webhook deliveries of one provider since the sandbox started."""

    posted: int = 0
    """POSTs answered with 2xx."""
    events: int = 0
    """Events carried by those POSTs."""
    retried: int = 0
    """Failed POSTs that were tried again later."""
    failed: int = 0
    """POSTs given up on (retries exhausted, or a final 4xx)."""
    failed_events: int = 0
    dropped_events: int = 0
    """Events never posted because too many were already pending."""
    dropped_requests: int = 0
    """Accepted requests whose events were never built because too many were scheduled."""
    last_error: str | None = None


class _Verdict(Enum):
    OK = "ok"
    RETRY = "retry"
    FAIL = "fail"


@dataclass(slots=True)
class _Batch:
    """SendGrid: one POST of many events."""

    events: list[dict[str, Any]]
    attempt: int = 0


@dataclass(slots=True)
class _Sequence:
    """Mailgun: one recipient's events, posted one by one in order."""

    events: list[dict[str, Any]]
    index: int = 0
    attempt: int = 0


class WebhookDispatcher:
    """Posts the signed events of accepted mail to the webhook service."""

    def __init__(
        self,
        *,
        base_url: str,
        sendgrid_key: ec.EllipticCurvePrivateKey,
        mailgun_signing_key: str,
        delay: float,
        tuning: Tuning,
        ses_key: rsa.RSAPrivateKey | None = None,
        ses_topic_arn: str = "arn:aws:sns:us-east-1:000000000000:safedelivr-ses-events",
    ) -> None:
        base = base_url.rstrip("/")
        self._sendgrid_url = f"{base}/webhooks/sendgrid"
        self._mailgun_url = f"{base}/webhooks/mailgun"
        self._ses_url = f"{base}/webhooks/ses"
        self.ses_key = ses_key or signing.generate_sns_key()
        self.ses_topic_arn = ses_topic_arn
        self.ses_confirmations = 0
        """Subscriptions confirmed at the sandbox's SubscribeURL (its root)."""
        self._sendgrid_key = sendgrid_key
        self._mailgun_key = mailgun_signing_key
        self._delay = delay
        self._tuning = tuning
        self._jobs: deque[tuple[float, Job]] = deque()
        self._wake = asyncio.Event()
        self._buffer: list[dict[str, Any]] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._batches: asyncio.Queue[_Batch] = asyncio.Queue()
        self._sequences: asyncio.Queue[_Sequence] = asyncio.Queue()
        self._notifications: asyncio.Queue[_Sequence] = asyncio.Queue()
        self._scheduled_recipients = 0
        # POSTs (SendGrid batches, Mailgun sequences) queued, in flight or awaiting a retry,
        # and the events they carry.
        self._pending = {"sendgrid": 0, "mailgun": 0, "ses": 0}
        self._pending_events = {"sendgrid": 0, "mailgun": 0, "ses": 0}
        self._timers: set[asyncio.TimerHandle] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._http: httpx.AsyncClient | None = None
        self.counters = {
            "sendgrid": DeliveryCounters(),
            "mailgun": DeliveryCounters(),
            "ses": DeliveryCounters(),
        }

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, http: httpx.AsyncClient) -> None:
        """Start the scheduler and the posting workers, posting through ``http``."""
        self._http = http
        coroutines = [
            self._release_loop(),
            *(self._sendgrid_worker() for _ in range(self._tuning.sendgrid_workers)),
            *(self._mailgun_worker() for _ in range(self._tuning.mailgun_workers)),
            *(self._ses_worker() for _ in range(self._tuning.ses_workers)),
        ]
        for coroutine in coroutines:
            task = asyncio.create_task(coroutine)
            task.add_done_callback(_report_crash)
            self._tasks.append(task)

    async def stop(self) -> None:
        """Stop every task and timer; events not yet posted are abandoned."""
        for task in self._tasks:
            task.cancel()
        for handle in (*self._timers, self._flush_handle):
            if handle is not None:
                handle.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._timers.clear()
        self._flush_handle = None
        self._http = None

    # -- intake -------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Schedule ``job``'s events for after the webhook delay; never blocks."""
        scheduled = self._scheduled_recipients + job.recipients
        if self._jobs and scheduled > self._tuning.max_scheduled_recipients:
            self.counters[_provider(job)].dropped_requests += 1
            return
        self._scheduled_recipients = scheduled
        self._jobs.append((time.monotonic() + self._delay, job))
        self._wake.set()

    @property
    def idle(self) -> bool:
        """Whether nothing is scheduled, buffered, queued, in flight or awaiting a retry."""
        return not self._jobs and not self._buffer and not any(self._pending.values())

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until :attr:`idle`; return False if ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        while not self.idle:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    def snapshot(self) -> dict[str, Any]:
        """The ``GET /_control/webhooks`` document."""
        return {
            **{
                provider: {
                    **asdict(counters),
                    "pending_posts": self._pending[provider],
                    "pending_events": self._pending_events[provider],
                }
                for provider, counters in self.counters.items()
            },
            "scheduled": len(self._jobs),
            "buffered_events": len(self._buffer),
            "idle": self.idle,
        }

    # -- scheduling and batching --------------------------------------------------------------

    async def _release_loop(self) -> None:
        while True:
            if not self._jobs:
                self._wake.clear()
                await self._wake.wait()
                continue
            due, job = self._jobs[0]
            wait = due - time.monotonic()
            if wait > 0:
                # Every job waits the same delay, so later jobs are never due earlier.
                await asyncio.sleep(wait)
                continue
            self._jobs.popleft()
            self._scheduled_recipients -= job.recipients
            self._release(job)
            await asyncio.sleep(0)

    def _release(self, job: Job) -> None:
        if isinstance(job, SesJob):
            now_ses = time.time()
            topic = self.ses_topic_arn
            sns = [notification(r, topic, now_ses) for r in event_records(job.message, now_ses)]
            self._enqueue("ses", self._notifications, _Sequence(sns), len(sns))
            return
        if isinstance(job, SendGridJob):
            now = int(time.time())
            self._collect(sendgrid_events(job.payload, job.message_id, job.accepted_at, now))
            return
        now_float = time.time()
        for recipient in job.message.recipients:
            events = mailgun_events(job.message, job.message_id, recipient, now_float)
            self._enqueue("mailgun", self._sequences, _Sequence(events), len(events))

    def _collect(self, events: list[dict[str, Any]]) -> None:
        self._buffer.extend(events)
        size = self._tuning.sendgrid_batch_size
        full = len(self._buffer) - len(self._buffer) % size
        for start in range(0, full, size):
            batch = self._buffer[start : start + size]
            self._enqueue("sendgrid", self._batches, _Batch(batch), len(batch))
        del self._buffer[:full]
        if self._buffer and self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_later(self._tuning.sendgrid_batch_wait, self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        if self._buffer:
            batch, self._buffer = self._buffer, []
            self._enqueue("sendgrid", self._batches, _Batch(batch), len(batch))

    def _enqueue(
        self, provider: str, queue: asyncio.Queue[Any], item: _Batch | _Sequence, events: int
    ) -> None:
        if self._pending_events[provider] + events > self._tuning.max_pending_events:
            self.counters[provider].dropped_events += events
            return
        self._pending[provider] += 1
        self._pending_events[provider] += events
        queue.put_nowait(item)

    def _done(self, provider: str, events: int) -> None:
        self._pending[provider] -= 1
        self._pending_events[provider] -= events

    # -- posting ------------------------------------------------------------------------------

    async def _sendgrid_worker(self) -> None:
        while True:
            batch = await self._batches.get()
            body = orjson.dumps(batch.events)
            timestamp = str(int(time.time()))
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "SendGrid Event API",
                signing.SENDGRID_SIGNATURE_HEADER: signing.sign_sendgrid(
                    self._sendgrid_key, timestamp, body
                ),
                signing.SENDGRID_TIMESTAMP_HEADER: timestamp,
            }
            verdict, error = await self._post(self._sendgrid_url, body, headers)
            if self._settle("sendgrid", self._batches, batch, verdict, error, len(batch.events)):
                self._done("sendgrid", len(batch.events))

    async def _mailgun_worker(self) -> None:
        headers = {"Content-Type": "application/json", "User-Agent": "mailgun/treq-16.12.0"}
        while True:
            sequence = await self._sequences.get()
            while sequence.index < len(sequence.events):
                signature = signing.mailgun_signature(self._mailgun_key, int(time.time()))
                body = orjson.dumps(
                    {"signature": signature, "event-data": sequence.events[sequence.index]}
                )
                verdict, error = await self._post(self._mailgun_url, body, headers)
                if not self._settle("mailgun", self._sequences, sequence, verdict, error, 1):
                    break  # a retry is scheduled; the sequence continues from there
                sequence.index += 1
                sequence.attempt = 0
            if sequence.index >= len(sequence.events):
                self._done("mailgun", len(sequence.events))

    async def _ses_worker(self) -> None:
        while True:
            sequence = await self._notifications.get()
            while sequence.index < len(sequence.events):
                verdict, error = await self._post_sns(sequence.events[sequence.index])
                if not self._settle("ses", self._notifications, sequence, verdict, error, 1):
                    break  # a retry is scheduled; the sequence continues from there
                sequence.index += 1
                sequence.attempt = 0
            if sequence.index >= len(sequence.events):
                self._done("ses", len(sequence.events))

    async def _post_sns(self, message: dict[str, Any]) -> tuple[_Verdict, str | None]:
        """Sign and post one SNS message, as SNS's HTTPS subscription does."""
        signed = {**message, "Signature": signing.sign_sns(self.ses_key, message)}
        headers = {
            "Content-Type": "text/plain; charset=UTF-8",
            "User-Agent": "Amazon Simple Notification Service Agent",
            "x-amz-sns-message-type": message["Type"],
            "x-amz-sns-message-id": message["MessageId"],
            "x-amz-sns-topic-arn": message["TopicArn"],
        }
        return await self._post(self._ses_url, orjson.dumps(signed), headers)

    async def confirm_subscription(self, subscribe_base: str) -> tuple[bool, str | None]:
        """Post a ``SubscriptionConfirmation`` whose ``SubscribeURL`` is ``subscribe_base``
        (the sandbox's root); whether it was answered 2xx, and the error if not."""
        message = subscription_confirmation(self.ses_topic_arn, subscribe_base, time.time())
        verdict, error = await self._post_sns(message)
        return verdict is _Verdict.OK, error

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str]
    ) -> tuple[_Verdict, str | None]:
        if self._http is None:
            return _Verdict.RETRY, "the sandbox is stopping"
        try:
            response = await self._http.post(
                url, content=body, headers=headers, timeout=self._tuning.post_timeout
            )
        except httpx.HTTPError as exc:
            return _Verdict.RETRY, f"{type(exc).__name__}: {exc}"
        status = response.status_code
        if 200 <= status < 300:
            return _Verdict.OK, None
        if status >= 500 or status in (408, 429):
            return _Verdict.RETRY, f"HTTP {status}"
        return _Verdict.FAIL, f"HTTP {status}"

    def _settle(
        self,
        provider: str,
        queue: asyncio.Queue[Any],
        item: _Batch | _Sequence,
        verdict: _Verdict,
        error: str | None,
        events: int,
    ) -> bool:
        """Count one POST's result; return False when it will be retried later."""
        counters = self.counters[provider]
        if verdict is _Verdict.OK:
            counters.posted += 1
            counters.events += events
            return True
        counters.last_error = error
        delays = self._tuning.retry_delays
        if verdict is _Verdict.RETRY and item.attempt < len(delays):
            counters.retried += 1
            self._later(delays[item.attempt], queue, item)
            item.attempt += 1
            return False
        counters.failed += 1
        counters.failed_events += events
        return True

    def _later(self, delay: float, queue: asyncio.Queue[Any], item: _Batch | _Sequence) -> None:
        def _requeue() -> None:
            self._timers.discard(handle)
            queue.put_nowait(item)

        handle = asyncio.get_running_loop().call_later(delay, _requeue)
        self._timers.add(handle)


def _provider(job: Job) -> str:
    if isinstance(job, SesJob):
        return "ses"
    return "sendgrid" if isinstance(job, SendGridJob) else "mailgun"


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        _log.error("sandbox webhook task crashed", exc_info=task.exception())
