"""The Safedelivr service processes of a run, each started as ``safedelivr <service> --port``
the way they run in production, waited for on its health path, sampled while it runs, and
stopped with SIGTERM (then SIGKILL) so it drains as it would in a deploy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.sampler import ProcessSampler

#: Seconds a service may take to answer its health check after it is started.
START_TIMEOUT = 90.0
#: Seconds a service may take to drain and exit after SIGTERM.
STOP_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """How to run one service: its ``safedelivr`` subcommand and health path."""

    command: str
    health: str


#: Every service a phase may need (a webhook phase will list ``webhooks`` in its ``needs``).
SERVICES: dict[str, ServiceSpec] = {
    "sandbox": ServiceSpec("sandbox", "/healthz"),
    "api": ServiceSpec("api", "/readyz"),
    "consumers": ServiceSpec("consumers", "/readyz"),
    "webhooks": ServiceSpec("webhooks", "/readyz"),
    # A second consumer process (``make chaos`` runs two, so one job can reach both).
    "consumers-b": ServiceSpec("consumers", "/readyz"),
    # A third (the ``rate_limit`` phase: three processes share one provider's limit).
    "consumers-c": ServiceSpec("consumers", "/readyz"),
    # The tracking endpoint and the users' webhook worker (``make hostile`` runs every
    # service).
    "tracking": ServiceSpec("tracking", "/readyz"),
    "hooks": ServiceSpec("hooks", "/readyz"),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Service:
    name: str
    port: int
    log_path: Path
    proc: asyncio.subprocess.Process | None = None
    env: dict[str, str] = field(default_factory=dict)


class ServiceProcesses:
    """Starts, health-checks and stops the services; see the module docstring."""

    def __init__(
        self,
        *,
        ports: Mapping[str, int],
        env: Callable[[], dict[str, str]],
        cwd: Path,
        log_dir: Path,
        sampler: ProcessSampler,
        printer: Callable[[str], None],
    ) -> None:
        self.ports = dict(ports)
        self._env = env
        self._cwd = cwd
        self._log_dir = log_dir
        self._sampler = sampler
        self._printer = printer
        self.running: dict[str, Service] = {}
        self._http: aiohttp.ClientSession | None = None

    async def ensure(self, wanted: set[str]) -> None:
        """Run exactly the ``wanted`` services (the sandbox, once started, keeps running)."""
        for name in list(self.running):
            if name not in wanted and name != "sandbox":
                await self.stop(name)
        for name in sorted(wanted - set(self.running), key=list(SERVICES).index):
            await self.start(name)

    async def start(self, name: str, env: Mapping[str, str] | None = None) -> None:
        spec = SERVICES[name]
        service = Service(
            name, self.ports[name], self._log_dir / f"{name}.log", env=dict(env or {})
        )
        t0 = time.monotonic()
        with service.log_path.open("ab") as log:
            service.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "services.cli",
                spec.command,
                "--port",
                str(service.port),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, **self._env(), **service.env},
                cwd=self._cwd,
            )
        self.running[name] = service
        await self._wait_healthy(service, spec.health)
        self._sampler.track(name, service.proc.pid)
        self._printer(f"started {name} on :{service.port} ({time.monotonic() - t0:.1f}s)")

    async def restart(self, name: str, env: Mapping[str, str]) -> None:
        """Run ``name`` again with extra environment (e.g. a webhook phase restarts the
        sandbox with ``SAFEDELIVR_SANDBOX_WEBHOOK_DELAY=0`` once the webhooks service runs)."""
        await self.stop(name)
        await self.start(name, env)

    async def stop(self, name: str) -> None:
        service = self.running.pop(name, None)
        if service is None or service.proc is None:
            return
        proc = service.proc
        self._sampler.untrack(name)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    async def kill(self, name: str) -> dict[str, str]:
        """SIGKILL ``name`` (no drain: a crash) and return the extra environment it ran with,
        to start it again alike."""
        service = self.running.pop(name)
        assert service.proc is not None  # noqa: S101
        self._sampler.untrack(name)
        with contextlib.suppress(ProcessLookupError):
            service.proc.kill()
        await service.proc.wait()
        return service.env

    async def stop_all(self) -> list[str]:
        """Stop every service; return what could not be stopped."""
        problems = []
        for name in list(self.running):
            try:
                await self.stop(name)
            except Exception as exc:  # noqa: BLE001 - keep stopping the others
                problems.append(f"service {name}: {exc}")
        if self._http is not None:
            await self._http.close()
            self._http = None
        return problems

    async def _wait_healthy(self, service: Service, path: str) -> None:
        assert service.proc is not None  # noqa: S101
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if service.proc.returncode is not None:
                raise RuntimeError(f"{service.name} exited at start; see {service.log_path}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self._http.get(f"http://127.0.0.1:{service.port}{path}") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{service.name} not healthy within {START_TIMEOUT:.0f}s")
