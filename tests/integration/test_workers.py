"""``safedelivr api --workers N``: N real worker processes behind one port, each ready, and
all of them gone after one SIGTERM to the supervisor (what systemd sends)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
from starlette.applications import Starlette

from bench.services import free_port
from services.cli import _supervise
from shared.infra.config import Settings
from shared.infra.resources import declare_topology
from tests.processes import alive, children, cmdline

ROOT = Path(__file__).resolve().parents[2]


async def _ready(url: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    async with httpx.AsyncClient() as client:
        while True:
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert asyncio.get_running_loop().time() < deadline, f"{url} never ready"
            await asyncio.sleep(0.3)


async def test_api_workers_share_one_port_and_stop_on_one_sigterm(settings: Settings) -> None:
    await declare_topology(settings)  # what safedelivr-prepare.service does first
    port = free_port()
    env = {
        **os.environ,
        "SAFEDELIVR_CASSANDRA_KEYSPACE": settings.cassandra.keyspace,
        "SAFEDELIVR_AMQP_EXCHANGE": settings.amqp.exchange,
        "SAFEDELIVR_LOG_FORMAT": "json",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "api", "--workers", "2", "--port", str(port),
        cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        await _ready(f"http://127.0.0.1:{port}/readyz")
        workers = {w for w in children(proc.pid) if b"spawn_main" in cmdline(w)}
        assert len(workers) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 60)

    assert code == 0
    assert not any(alive(w) for w in workers)


class _CannotStart:
    """A lifespan that fails on entry, as ours do when they cannot finish starting."""

    def __init__(self, app: Starlette) -> None:
        self.app = app

    async def __aenter__(self) -> None:
        raise RuntimeError("this app cannot start")

    async def __aexit__(self, *_: object) -> None:
        return None


def broken_app() -> Starlette:
    """An app whose start-up fails, as ours do when their lifespan cannot finish."""
    return Starlette(lifespan=_CannotStart)


def test_workers_that_cannot_start_make_the_supervisor_fail() -> None:
    options = {"host": "127.0.0.1", "port": free_port(), "log_level": "warning", "lifespan": "on"}
    code = _supervise(f"{__name__}:broken_app", 2, options)

    assert code == 3  # uvicorn's start-up failure, as one worker alone exits with
