"""A whole stack for one test: webhooks and sandbox served on loopback, the API in process,
consumers started (and killed) by the test, all on the test's private broker namespace.

Fault tests use :class:`Stack` to submit batches, inject provider faults, run a consumer
delivery that "dies" at a chosen point (``Crash`` raised from the send path's fault points, then
the connection dropped without an ack), and read back what every recipient ended as and how
often each provider accepted it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from pydantic import SecretStr
from starlette.applications import Starlette

from sandbox import signing
from sandbox.app import create_app as create_sandbox
from services.api.app import create_app as create_api
from services.consumers import protocol
from services.consumers.faults import FaultPoints, no_faults
from services.consumers.main import build_dispatcher
from services.consumers.main import create_app as create_consumers
from services.consumers.running import Running
from services.consumers.splitter import Splitter
from services.webhooks.app import create_app as create_webhooks
from shared.accounts import accounts
from shared.core.models import BatchJob, ChunkJob
from shared.delivery.batchstore import BatchStore
from shared.delivery.domain_capacity import CapacityRules
from shared.delivery.handoff import Routing
from shared.infra.broker import Broker
from shared.infra.config import (
    AlertSettings,
    ProviderSettings,
    SandboxSettings,
    Settings,
    WebhookSettings,
)
from shared.infra.current import Current
from shared.infra.db import Database
from shared.infra.resources import Resources, topology_for
from shared.infra.settle import Delivery
from shared.infra.topology import dispatch_key
from shared.providers.registry import close_all
from tests.conftest import unique
from tests.integration.harness import (
    batch_stats,
    client_for,
    day_stats,
    eventually,
    running,
    served,
)

MG_KEY = "stack-mailgun-signing-key"


class Crash(BaseException):
    """The process dies here: nothing after it runs, and its delivery is never acked."""


def crash_at(point: str, *, times: int = 1) -> FaultPoints:
    """Fault points that crash the first ``times`` deliveries reaching ``point``."""
    left = [times]

    async def crash(reached: str, job: protocol.Job) -> None:
        if reached == point and left[0] > 0:
            left[0] -= 1
            raise Crash(point)

    return crash


def fast_settings(base: Settings, **providers: Any) -> Settings:
    """Short timeouts and windows so faults resolve in seconds."""
    values = {
        **base.providers.model_dump(),
        "timeout": 2.0,
        "resolve_interval": 1,
        "query_after": 3,
        "webhook_window": 8,
        "backoff": "1,2",
        "max_attempts": 4,
        **providers,
    }
    return base.model_copy(
        update={
            "providers": ProviderSettings(**values),
            "api": base.api.model_copy(update={"idempotency_lease": 3.0}),
        }
    )


@dataclass
class Stack:
    settings: Settings
    db: Database
    api: httpx.AsyncClient
    api_app: Starlette
    sandbox: httpx.AsyncClient
    key: str
    user_id: uuid.UUID
    hooks_url: str
    sendgrid_key: Any
    """The private key the sandbox signs SendGrid events with."""
    ses_key: Any = None
    """The private key the sandbox signs the SNS notifications of SES events with."""

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    async def submit(self, to: list[str], *, key: str | None = None, **extra: Any) -> str:
        resp = await self.post(to, key=key, **extra)
        assert resp.status_code == 202, resp.text
        return str(resp.json()["batch_id"])

    async def post(self, to: list[str], *, key: str | None = None, **extra: Any) -> httpx.Response:
        body = {"from": "Shop <shop@example.com>", "to": to, "subject": "Hi", "text": "Hello"}
        headers = {**self.auth, **({"Idempotency-Key": key} if key else {})}
        return await self.api.post("/v1/batches", json={**body, **extra}, headers=headers)

    async def logs(self, batch_id: str) -> dict[str, dict[str, Any]]:
        resp = await self.api.get(
            f"/v1/batches/{batch_id}/logs", params={"limit": "500"}, headers=self.auth
        )
        assert resp.status_code == 200, resp.text
        return {r["email"]: r for r in resp.json()["data"]}

    async def received(self, email: str, timeout: float = 30) -> dict[str, Any]:
        """The newest message the sandbox accepted for ``email``, as its mailbox shows it."""

        async def check() -> dict[str, Any] | None:
            resp = await self.sandbox.get("/_control/messages", params={"to": email})
            found: list[dict[str, Any]] = resp.json() if resp.status_code == 200 else []
            return found[0] if found else None

        message: dict[str, Any] = await eventually(check, timeout=timeout)
        return message

    async def final(self, batch_id: str, count: int, timeout: float = 90) -> dict[str, Any]:
        """The logs once every recipient has an outcome."""

        async def check() -> dict[str, dict[str, Any]] | None:
            logs = await self.logs(batch_id)
            done = len(logs) == count and all(r["state"] != "queued" for r in logs.values())
            return logs if done else None

        result: dict[str, Any] = await eventually(check, timeout=timeout, interval=0.5)
        return result

    async def stats(self, day: str) -> dict[str, int]:
        return await day_stats(self.api, day, self.auth)

    async def batch_stats(self, batch_id: str) -> dict[str, int]:
        return await batch_stats(self.api, batch_id, self.auth)

    async def fault(self, provider: str, **fault: Any) -> None:
        resp = await self.sandbox.post("/_control/faults", json={"provider": provider, **fault})
        assert resp.status_code == 201, resp.text

    async def accepted(self, email: str) -> dict[str, int]:
        """How many times each provider accepted mail for ``email``: SendGrid and Mailgun
        always, a provider added since (the SMTP relay) only once it accepted it."""
        resp = await self.sandbox.get("/_control/sends", params={"email": email, "recent": "0"})
        data = resp.json()
        counts = {p: data[p]["by_recipient"].get(email.lower(), 0) for p in data}
        return {p: n for p, n in counts.items() if n or p in ("sendgrid", "mailgun")}

    @contextlib.asynccontextmanager
    async def consuming(self, fault_points: FaultPoints = no_faults) -> AsyncIterator[Starlette]:
        """Consumers running for the block (a real process would be the same)."""
        app = create_consumers(self.settings, fault_points=fault_points)
        async with running(app):
            yield app

    async def doomed(
        self,
        queue: str,
        fault_points: FaultPoints,
        *,
        timeout: float = 20,
        capacity: CapacityRules | None = None,
    ) -> str:
        """One consumer delivery of the next job on ``queue`` that dies where ``fault_points``
        crash; its connection is then dropped without an ack, so RabbitMQ redelivers the job.
        Returns the point it died at (or ``survived``)."""
        broker = Broker(
            self.settings.amqp.url.get_secret_value(), topology_for(self.settings), name="doomed"
        )
        await broker.connect()
        dispatcher = build_dispatcher(
            self.settings,
            Resources(self.db, broker),
            fault_points=fault_points,
            running=Current(Running.start(self.settings.providers, capacity=capacity)),
        )
        try:
            message = await eventually(lambda: broker.get(queue), timeout=timeout)
            try:
                await dispatcher.process(message, Delivery())
            except Crash as crash:
                return str(crash)
            await message.ack()
            return "survived"
        finally:
            await broker.close()
            await close_all(dispatcher.providers)

    async def sendgrid_event(
        self, batch_id: str, email: str, event: str, *, attempt: str = "c.0", **extra: Any
    ) -> httpx.Response:
        """Post one signed SendGrid event about a recipient, as SendGrid would."""
        body = orjson.dumps(
            [
                {
                    "email": email,
                    "event": event,
                    "timestamp": int(time.time()),
                    "sg_event_id": uuid.uuid4().hex,
                    "sg_message_id": "late.filter0001",
                    "batch_id": batch_id,
                    "chunk": "0",
                    "sd_attempt": attempt,
                    **extra,
                }
            ]
        )
        stamp = str(int(time.time()))
        async with httpx.AsyncClient() as client:
            return await client.post(
                f"{self.hooks_url}/webhooks/sendgrid",
                content=body,
                headers={
                    signing.SENDGRID_SIGNATURE_HEADER: signing.sign_sendgrid(
                        self.sendgrid_key, stamp, body
                    ),
                    signing.SENDGRID_TIMESTAMP_HEADER: stamp,
                    "Content-Type": "application/json",
                },
            )

    async def split(self, batch_id: str) -> None:
        """Fan a batch out into its chunk jobs (what the splitter consumer does)."""
        broker = Broker(
            self.settings.amqp.url.get_secret_value(), topology_for(self.settings), name="split"
        )
        await broker.connect()
        try:
            await Splitter(
                broker, BatchStore(self.db), Current(Routing.start(self.settings.providers))
            ).split(BatchJob(batch_id=uuid.UUID(batch_id)))
        finally:
            await broker.close()

    async def duplicate_job(self, batch_id: str, chunk: int = 0) -> None:
        """Publish a second copy of a chunk's first job (a relay or a redelivery makes them)."""
        broker = Broker(
            self.settings.amqp.url.get_secret_value(), topology_for(self.settings), name="dup"
        )
        await broker.connect()
        try:
            await broker.publish(
                dispatch_key(self.settings.providers.chain_codes[0], uuid.UUID(batch_id), 0),
                ChunkJob(batch_id=uuid.UUID(batch_id), chunk=chunk).encode(),
            )
        finally:
            await broker.close()

    def queue(self, provider: str = "sg") -> str:
        return topology_for(self.settings).provider_queue(provider)

    def log_queue(self, provider: str) -> str:
        return topology_for(self.settings).log_queue(provider)


@contextlib.asynccontextmanager
async def full_stack(
    base: Settings,
    db: Database,
    *,
    sandbox: dict[str, Any] | None = None,
    webhooks: dict[str, Any] | None = None,
) -> AsyncIterator[Stack]:
    """Webhooks + sandbox (on loopback) + API (in process); consumers are up to the test."""
    private_pem, public_b64 = signing.generate_key_pair()
    ses_pem, ses_certificate = signing.generate_sns_pair()
    s = base.model_copy(
        update={
            "webhooks": WebhookSettings(
                sendgrid_public_key=public_b64,
                mailgun_signing_key=SecretStr(MG_KEY),
                ses_topic_arns=SandboxSettings().ses_topic_arn,
                ses_cert_pem=ses_certificate,
                **(webhooks or {}),
            ),
            # Alerts may be posted to the sandbox's receiver (plain http on loopback).
            "alerts": AlertSettings(allow_http=True, allowed_networks="127.0.0.0/8,::1/128"),
        }
    )
    async with served(create_webhooks(s)) as hooks_url:
        sandbox_app = create_sandbox(
            SandboxSettings(
                webhook_url=hooks_url,
                sendgrid_private_key=SecretStr(private_pem),
                mailgun_signing_key=SecretStr(MG_KEY),
                ses_signing_key=SecretStr(ses_pem),
                **{"webhook_delay": 0.1, "query_delay": 0.5, **(sandbox or {})},
            )
        )
        async with served(sandbox_app) as sandbox_url:
            providers = s.providers.model_copy(
                update={
                    "sendgrid_base_url": f"{sandbox_url}/sendgrid",
                    "mailgun_base_url": f"{sandbox_url}/mailgun",
                    # Provider smtp (when a test puts it in the chain): the sandbox's relay.
                    "smtp_host": "127.0.0.1",
                    "smtp_port": sandbox_app.state.relay.port,
                    "smtp_tls": "none",
                    "ses_base_url": f"{sandbox_url}/ses",
                }
            )
            s = s.model_copy(update={"providers": providers})
            api = create_api(s)
            user_id = await accounts.ensure_user(db, unique("stack"))
            key = await accounts.create_key(db, user_id, "stack")
            async with (
                running(api),
                client_for(api) as client,
                httpx.AsyncClient(base_url=sandbox_url) as control,
            ):
                await api.state.resources.broker.declare()
                try:
                    yield Stack(
                        s,
                        db,
                        client,
                        api,
                        control,
                        key,
                        user_id,
                        hooks_url,
                        signing.load_private_key(private_pem),
                        signing.load_sns_key(ses_pem),
                    )
                finally:
                    await api.state.resources.broker.delete()


async def as_new_user(stack: Stack) -> Stack:
    """``stack`` (a module's, started once) used by a user and key of the caller's own: tests
    sharing a stack then share no data."""
    user_id = await accounts.ensure_user(stack.db, unique("stack"))
    key = await accounts.create_key(stack.db, user_id, "stack")
    return dataclasses.replace(stack, user_id=user_id, key=key)


def emails(n: int, prefix: str = "r") -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"{prefix}{i}.{tag}@example.com" for i in range(n)]


async def until(check: Callable[[], Awaitable[Any]], timeout: float = 30) -> Any:
    return await eventually(check, timeout=timeout, interval=0.3)


async def quiet(seconds: float) -> None:
    await asyncio.sleep(seconds)
