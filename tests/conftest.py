"""Shared fixtures: real services through deploy/, an isolated keyspace per run, unique topology
names per test, and cleanup registered where each resource is created.

Integration tests skip when RabbitMQ/Cassandra can't be started locally, but fail when
``CI=true``: CI must never pass by skipping the tests that matter.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections import OrderedDict
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
from tests.keyspaces import alive as keyspace_alive
from tests.keyspaces import drop_later, name_for, sweep_later

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
    # The suite builds an API app per module or test, and most render no template: their
    # template workers start on a first render, not with each app (two interpreters of ~0.5 s
    # of CPU each, about 40 a minute on the 2-core machine). The pool's own tests say warm.
    os.environ.setdefault("SAFEDELIVR_TEMPLATES_WARM", "false")
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", None):
        return  # the xdist controller: its workers make and drop the keyspaces
    config.stash[RUN_KEYSPACES] = start_keyspaces(config)


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


def run_pid() -> int:
    """The process the whole run lives as long as: the xdist controller for a worker (its
    parent), else this one. Keyspace names carry it, so a later run's sweep knows when the run
    that made one is gone (tests/keyspaces.py)."""
    return os.getppid() if PARALLEL else os.getpid()


#: The most keyspaces a run makes ahead: each is a migration on the one node every test uses
#: (the whole suite takes 4), and more tables make every schema change slower.
MOST_AHEAD = 6


def pool_dir(testrunuid: str) -> Path:
    """Where the workers of run ``testrunuid`` share the pool's keyspaces."""
    return Path(tempfile.gettempdir()) / f"safedelivr-keyspaces-{testrunuid}"


class KeyspacePool:
    """Migrated keyspaces for the modules (and the browser stack) that need one of their own.

    A migration takes 10-50 s (schema changes queue behind every other worker's). The run
    makes as many as its collected tests will take, ahead, in the background once the
    process's own keyspace is migrated: each is made either way, and made ahead no module
    waits for it. Parallel workers share them through files in a directory of the run's:
    ``slot-N`` is taken by the worker that makes the N-th, ``making-NAME`` (its maker's pid
    inside) becomes ``ready-NAME`` (an error inside if the migration failed: its taker makes
    one of its own), which a module takes by renaming it (only one rename can win). A module
    that finds none ready and none coming makes its own. What nobody took (a module skipped,
    a run cut short) the run drops at its end, after the last worker
    (:func:`pytest_sessionfinish`).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory  # made by the first spare made ahead
        self._wanted: int | None = None
        self._known = threading.Event()

    def want(self, count: int) -> None:
        """The run's tests will take ``count`` keyspaces of their own (from the collection);
        at most ``MOST_AHEAD`` are made ahead, the rest on demand."""
        self._wanted = min(count, MOST_AHEAD)
        self._known.set()

    def make_ahead(self) -> None:
        """Make the spares the run will take, while no other worker makes them (blocks: a
        background thread's work)."""
        self._known.wait()
        self.directory.mkdir(parents=True, exist_ok=True)
        while (slot := self._claim_slot()) is not None:
            self._publish(slot)

    def _claim_slot(self) -> int | None:
        for n in range(self._wanted or 0):
            try:
                os.close(os.open(self.directory / f"slot-{n}", os.O_CREAT | os.O_EXCL))
            except (FileExistsError, FileNotFoundError):  # taken, or none are made ahead
                continue
            return n
        return None

    def _publish(self, slot: int) -> None:
        name = name_for("p", WORKER, run_pid())
        making = self.directory / f"making-{name}"
        writing = self.directory / f"writing-{name}"
        writing.write_text(str(os.getpid()))
        writing.rename(making)  # whole: a taker never reads a maker's pid half-written
        failed = ""
        try:
            asyncio.run(migrate(CassandraSettings(keyspace=name)))
        except Exception as exc:  # noqa: BLE001 - its taker makes one of its own instead
            failed = f"making spare keyspace {name} (slot {slot}) failed: {exc!r}"
        done = self.directory / f"done-{name}"
        done.write_text(failed)
        done.rename(self.directory / f"ready-{name}")  # whole, or not there yet
        making.unlink()

    async def take(self) -> CassandraSettings:
        """A migrated keyspace of the caller's own (made now if none is ready or coming)."""
        deadline = asyncio.get_running_loop().time() + 600
        while True:
            for ready in sorted(self.directory.glob("ready-*")):
                name = ready.name.removeprefix("ready-")
                taken = self.directory / f"taken-{name}"
                try:
                    ready.rename(taken)
                except FileNotFoundError:  # another worker took it first
                    continue
                if taken.read_text():  # its migration failed: made again below, or raises there
                    drop_later([name])
                    continue
                return CassandraSettings(keyspace=name)
            if not self._coming() or asyncio.get_running_loop().time() > deadline:
                self._claim_slot()  # one spare fewer to make ahead, if any was still to come
                settings = CassandraSettings(keyspace=name_for("p", WORKER, run_pid()))
                await migrate(settings)
                return settings
            await asyncio.sleep(0.2)

    def _coming(self) -> bool:
        """Whether a live worker makes a spare now (a dead one's never comes)."""
        for making in self.directory.glob("making-*"):
            with contextlib.suppress(FileNotFoundError):
                pid = making.read_text()
                if pid and keyspace_alive(int(pid)):  # written whole (``_publish``)
                    return True
        return False

    def leftovers(self) -> list[str]:
        """The spares nobody took, made or still being made, and the workers' own
        keyspaces (a worker that ran no test using its own never drops it)."""
        return sorted(
            {
                f.name.split("-", 1)[1]
                for f in (self.directory.iterdir() if self.directory.is_dir() else ())
                if f.name.startswith(("ready-", "making-", "done-", "own-"))
            }
        )

    def close(self) -> None:
        """Drop what nobody took (beside the run's end) and forget the directory."""
        drop_later(self.leftovers())
        shutil.rmtree(self.directory, ignore_errors=True)


#: The worker's own keyspace and pool, made when pytest starts (:func:`start_keyspaces`).
RUN_KEYSPACES = pytest.StashKey["RunKeyspaces"]()
#: The controller's copy of where its workers share the pool (:func:`pytest_configure_node`).
POOL_DIR = pytest.StashKey[Path]()


@dataclasses.dataclass
class RunKeyspaces:
    """This process's keyspace, its migration (under workers started when the worker starts,
    so it runs while the worker collects), and the pool of keyspaces of modules' own."""

    name: str
    pool: KeyspacePool
    migration: concurrent.futures.Future[None] | None = None


def start_keyspaces(config: pytest.Config) -> RunKeyspaces:
    """Name this process's keyspaces and, unless the run is of unit tests alone, start
    migrating its own, then the pool's spares, in a background thread (a daemon: a run never
    waits for it to end), so that the migration overlaps the collection. A serial run that
    needs none after all (``-k`` picked unit tests) drops it at its end
    (:func:`pytest_sessionfinish`)."""
    testrunuid = os.environ.get("PYTEST_XDIST_TESTRUNUID") if PARALLEL else None
    directory = pool_dir(testrunuid or f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
    run = RunKeyspaces(name_for("t", WORKER, run_pid()), KeyspacePool(directory))
    if _needs_keyspace(config):
        run.migration = concurrent.futures.Future()
        threading.Thread(target=_migrate_early, args=(run,), name="keyspaces", daemon=True).start()
    return run


def _needs_keyspace(config: pytest.Config) -> bool:
    """Whether the run may run tests that use Cassandra: not a listing (``--co``,
    ``--fixtures``, ``--markers``) nor a run of paths under tests/unit alone."""
    if config.option.collectonly or config.option.showfixtures or config.option.markers:
        return False
    units = (ROOT / "tests" / "unit").resolve()
    for arg in config.args:
        path = (config.invocation_params.dir / str(arg).split("::", 1)[0]).resolve()
        if not path.is_relative_to(units):
            return True
    return False


def _migrate_early(run: RunKeyspaces) -> None:
    assert run.migration is not None
    try:
        # Named where the controller drops what the run leaves (``KeyspacePool.close``).
        run.pool.directory.mkdir(parents=True, exist_ok=True)
        (run.pool.directory / f"own-{run.name}").touch()
        asyncio.run(migrate(CassandraSettings(keyspace=run.name)))
    except Exception as exc:  # noqa: BLE001 - the session's fixture migrates again, or fails
        run.migration.set_exception(exc)
        return
    run.migration.set_result(None)
    # After the worker's own: schema changes queue on one node.
    run.pool.make_ahead()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Tell the pool how many keyspaces of their own the collected tests take: one per group
    (:func:`group_of`) whose tests use it (a module's, or the browser stack's)."""
    run = session.config.stash.get(RUN_KEYSPACES, None)
    if run is not None:
        users = {
            group_of(item.nodeid)
            for item in session.items
            if "keyspace_pool" in getattr(item, "fixturenames", ())
        }
        run.pool.want(len(users))


@pytest.hookimpl(optionalhook=True)  # an xdist hook: a run without xdist has none
def pytest_configure_node(node: Any) -> None:
    """(The xdist controller) Remember where the workers share the pool, to drop at the end
    what they left in it."""
    node.config.stash[POOL_DIR] = pool_dir(node.workerinput["testrunuid"])


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the fixtures using them
def pytest_sessionfinish(session: pytest.Session) -> None:
    directory = session.config.stash.get(POOL_DIR, None)
    if directory is not None and directory.is_dir():  # the controller, after every worker
        KeyspacePool(directory).close()
    run = session.config.stash.get(RUN_KEYSPACES, None)
    if run is not None and not PARALLEL:  # a serial run: its own keyspace and its spares
        run.pool.close()


@pytest.fixture(scope="session")
def keyspace(services_up: None, pytestconfig: pytest.Config) -> Iterator[str]:
    """The keyspace of this process's tests (dropped after them, by a detached process)."""
    if WORKER in ("main", "gw0"):  # once a run: the runs that are gone leave nothing behind
        sweep_later()
    name = pytestconfig.stash[RUN_KEYSPACES].name
    yield name
    drop_later([name])


@pytest.fixture(scope="session")
def keyspace_pool(services_up: None, pytestconfig: pytest.Config) -> KeyspacePool:
    # What nobody took, the run drops at its end (:func:`pytest_sessionfinish`).
    return pytestconfig.stash[RUN_KEYSPACES].pool


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
        drop_later([settings.keyspace])  # beside the next tests: a drop takes seconds


@pytest.fixture(scope="session")
def cassandra_settings(keyspace: str) -> CassandraSettings:
    return CassandraSettings(keyspace=keyspace)


@pytest.fixture(scope="session")
async def migrated(
    cassandra_settings: CassandraSettings, pytestconfig: pytest.Config
) -> CassandraSettings:
    # Not through the keyspace_pool fixture: the tests that request that one are the pool's
    # takers, counted to know how many keyspaces to make ahead.
    run = pytestconfig.stash[RUN_KEYSPACES]
    if run.migration is not None:
        with contextlib.suppress(Exception):  # the services were not up yet: migrate now
            await asyncio.wrap_future(run.migration)
            return cassandra_settings
    await migrate(cassandra_settings)
    if PARALLEL:  # after the worker's own: schema changes queue on one node
        threading.Thread(target=run.pool.make_ahead, name="pool", daemon=True).start()
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


#: Unit tests handed out before the rest (between the workers), while each worker's keyspace is
#: still migrating: they need no service, and the modules that do would only wait (the rest of
#: the unit tests still come last, where they even out the workers' ends).
UNITS_FIRST = 800


def units_first(groups: list[str], count: int = UNITS_FIRST) -> list[str]:
    """``groups`` (in the order xdist would hand them out) with ``count`` groups of unit tests
    moved to the front."""
    first = [g for g in groups if g.startswith("tests/unit/")][:count]
    chosen = set(first)
    return first + [g for g in groups if g not in chosen]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` by :func:`group_of`. pytest-xdist 3.8 marks a group by renaming
    each test's node id, which pytest 9 ignores (``nodeid`` is read-only there): every test
    became a group of its own, so a module-scoped app was built on both workers. The work
    starts with some unit tests (:func:`units_first`)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class Groups(LoadScopeScheduling):  # type: ignore[misc]
        workqueue: OrderedDict[str, dict[str, bool]]
        reordered = False

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.reordered:  # the first hand-out: the queue is complete
                self.reordered = True
                queue = self.workqueue
                self.workqueue = OrderedDict((g, queue[g]) for g in units_first(list(queue)))
            super()._assign_work_unit(node)

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
