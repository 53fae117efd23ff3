"""The provider sender: turns one ``<ns>.<batch_uuid>[.retry.<n>]`` job into one provider call.

Per delivery: read the chunk's attempts; if any provider already accepted it, stop. Claim this
attempt (LWT) before calling the provider, so a redelivery after a crash finds ``sending`` and
waits for evidence instead of resending. After the call, record the outcome and either mark
the recipients ``sent`` or hand the chunk to the next provider through ``shared.topology``
routing keys, as ``failover.decide`` says. The delivery is acked by ``settle`` only after all
of that is durable.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import aio_pika.abc
import orjson

from services.consumers import failover
from services.consumers.settle import Poison
from shared.attempts import GIVE_UP_RANK, Attempt, AttemptStore
from shared.batchstore import BatchStore
from shared.broker import Broker
from shared.config import ProviderSettings
from shared.errors import (
    PermanentProviderError,
    ProviderError,
    ProviderMisconfigured,
    TransientProviderError,
)
from shared.metrics import DispatchMetrics
from shared.models import Chunk, ChunkJob, Recipient
from shared.providers.base import Provider
from shared.stats import StatsStore
from shared.topology import dispatch_key, parse_routing_key

log = logging.getLogger(__name__)

_ERROR_KINDS: dict[str, type[ProviderError]] = {
    "transient": TransientProviderError,
    "misconfigured": ProviderMisconfigured,
    "permanent": PermanentProviderError,
}
#: Seconds between checks of an attempt whose outcome is unknown.
RECHECK_DELAY = 30


def error_kind(error: ProviderError) -> str:
    return next((k for k, cls in _ERROR_KINDS.items() if isinstance(error, cls)), "transient")


def encode_error(error: ProviderError) -> str:
    return f"{error_kind(error)}|{error.message}"


def decode_error(provider: str, text: str | None, status: int | None = None) -> ProviderError:
    kind, _, message = (text or "transient|unknown error").partition("|")
    return _ERROR_KINDS.get(kind, TransientProviderError)(provider, message, status=status)


@dataclass
class Dispatcher:
    broker: Broker
    batches: BatchStore
    attempts: AttemptStore
    providers: Mapping[str, Provider]
    settings: ProviderSettings
    metrics: DispatchMetrics | None = None

    async def process(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        key = parse_routing_key(message.routing_key or "")
        if key.kind != "dispatch" or key.provider is None:
            raise Poison(f"not a dispatch key: {message.routing_key}")
        job = ChunkJob.decode(message.body)
        if job.batch_id != key.id or job.attempt != key.attempt:
            raise Poison("routing key and body disagree")
        await self.dispatch(job, key.provider)

    async def dispatch(self, job: ChunkJob, provider_code: str) -> None:
        history = await self.attempts.attempts(job.batch_id, job.chunk)
        if any(a.state == "sent" for a in history):
            return  # a provider already accepted this chunk; a duplicate job ends here
        mine = next((a for a in history if a.attempt == job.attempt), None)
        if mine is None:
            if await self.attempts.claim(job.batch_id, job.chunk, job.attempt, provider_code):
                await self._send(job, provider_code, history)
                return
            history = await self.attempts.attempts(job.batch_id, job.chunk)
            mine = next(a for a in history if a.attempt == job.attempt)
        await self._resume(job, mine, history)

    async def _send(self, job: ChunkJob, code: str, history: list[Attempt]) -> None:
        header = await self.batches.header(job.batch_id)
        if header is None:
            raise Poison(f"batch {job.batch_id} does not exist")
        rows = await self.batches.chunk_rows(job.batch_id, job.chunk)
        pending = [r for r in rows if r["state"] == "queued"]
        if not pending:
            await self.attempts.finish(
                job.batch_id,
                job.chunk,
                job.attempt,
                state="sent",
                status_code=None,
                error="nothing left to send",
            )
            return
        chunk = Chunk(
            batch_id=job.batch_id,
            index=job.chunk,
            message=header.message,
            recipients=tuple(
                Recipient(
                    log_id=r["log_id"],
                    email=r["email"],
                    name=r["name"],
                    substitutions=orjson.loads(r["substitutions"]) if r["substitutions"] else {},
                )
                for r in pending
            ),
        )
        log_ids = [r["log_id"] for r in pending]
        started = datetime.now(UTC)
        provider = self.providers.get(code)
        try:
            if provider is None:
                raise ProviderMisconfigured(code, "provider is not configured in the chain")
            receipt = await provider.send(chunk)
        except ProviderError as error:
            if error.outcome_unknown:
                # The provider may have accepted it: leave the attempt ``sending`` and wait
                # for evidence (a webhook) instead of handing it to the next provider.
                log.warning("chunk %s/%d via %s: %s", job.batch_id, job.chunk, code, error)
                if self.metrics:
                    self.metrics.ambiguous.labels(code).inc()
                await self._recheck(job, code)
                return
            await self._failed(job, code, error, log_ids, started, history)
            return
        await self.attempts.finish(
            job.batch_id,
            job.chunk,
            job.attempt,
            state="sent",
            status_code=receipt.status,
            message_id=receipt.message_id,
        )
        await self.attempts.update_recipients(
            job.batch_id,
            job.chunk,
            log_ids,
            provider=code,
            provider_result="sent",
            at=started,
            event="sent",
            message_id=receipt.message_id,
        )
        if self.metrics:
            self.metrics.chunks_sent.labels(code).inc()
            self.metrics.recipients_sent.labels(code).inc(len(log_ids))

    async def _failed(
        self,
        job: ChunkJob,
        code: str,
        error: ProviderError,
        log_ids: list[uuid.UUID],
        at: datetime,
        history: list[Attempt],
    ) -> None:
        log.info(
            "chunk %s/%d attempt %d via %s failed: %s",
            job.batch_id,
            job.chunk,
            job.attempt,
            code,
            error,
        )
        if self.metrics:
            self.metrics.attempts_failed.labels(code, error_kind(error)).inc()
        await self.attempts.finish(
            job.batch_id,
            job.chunk,
            job.attempt,
            state="failed",
            status_code=error.status,
            error=encode_error(error),
        )
        await self.attempts.update_recipients(
            job.batch_id,
            job.chunk,
            log_ids,
            provider=code,
            provider_result=f"failed: {error.message}"[:300],
            at=at,
        )
        await self._follow_up(job, error, log_ids, history)

    async def _follow_up(
        self,
        job: ChunkJob,
        error: ProviderError,
        log_ids: list[uuid.UUID] | None,
        history: list[Attempt],
    ) -> None:
        refused = frozenset(
            a.provider
            for a in history
            if a.state == "failed" and (a.error or "").startswith("permanent|")
        )
        decision = failover.decide(
            chain=self.settings.chain_codes,
            attempt=job.attempt,
            error=error,
            max_attempts=self.settings.max_attempts,
            backoff=self.settings.backoff_tiers,
            permanent_from=refused,
        )
        if isinstance(decision, failover.Retry):
            nxt = ChunkJob(
                batch_id=job.batch_id,
                chunk=job.chunk,
                attempt=decision.attempt,
                errors=(*job.errors, f"{error.provider}: {error.message}"[:300]),
            )
            delay = self.broker.topology.delay_tier_for(decision.delay) if decision.delay else None
            await self.broker.publish(
                dispatch_key(decision.provider, job.batch_id, decision.attempt),
                nxt.encode(),
                delay=delay,
                message_id=f"{job.batch_id}:{job.chunk}:{decision.attempt}",
            )
            return
        await self._give_up(job, decision.reason, log_ids)

    async def _give_up(self, job: ChunkJob, reason: str, log_ids: list[uuid.UUID] | None) -> None:
        if log_ids is None:
            rows = await self.batches.chunk_rows(job.batch_id, job.chunk)
            log_ids = [r["log_id"] for r in rows if r["state"] == "queued"]
        await self.attempts.update_recipients(
            job.batch_id,
            job.chunk,
            log_ids,
            provider="safedelivr",
            provider_result="gave up",
            at=datetime.now(UTC),
            event="failed",
            state="failed",
            reason=reason[:1000],
            rank=GIVE_UP_RANK,
        )
        # Failed by us, not by a webhook: the stats mark is ours to write.
        header = await self.batches.header(job.batch_id)
        if header is not None:
            await StatsStore(self.batches.db).mark(
                header.user_id, datetime.now(UTC), "failed", [str(i) for i in log_ids]
            )
        if self.metrics:
            self.metrics.recipients_failed.inc(len(log_ids))

    async def _recheck(self, job: ChunkJob, provider: str) -> None:
        wait = min(RECHECK_DELAY, self.settings.ambiguous_timeout)
        await self.broker.publish(
            dispatch_key(provider, job.batch_id, job.attempt),
            job.encode(),
            delay=self.broker.topology.delay_tier_for(wait),
            message_id=f"{job.batch_id}:{job.chunk}:{job.attempt}:recheck",
        )

    async def _resume(self, job: ChunkJob, mine: Attempt, history: list[Attempt]) -> None:
        """A redelivery or duplicate found this attempt already recorded."""
        if mine.state == "failed":
            # We crashed after recording the failure; repeat the (idempotent) follow-up.
            await self._follow_up(job, decode_error(mine.provider, mine.error), None, history)
            return
        # ``sending``: the provider may or may not have accepted the chunk. Wait for a
        # webhook to settle it rather than risking a double send.
        age = datetime.now(UTC) - mine.started_at
        if age < timedelta(seconds=self.settings.ambiguous_timeout):
            await self._recheck(job, mine.provider)
            return
        await self.attempts.finish(
            job.batch_id,
            job.chunk,
            job.attempt,
            state="failed",
            status_code=None,
            error="transient|outcome unknown: the sender stopped during the provider call",
        )
        if self.settings.resend_ambiguous:
            error = TransientProviderError(mine.provider, "outcome unknown; resending")
            await self._follow_up(job, error, None, history)
            return
        await self._give_up(
            job,
            f"{mine.provider} may or may not have accepted this message (the sender stopped "
            "during the call and no provider event arrived); not resent to avoid a duplicate",
            None,
        )
