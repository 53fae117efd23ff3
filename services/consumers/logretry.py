"""The ``log.<ns>.#`` consumers: re-send ONE recipient through provider ``ns``.

Jobs come from the webhook service after a provider-side failure (a drop that is the
provider's fault, a deferral past the deadline). Each attempt is claimed (LWT) before the
provider is called, exactly like chunk dispatch, so replayed webhooks and redeliveries never
send twice; a recipient that already reached an outcome is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aio_pika.abc
import orjson

from services.consumers.settle import Poison
from shared.attempts import GIVE_UP_RANK, AttemptStore
from shared.batchstore import BatchStore
from shared.broker import Broker
from shared.config import ProviderSettings
from shared.errors import ProviderError
from shared.models import Chunk, LogJob, Recipient
from shared.providers.base import Provider
from shared.resend import next_provider
from shared.stats import StatsStore
from shared.topology import log_key, parse_routing_key

log = logging.getLogger(__name__)


@dataclass
class LogRetrier:
    broker: Broker
    batches: BatchStore
    providers: Mapping[str, Provider]
    settings: ProviderSettings

    @property
    def db(self) -> Any:
        return self.batches.db

    def __post_init__(self) -> None:
        self.attempts = AttemptStore(self.batches.db)

    async def process(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        key = parse_routing_key(message.routing_key or "")
        if key.kind != "log" or key.provider is None:
            raise Poison(f"not a log key: {message.routing_key}")
        job = LogJob.decode(message.body)
        if job.log_id != key.id:
            raise Poison("routing key and body disagree")
        await self.handle(job, key.provider)

    async def handle(self, job: LogJob, code: str) -> None:
        row = await self.db.one(
            "SELECT email, name, substitutions, state, event, providers FROM batches "
            "WHERE batch_id = ? AND chunk = ? AND log_id = ?",
            (job.batch_id, job.chunk, job.log_id),
        )
        if row is None:
            raise Poison(f"no recipient {job.log_id} in batch {job.batch_id}")
        if row["state"] != "queued":
            return  # an outcome arrived meanwhile
        if job.give_up:
            await self._give_up(job, job.reason)
            return
        if job.check_deferred:
            if row["event"] == "deferred":
                await self._hand_on(
                    job, dict(row["providers"] or {}), job.failed_provider, "deferred too long"
                )
            return
        attempts = await self.db.rows(
            "SELECT attempt, provider, state FROM log_attempts WHERE batch_id = ? AND log_id = ?",
            (job.batch_id, job.log_id),
        )
        if any(a["state"] == "sent" and a["attempt"] >= job.attempt for a in attempts):
            return  # this re-send already happened
        claim = await self.db.one(
            "INSERT INTO log_attempts (batch_id, log_id, attempt, provider, state, started_at) "
            "VALUES (?, ?, ?, ?, 'sending', ?) IF NOT EXISTS",
            (job.batch_id, job.log_id, job.attempt, code, datetime.now(UTC)),
        )
        if not (claim and claim["[applied]"]):
            return  # a duplicate job; the claimant owns this attempt
        await self._send(job, code, row)

    async def _send(self, job: LogJob, code: str, row: dict[str, Any]) -> None:
        header = await self.batches.header(job.batch_id)
        if header is None:
            raise Poison(f"batch {job.batch_id} does not exist")
        recipient = Recipient(
            log_id=job.log_id,
            email=row["email"],
            name=row["name"],
            substitutions=orjson.loads(row["substitutions"]) if row["substitutions"] else {},
        )
        chunk = Chunk(
            batch_id=job.batch_id, index=job.chunk, message=header.message, recipients=(recipient,)
        )
        started = datetime.now(UTC)
        provider = self.providers.get(code)
        try:
            if provider is None:
                raise ProviderError(code, "provider is not configured")
            receipt = await provider.send(chunk)
        except ProviderError as error:
            await self._finish(job, "failed", error=f"{error.message}"[:500])
            tried = dict(row["providers"] or {})
            await self._write(job, code, f"failed: {error.message}"[:300], started)
            await self._hand_on(job, tried, code, f"failed: {error.message}")
            return
        await self._finish(job, "sent", message_id=receipt.message_id)
        await self._write(job, code, "sent", started, event="sent", message_id=receipt.message_id)

    async def _hand_on(self, job: LogJob, tried: dict[str, str], failed: str, why: str) -> None:
        """Publish the next re-send, or give up when no provider is left."""
        tried[failed] = why
        target = next_provider(self.settings.chain_codes, tried, failed)
        attempt = job.attempt + 1
        if target is None or attempt > self.settings.max_attempts:
            await self._give_up(job, f"{job.reason}; no other provider succeeded ({why})")
            return
        nxt = job.model_copy(
            update={"attempt": attempt, "failed_provider": failed, "check_deferred": False}
        )
        await self.broker.publish(
            log_key(target, job.log_id, attempt), nxt.encode(), message_id=f"{job.log_id}:{attempt}"
        )

    async def _finish(
        self, job: LogJob, state: str, *, error: str | None = None, message_id: str | None = None
    ) -> None:
        await self.db.execute(
            "UPDATE log_attempts SET state = ?, finished_at = ?, error = ?, message_id = ? "
            "WHERE batch_id = ? AND log_id = ? AND attempt = ?",
            (
                state,
                datetime.now(UTC),
                error or "",
                message_id or "",
                job.batch_id,
                job.log_id,
                job.attempt,
            ),
            idempotent=True,
        )

    async def _write(
        self, job: LogJob, code: str, result: str, at: datetime, **columns: Any
    ) -> None:
        await self.attempts.update_recipients(
            job.batch_id,
            job.chunk,
            [job.log_id],
            provider=code,
            provider_result=result,
            at=at,
            **columns,
        )

    async def _give_up(self, job: LogJob, reason: str) -> None:
        now = datetime.now(UTC)
        await self._write(
            job,
            "safedelivr",
            "gave up",
            now,
            event="failed",
            state="failed",
            reason=reason[:1000],
            rank=GIVE_UP_RANK,
        )
        header = await self.batches.header(job.batch_id)
        if header is not None:
            await StatsStore(self.db).mark(header.user_id, now, "failed", [str(job.log_id)])
