"""A stack for users' webhooks tests: the sandbox receiver served on loopback, the hooks
worker process (its real lifespan) and the API in process, on the test's private broker
namespace, with retry delays of a second or two."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from starlette.applications import Starlette

from sandbox.app import create_app as create_sandbox
from services.api.app import create_app as create_api
from services.hooks.main import create_app as create_hooks
from shared.accounts import accounts
from shared.infra.config import HooksSettings, SandboxSettings, Settings
from shared.infra.db import Database
from shared.outbound.hook_queue import QUEUE_DAYS, HookQueue
from shared.outbound.hook_store import HookStore
from shared.outbound.user_hooks import HookEmitter, HookEvent
from tests.conftest import unique
from tests.integration.harness import client_for, eventually, running, served

#: Retry delays of the tests (the production ones add up to a day).
FAST_DELAYS = "1,1,2"


def hooks_settings(**overrides: Any) -> HooksSettings:
    values: dict[str, Any] = {
        "allow_http": True,
        "allowed_networks": "127.0.0.0/8",
        "delays": FAST_DELAYS,
        "timeout": 3.0,
        "sweep_interval": 3600.0,
        "order_window": 0.5,
        "mail_from": "Safedelivr <hooks@example.com>",
        **overrides,
    }
    return HooksSettings(**values)


@dataclass
class HookStack:
    settings: Settings
    db: Database
    api: httpx.AsyncClient
    api_app: Starlette
    control: httpx.AsyncClient
    receiver_url: str
    user_id: uuid.UUID
    key: str
    emitter: HookEmitter
    hooks_app: Starlette | None = None

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def store(self) -> HookStore:
        return HookStore(self.db)

    async def endpoint(self, path: str, **body: Any) -> dict[str, Any]:
        """A new endpoint at the receiver's ``path``, its secret registered there."""
        answer = await self.api.post(
            "/v1/webhooks", json={"url": f"{self.receiver_url}{path}", **body}, headers=self.auth
        )
        assert answer.status_code == 201, answer.text
        created: dict[str, Any] = answer.json()
        await self.control.post(
            "/_control/receiver/secrets", json={"path": path, "secret": created["secret"]}
        )
        return created

    async def received(self, path: str, *, ok_only: bool = True) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = (
            await self.control.get("/_control/received", params={"path": path})
        ).json()
        return [r for r in found if r["status"] == 200 or not ok_only]

    async def until_received(
        self, path: str, count: int, timeout: float = 30
    ) -> list[dict[str, Any]]:
        async def check() -> list[dict[str, Any]] | None:
            found = await self.received(path)
            return found if len(found) >= count else None

        result: list[dict[str, Any]] = await eventually(check, timeout=timeout, interval=0.2)
        return result

    async def until_settled(self, endpoint_id: str, timeout: float = 30) -> None:
        """Until the endpoint has no event waiting (from its cursor on, as the worker reads
        it) and no worker holds its lease. From then on nothing more is sent to it: a send is
        of a waiting event, under the lease, and the event is marked done only after it (a
        wait on this, not a fixed "nothing more comes" window)."""
        queue, key = HookQueue(self.db), uuid.UUID(endpoint_id)

        async def settled() -> bool:
            since = (await queue.cursor(key)).since or datetime.now(UTC) - timedelta(
                days=QUEUE_DAYS
            )
            if await queue.pending(key, since, limit=1):
                return False
            lease = await self.db.one(
                "SELECT owner FROM user_webhook_cursors WHERE endpoint_id = ?", (key,)
            )
            return lease is None or lease["owner"] is None

        await eventually(settled, timeout=timeout, interval=0.1)


def event(kind: str, email: str, n: int = 0, **kw: Any) -> HookEvent:
    values: dict[str, Any] = {
        "type": kind,
        "source_id": f"{unique('src')}-{n}",
        "occurred_at": datetime.now(UTC),
        "batch_id": uuid.uuid1(),
        "log_id": uuid.uuid4(),
        "email": email,
        "provider": "sg",
        "attempt": n,
        **kw,
    }
    return HookEvent(**values)


@contextlib.asynccontextmanager
async def hook_stack(
    base: Settings, db: Database, *, hooks: HooksSettings | None = None, worker: bool = True
) -> AsyncIterator[HookStack]:
    s = base.model_copy(update={"hooks": hooks or hooks_settings()})
    async with (
        served(create_sandbox(SandboxSettings(webhook_url="http://127.0.0.1:9"))) as sandbox_url,
        httpx.AsyncClient(base_url=sandbox_url) as control,
    ):
        api_app = create_api(s)
        login = unique("hooks")
        user_id = await accounts.upsert_github_user(
            db,
            github_id=uuid.uuid4().int % 10**9,
            login=login,
            name=None,
            email=f"{login}@example.com",
            avatar_url=None,
        )
        key = await accounts.create_key(db, user_id, "hooks")
        async with running(api_app), client_for(api_app) as api:
            broker = api_app.state.resources.broker
            await broker.declare()
            emitter = HookEmitter(db, broker, cache_seconds=0)
            stack = HookStack(
                s, db, api, api_app, control, f"{sandbox_url}/_receiver", user_id, key, emitter
            )
            if not worker:
                yield stack
                return
            stack.hooks_app = create_hooks(s)
            async with running(stack.hooks_app):
                yield stack
