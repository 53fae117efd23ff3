"""Shared fixtures: real services through deploy/, an isolated keyspace per run, unique topology
names per test, and cleanup registered where each resource is created.

Integration tests skip when RabbitMQ/Cassandra can't be started locally, but fail when
``CI=true``: CI must never pass by skipping the tests that matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import structlog

from shared.infra.broker import Broker
from shared.infra.config import (
    AmqpSettings,
    ApiSettings,
    CassandraSettings,
    ConsumerSettings,
    ProviderSettings,
    SandboxSettings,
    Settings,
    WebhookSettings,
)
from shared.infra.db import Database
from shared.infra.migrations import migrate
from shared.infra.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
CI = os.environ.get("CI", "").lower() == "true"
#: The pytest-xdist worker running this process (``gw0``, ``gw1``...), or ``main`` without
#: workers: it names the session's keyspace, so a leftover says which run left it.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
#: Whether this process is one of several workers (``make test``), not a run of a few files.
PARALLEL = WORKER != "main"
#: Directories whose tests share a module's stack or the browser: each file runs on one worker
#: (``--dist loadgroup``, :func:`group_of`), so a module-scoped fixture is built once, not once
#: per worker.
GROUPED = ("tests/integration/", "tests/contracts/", "tests/browser/")


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def pytest_configure(config: pytest.Config) -> None:
    # Property tests have no deadline: under parallel workers an example may wait for a CPU,
    # and a test states what the code does, never how fast (``make bench`` measures that).
    hypothesis.settings.register_profile("suite", deadline=None)
    hypothesis.settings.load_profile("suite")


@pytest.fixture(scope="session")
def services_up() -> None:
    """Start RabbitMQ and Cassandra with the project's own scripts (idempotent)."""
    proc = subprocess.run(
        [str(ROOT / "deploy/local/services.sh"), "up"],
        # The interpreter running the tests: a worktree may have no .venv of its own.
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    if proc.returncode != 0:
        message = f"services did not start:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        if CI:
            pytest.fail(message)
        pytest.skip(message)


def drop_keyspace(name: str) -> None:
    """Drop a test keyspace (best effort: a leftover test keyspace harms nothing)."""
    subprocess.run(
        [
            sys.executable,  # the interpreter running the tests (a worktree may have no .venv)
            "-c",
            "import sys; from cassandra.cluster import Cluster; "
            "c = Cluster(['127.0.0.1'], port=int(sys.argv[2])); s = c.connect(); "
            "s.execute(f'DROP KEYSPACE IF EXISTS {sys.argv[1]}', timeout=60); c.shutdown()",
            name,
            os.environ.get("SAFEDELIVR_CASSANDRA_PORT", "9042"),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="session")
def keyspace(services_up: None) -> Iterator[str]:
    name = unique(f"t_{WORKER}")
    yield name
    drop_keyspace(name)


class KeyspacePool:
    """Migrated keyspaces made ahead of the modules that need one of their own.

    A migration takes 10-50 s (schema changes queue behind every other worker's), so under
    parallel workers the pool makes one spare in a background thread as soon as the
    session's keyspace is migrated: a worker's first such module takes it ready instead of
    waiting. Later ones are made on demand, as in a serial run: a spare made ahead for each
    would add more schema changes to a loaded node than it saves. A spare left at the end
    is dropped.
    """

    def __init__(self) -> None:
        self._ready: queue.Queue[CassandraSettings | Exception] = queue.Queue()
        self._making = 0
        self._closed = False
        self._lock = threading.Lock()

    def make_one(self) -> None:
        """Migrate one more keyspace in a background thread."""
        with self._lock:
            if self._closed:
                return
            self._making += 1
        threading.Thread(target=self._make, name="keyspace-pool").start()

    def _make(self) -> None:
        settings = CassandraSettings(keyspace=unique(f"p_{WORKER}"))
        made: CassandraSettings | Exception = settings
        try:
            asyncio.run(migrate(settings))
        except Exception as exc:  # noqa: BLE001 - the module that takes it fails with it
            made = exc
        with self._lock:  # one lock with close(): a spare is either drained or dropped here
            self._making -= 1
            closed = self._closed
            if not closed:
                self._ready.put(made)
        if closed or isinstance(made, Exception):
            drop_keyspace(settings.keyspace)

    async def take(self) -> CassandraSettings:
        """A migrated keyspace of the caller's own (made now if none is ready or coming)."""
        with self._lock:
            coming = self._making > 0 or not self._ready.empty()
        if not coming:
            self.make_one()
        made = await asyncio.to_thread(self._ready.get, timeout=600)
        if isinstance(made, Exception):
            raise made
        return made

    def close(self) -> None:
        """Drop the spares (beside the run's end); a keyspace still being made drops itself."""
        with self._lock:
            self._closed = True
            spares = [self._ready.get_nowait() for _ in range(self._ready.qsize())]
        for spare in spares:
            if isinstance(spare, CassandraSettings):
                threading.Thread(target=drop_keyspace, args=(spare.keyspace,), name="drop").start()


@pytest.fixture(scope="session")
def keyspace_pool(services_up: None) -> Iterator[KeyspacePool]:
    pool = KeyspacePool()
    yield pool
    pool.close()


@contextlib.asynccontextmanager
async def private_keyspace(pool: KeyspacePool) -> AsyncIterator[CassandraSettings]:
    """A migrated keyspace of its own, for a module or a stack that outlives single tests
    (dropped after).

    Background work of such a stack (its outbox relay, its consumers) then never sees rows
    another test wrote, and tests never see its rows.
    """
    settings = await pool.take()
    try:
        yield settings
    finally:
        # Dropped beside the next tests, not before them (a drop takes seconds): the thread is
        # not a daemon, so the run waits for it before it ends.
        threading.Thread(target=drop_keyspace, args=(settings.keyspace,), name="drop").start()


@pytest.fixture(scope="session")
def cassandra_settings(keyspace: str) -> CassandraSettings:
    return CassandraSettings(keyspace=keyspace)


@pytest.fixture(scope="session")
async def migrated(
    cassandra_settings: CassandraSettings, keyspace_pool: KeyspacePool
) -> CassandraSettings:
    await migrate(cassandra_settings)
    if PARALLEL:
        keyspace_pool.make_one()  # after the session's own: schema changes queue on one node
    return cassandra_settings


@pytest.fixture(scope="session")
async def db(migrated: CassandraSettings) -> AsyncIterator[Database]:
    database = await Database.connect(migrated, keyspace=migrated.keyspace)
    yield database
    await database.close()


@pytest.fixture
def exchange_name() -> str:
    return unique("t").replace("_", "-")


@pytest.fixture
async def settings(migrated: CassandraSettings, exchange_name: str) -> AsyncIterator[Settings]:
    """Settings for one test: the run's keyspace, a private topology, fast retries. Whatever
    the test declared of its topology is deleted afterwards, so runs leave no queues."""
    s = stack_settings(migrated, exchange_name)
    yield s
    await delete_topology(s)


async def delete_topology(s: Settings) -> None:
    """Delete what a stack declared of its topology (its exchange, queues and delay tiers)."""
    from shared.infra.resources import topology_for

    broker = Broker(s.amqp.url.get_secret_value(), topology_for(s), name="cleanup")
    with contextlib.suppress(Exception):  # nothing declared, or the broker is away: no leftovers
        await asyncio.wait_for(broker.connect(), 10)
        await asyncio.wait_for(broker.delete(), 30)
    with contextlib.suppress(Exception):
        await broker.close()


def stack_settings(migrated: CassandraSettings, exchange_name: str) -> Settings:
    """The settings every test stack starts from: fast retries and short windows."""
    return Settings(
        cassandra=migrated,
        amqp=AmqpSettings(exchange=exchange_name, delivery_limit=5),
        # Sender domains are not checked here: tests/integration/test_domains.py checks them.
        api=ApiSettings(outbox_grace=1.0, outbox_relay_interval=0.5, sender_domains="any"),
        webhooks=WebhookSettings(),
        providers=ProviderSettings(
            backoff="1,2",
            max_attempts=4,
            timeout=5.0,
            resolve_interval=1,
            query_after=3,
            webhook_window=10,
        ),
        consumers=ConsumerSettings(),
        sandbox=SandboxSettings(),
    )


@pytest.fixture
async def broker(services_up: None, exchange_name: str) -> AsyncIterator[Broker]:
    """A connected broker with a private copy of the topology, deleted afterwards."""
    b = Broker(
        AmqpSettings().url.get_secret_value(),
        Topology(exchange=exchange_name, delay_tiers=(1, 2), delivery_limit=3),
        name=exchange_name,
    )
    await b.connect()
    await b.declare()
    yield b
    await b.delete()
    await b.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.path).replace(os.sep, "/")
        if "tests/integration/" in path:
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("offloop"):
            # It counts the event loop's turns while a thread works: another worker's load
            # would change the count, so it runs in the serial part.
            item.add_marker(pytest.mark.exclusive)


def group_of(nodeid: str) -> str:
    """The unit of work one worker takes whole (``--dist loadgroup``): the browser tests
    together (one browser stack per run), a module of the ``GROUPED`` directories (so that
    a module-scoped fixture is built once), any other test alone."""
    path = nodeid.split("::", 1)[0]
    group = next((g for g in GROUPED if path.startswith(g)), None)
    if group == "tests/browser/":
        return "browser"
    return path if group is not None else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` by :func:`group_of`. pytest-xdist 3.8 marks a group by renaming
    each test's node id, which pytest 9 ignores (``nodeid`` is read-only there): every test
    became a group of its own, so a module-scoped app was built on both workers."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class Groups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return Groups(config, log)


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """For tests that configure logging as a process would: the next test gets its own back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
