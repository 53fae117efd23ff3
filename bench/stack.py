"""The system under test for one run: a private keyspace and exchange, an API key, the service
processes, and the RabbitMQ and Cassandra processes whose CPU and memory are sampled.

Everything the run creates is removed by :meth:`Stack.teardown`: the service processes are
stopped, the topology deleted and the keyspace dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import aio_pika.abc
import aiohttp

from bench import procfs
from bench.cqlops import OpsProbe, Snapshot
from bench.sampler import ProcessSampler
from bench.services import SERVICES, ServiceProcesses, free_port
from sandbox import signing
from shared.accounts import accounts
from shared.accounts.domains import DomainStore
from shared.infra.broker import Broker, connect_nodes
from shared.infra.config import Settings, load_settings
from shared.infra.db import Database
from shared.infra.migrations import migrate
from shared.infra.resources import topology_for
from shared.infra.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS_DIR = Path(__file__).resolve().parent / "experiments"
#: The domain the workloads send from (chaos@example.com, news@shop.example.com).
SENDING_DOMAIN = "example.com"
#: Where the sandbox posts webhooks while no webhook phase runs: long after the run ends.
IDLE_WEBHOOK_DELAY = 3600.0

Printer = Callable[[str], None]

#: Per-key rate limit and daily recipient quota raised out of the way: the benchmark measures
#: capacity, not the limiter. The limiter's own work (counter update and read per request,
#: per batch) still runs on every request.
CAPACITY_LIMITS = {
    "SAFEDELIVR_API_RATE_LIMIT_PER_SECOND": "1000000",
    "SAFEDELIVR_API_RATE_BURST": "1000000",
    "SAFEDELIVR_API_DAILY_RECIPIENT_QUOTA": "1000000000000",
}


def run_names() -> tuple[str, str, str]:
    """``(run id, keyspace, exchange)`` unique to this run: UTC time plus a random tag."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    tag = secrets.token_hex(3)
    return stamp, f"bench_{stamp.lower()}_{tag}", f"bench-{stamp.lower()}-{tag}"


class Stack:
    """See the module docstring; create with :meth:`setup`, always end with :meth:`teardown`."""

    def __init__(
        self,
        *,
        log_dir: Path,
        sampler: ProcessSampler,
        printer: Printer,
        experiments: Sequence[str] = (),
    ) -> None:
        self.run_id, keyspace, exchange = run_names()
        self.experiments = tuple(experiments)
        base = load_settings()
        self.ports = {name: free_port() for name in SERVICES}
        sandbox = f"http://127.0.0.1:{self.ports['sandbox']}"
        self.settings: Settings = base.model_copy(
            update={
                "cassandra": base.cassandra.model_copy(update={"keyspace": keyspace}),
                "amqp": base.amqp.model_copy(update={"exchange": exchange}),
                "providers": base.providers.model_copy(
                    update={
                        "sendgrid_base_url": f"{sandbox}/sendgrid",
                        "mailgun_base_url": f"{sandbox}/mailgun",
                    }
                ),
            }
        )
        self.log_dir = log_dir
        self.sampler = sampler
        self.printer = printer
        self.processes = ServiceProcesses(
            ports=self.ports,
            env=self.env,
            cwd=ROOT,
            log_dir=log_dir,
            sampler=sampler,
            printer=printer,
        )
        self.db: Database | None = None
        self.ops: OpsProbe | None = None
        self.broker: Broker | None = None
        self.user_id: Any = None
        self.api_key = ""
        self._admin: aio_pika.abc.AbstractRobustConnection | None = None
        self._http: aiohttp.ClientSession | None = None
        self._keyspace_created = False
        self._topology_declared = False
        # Signing keys for this run: the webhook service verifies, bench.hooks signs.
        self.sendgrid_private_key, self.sendgrid_public_key = signing.generate_key_pair()
        self.mailgun_signing_key = secrets.token_hex(16)

    # -- names and environment -------------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        """Where ``deploy/local`` keeps Cassandra's pid file and logs."""
        return Path(os.environ.get("SAFEDELIVR_STATE_DIR", ROOT / ".state"))

    @property
    def keyspace(self) -> str:
        return self.settings.cassandra.keyspace

    @property
    def exchange(self) -> str:
        return self.settings.amqp.exchange

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    def env(self) -> dict[str, str]:
        """``SAFEDELIVR_*`` variables that point a process at this run's keyspace and ports."""
        return {
            "SAFEDELIVR_CASSANDRA_KEYSPACE": self.keyspace,
            "SAFEDELIVR_AMQP_EXCHANGE": self.exchange,
            "SAFEDELIVR_PROVIDERS_SENDGRID_BASE_URL": f"{self.url('sandbox')}/sendgrid",
            "SAFEDELIVR_PROVIDERS_MAILGUN_BASE_URL": f"{self.url('sandbox')}/mailgun",
            "SAFEDELIVR_SANDBOX_WEBHOOK_URL": self.url("webhooks"),
            "SAFEDELIVR_SANDBOX_WEBHOOK_DELAY": str(IDLE_WEBHOOK_DELAY),
            "SAFEDELIVR_API_PORT": str(self.ports["api"]),
            "SAFEDELIVR_API_PUBLIC_URL": self.url("api"),
            "SAFEDELIVR_WEBHOOKS_PORT": str(self.ports["webhooks"]),
            "SAFEDELIVR_CONSUMERS_PORT": str(self.ports["consumers"]),
            "SAFEDELIVR_TRACKING_PORT": str(self.ports["tracking"]),
            "SAFEDELIVR_TRACKING_PUBLIC_URL": self.url("tracking"),
            "SAFEDELIVR_HOOKS_PORT": str(self.ports["hooks"]),
            # The sandbox answers the API's DNS questions and plays GitHub, as in make run.
            "SAFEDELIVR_API_DNS_URL": f"{self.url('sandbox')}/dns-query",
            "SAFEDELIVR_GITHUB_OAUTH_BASE_URL": f"{self.url('sandbox')}/github",
            "SAFEDELIVR_GITHUB_API_BASE_URL": f"{self.url('sandbox')}/github/api",
            "SAFEDELIVR_SANDBOX_PORT": str(self.ports["sandbox"]),
            "SAFEDELIVR_LOG_LEVEL": "WARNING",
            "SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY": self.sendgrid_public_key,
            "SAFEDELIVR_WEBHOOKS_MAILGUN_SIGNING_KEY": self.mailgun_signing_key,
            **CAPACITY_LIMITS,
            **self._python_path(),
        }

    def _python_path(self) -> dict[str, str]:
        """The project on ``PYTHONPATH``, after the experiments' ``sitecustomize`` if any."""
        if not self.experiments:
            return {"PYTHONPATH": str(ROOT)}
        return {
            "PYTHONPATH": f"{EXPERIMENTS_DIR}{os.pathsep}{ROOT}",
            "BENCH_EXPERIMENTS": ",".join(self.experiments),
        }

    # -- life cycle ------------------------------------------------------------------------

    async def setup(self) -> None:
        """Migrate the keyspace, declare the topology, create a user and key, find RabbitMQ
        and Cassandra, and start tracking this process."""
        self.sampler.track("bench", os.getpid())
        self.track_infra()
        t0 = time.monotonic()
        self._keyspace_created = True
        await migrate(self.settings.cassandra)
        self.db = await Database.connect(self.settings.cassandra, keyspace=self.keyspace)
        self.ops = await OpsProbe.connect(self.settings.cassandra, self.keyspace)
        self.broker = Broker(
            self.settings.amqp.url.get_secret_value(),
            topology_for(self.settings),
            publish_timeout=self.settings.amqp.publish_timeout,
            name="safedelivr-bench",
        )
        await self.broker.connect()
        self._topology_declared = True
        await self.broker.declare()
        self._admin = await connect_nodes(
            self.settings.amqp.url.get_secret_value(), name="bench-admin"
        )
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self.user_id = await accounts.ensure_user(self.db, f"bench-{self.run_id.lower()}")
        self.api_key = await accounts.create_key(self.db, self.user_id, "bench")
        # The workloads send from example.com and its subdomains: verified as a user would
        # (with the sender check on, as in production).
        domains = DomainStore(self.db)
        await domains.add(self.user_id, SENDING_DOMAIN)
        await domains.mark_verified(self.user_id, SENDING_DOMAIN)
        self.printer(
            f"keyspace {self.keyspace} migrated, exchange {self.exchange} declared, "
            f"API key created ({time.monotonic() - t0:.1f}s)"
        )

    async def wait_until_available(self, timeout: float = 180.0) -> None:
        """Return once Cassandra and RabbitMQ answer; other users of this machine restart
        them (integration tests do), and a phase started meanwhile would only fail."""
        deadline = time.monotonic() + timeout
        announced = False
        while (problem := await self._probe()) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{problem} unavailable for {timeout:.0f}s")
            if not announced:
                self.printer(f"waiting for {problem} to come back")
                announced = True
            await asyncio.sleep(2)
        if announced:
            self.printer("Cassandra and RabbitMQ answer again")

    async def _probe(self) -> str | None:
        """The dependency that does not answer, or None."""
        query = "SELECT release_version FROM system.local"
        try:
            assert self.db is not None  # noqa: S101
            await asyncio.wait_for(self.db.one(query), 5)
        except Exception:  # noqa: BLE001 - any failure means "not available"
            # The driver may still be backing off from an outage: a fresh session decides.
            try:
                fresh = await Database.connect(self.settings.cassandra, keyspace=self.keyspace)
                await asyncio.wait_for(fresh.one(query), 5)
            except Exception as exc:  # noqa: BLE001
                return f"cassandra ({type(exc).__name__})"
            old, self.db = self.db, fresh
            if old is not None:
                with contextlib.suppress(Exception):
                    await old.close()
        try:
            await asyncio.wait_for(self.depth(self.topology.batches_queue), 5)
        except Exception as exc:  # noqa: BLE001
            return f"rabbitmq ({type(exc).__name__})"
        return None

    async def cassandra_ops(self, *, settled: bool = False) -> Snapshot | None:
        """The keyspace's Cassandra counters now (:mod:`bench.cqlops`); ``settled``: once
        its round trips stopped moving. None when they cannot be read."""
        if self.ops is None:
            return None
        return await (self.ops.settled() if settled else self.ops.snapshot())

    def track_infra(self) -> None:
        """(Re)find RabbitMQ and Cassandra: either may have been restarted since the last
        phase (by this machine's other users), and a new pid must be sampled."""
        state_dir = self.state_dir
        tracked = self.sampler.tracked()
        for label, pid in (
            ("rabbitmq", procfs.rabbitmq_pid()),
            ("cassandra", procfs.cassandra_pid(state_dir)),
        ):
            if pid is None:
                self.printer(f"warning: no {label} process found; its CPU is not reported")
            elif tracked.get(label) != pid:
                if label in tracked:
                    self.printer(f"warning: {label} was restarted (pid {tracked[label]} -> {pid})")
                self.sampler.track(label, pid)

    async def teardown(self) -> list[str]:
        """Stop the services, delete the topology, drop the keyspace; each step is attempted
        whatever happened before. Returns what could not be cleaned up (empty when all was)."""
        problems = await self.processes.stop_all()
        if self._http is not None:
            await self._http.close()
        if self.ops is not None:
            with contextlib.suppress(Exception):
                await self.ops.close()
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()
        if self._topology_declared:
            try:
                await self._delete_topology()
            except Exception as exc:  # noqa: BLE001 - keep cleaning up
                problems.append(f"exchange {self.exchange} and its queues: {exc}")
        if self._keyspace_created:
            try:
                await self._drop_keyspace()
            except Exception as exc:  # noqa: BLE001 - report what is left behind
                problems.append(f"keyspace {self.keyspace}: {exc}")
        if not problems:
            self.printer(f"dropped keyspace {self.keyspace}, deleted exchange {self.exchange}")
        return problems

    async def _delete_topology(self) -> None:
        broker = self.broker
        if broker is None or not broker.connected:
            broker = Broker(self.settings.amqp.url.get_secret_value(), self.topology)
            await broker.connect()
        try:
            await broker.delete()
        finally:
            await broker.close()
            if self.broker is not None and broker is not self.broker:
                await self.broker.close()

    async def _drop_keyspace(self) -> None:
        if self.db is not None:
            with contextlib.suppress(Exception):
                await self.db.close()
        db = await Database.connect(self.settings.cassandra)
        try:
            await db.execute(f"DROP KEYSPACE IF EXISTS {self.keyspace}", prepare=False, timeout=120)
        finally:
            await db.close()

    # -- services --------------------------------------------------------------------------

    async def ensure(self, wanted: set[str]) -> None:
        """Run exactly the ``wanted`` services (see :meth:`ServiceProcesses.ensure`)."""
        self.track_infra()
        await self.processes.ensure(wanted)

    # -- broker and sandbox probes ---------------------------------------------------------

    async def purge(self, *queues: str) -> int:
        """Drop the messages of ``queues`` (work left by a phase); return how many."""
        assert self._admin is not None  # noqa: S101
        dropped = 0
        async with self._admin.channel() as channel:
            for name in queues:
                queue = await channel.declare_queue(name, passive=True)
                result = await queue.purge()
                dropped += int(getattr(result, "message_count", 0) or 0)
        return dropped

    async def depth(self, queue: str) -> int:
        """Messages ready in ``queue`` (not counting those delivered and unacked)."""
        assert self._admin is not None  # noqa: S101
        async with self._admin.channel() as channel:
            declared = await channel.declare_queue(queue, passive=True)
            return int(declared.declaration_result.message_count or 0)

    async def sandbox_sends(self) -> dict[str, dict[str, int]]:
        """Requests and recipients each provider stand-in accepted so far."""
        assert self._http is not None  # noqa: S101
        url = f"{self.url('sandbox')}/_control/sends?email=nobody@bench.invalid&recent=0"
        async with self._http.get(url) as resp:
            resp.raise_for_status()
            body = await resp.json()
        return {
            provider: {"requests": v["requests"], "recipients": v["recipients"]}
            for provider, v in body.items()
        }

    @property
    def topology(self) -> Topology:
        return topology_for(self.settings)

    def work_queues(self) -> list[str]:
        return [q.name for q in self.topology.work_queues()]
