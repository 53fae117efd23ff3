"""The test run's keyspaces: their names, which ones a gone run left, and dropping them away
from the run.

A test run makes a keyspace per worker and one per module that needs its own
(tests/conftest.py). Dropping one takes seconds, so a run hands its drops to a detached process
(``python -m tests.keyspaces drop NAME...``) and ends at once. What a run could not drop (it
was killed, or a drop failed) a later run's sweep drops (``python -m tests.keyspaces sweep``):
a keyspace whose run is gone, or any test keyspace older than a run can last. So nothing piles
up in Cassandra, and no run waits for a drop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: A test keyspace: ``t`` (a worker's) or ``p`` (a module's own, from the pool), the worker,
#: the pid of the run that made it (older runs named none), and a random part.
NAME = re.compile(r"^[tp]_(?:gw\d+|main)_(?:(?P<pid>\d+)_)?[0-9a-f]{8,10}$")
#: Older than this, a test keyspace is a leftover whatever its name says (``make test`` takes
#: minutes, and every test has a two-minute timeout).
LONGEST_RUN = timedelta(hours=2)
#: A keyspace whose run is gone is left alone this long: its maker may live in another pid
#: namespace sharing the node, where it would look gone from here.
GRACE = timedelta(minutes=10)
#: The day a version 1 UUID's clock counts from, in 100 ns steps.
_UUID_EPOCH = datetime(1582, 10, 15, tzinfo=UTC)


def name_for(kind: str, worker: str, run_pid: int) -> str:
    """A new keyspace name (``kind`` is ``t`` or ``p``) naming the run's process."""
    return f"{kind}_{worker}_{run_pid}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class Found:
    """A keyspace on the node, and when its oldest table was made (``None``: no table yet)."""

    name: str
    created: datetime | None


def created_at(table_id: uuid.UUID) -> datetime | None:
    """When a table was made: Cassandra's table ids are time (version 1) UUIDs."""
    if table_id.version != 1:
        return None
    return _UUID_EPOCH + timedelta(microseconds=table_id.time // 10)


def stale(found: Found, now: datetime, alive: Callable[[int], bool]) -> bool:
    """Whether ``found`` is a test keyspace some gone run left behind."""
    match = NAME.match(found.name)
    if match is None:
        return False
    if found.created is None:
        return False  # no table yet: being made right now (an empty leftover costs nothing)
    age = now - found.created
    if age > LONGEST_RUN:
        return True
    pid = match["pid"]
    if pid is None or alive(int(pid)):
        return False
    return age > GRACE


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def drop_later(names: Iterable[str]) -> None:
    """Drop ``names`` from a detached process: the caller never waits for it (a leftover is
    swept by a later run)."""
    names = list(names)
    if names:
        _detached("drop", *names)


def sweep_later() -> None:
    """Drop, from a detached process, the test keyspaces gone runs left behind."""
    _detached("sweep")


def _detached(*args: str) -> None:
    # The shell starts the work in the background and exits: it is reaped here at once, and
    # the work, in a session of its own, outlives the run without being anyone's child.
    shell = ["/bin/sh", "-c", '"$@" </dev/null >/dev/null 2>&1 &', "sh"]
    subprocess.run(
        [*shell, sys.executable, "-m", "tests.keyspaces", *args],
        cwd=ROOT,
        # Not measured: a coverage run may have combined its data before the work ends.
        env={k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE_", "COV_"))},
        start_new_session=True,
        check=False,
        timeout=30,
    )


async def _drop(names: Iterable[str]) -> None:
    from shared.infra.config import CassandraSettings
    from shared.infra.db import Database

    db = await Database.connect(CassandraSettings())
    try:
        for name in names:
            if NAME.match(name) is None:  # only ever a test keyspace
                continue
            # Best effort: what fails here, a later run's sweep drops.
            with contextlib.suppress(Exception):
                await db.execute(f"DROP KEYSPACE IF EXISTS {name}", prepare=False, timeout=120)
    finally:
        await db.close()


async def _found() -> list[Found]:
    from shared.infra.config import CassandraSettings
    from shared.infra.db import Database

    db = await Database.connect(CassandraSettings())
    try:
        names = [r["keyspace_name"] for r in await db.rows(
            "SELECT keyspace_name FROM system_schema.keyspaces"
        )]  # fmt: skip
        # Every page: a node holding a backlog of keyspaces has more tables than one page.
        tables = await db.all_pages("SELECT keyspace_name, id FROM system_schema.tables")
    finally:
        await db.close()
    oldest: dict[str, datetime] = {}
    for row in tables:
        made = created_at(row["id"])
        name = row["keyspace_name"]
        if made is not None and (name not in oldest or made < oldest[name]):
            oldest[name] = made
    return [Found(name, oldest.get(name)) for name in names]


async def _sweep() -> None:
    now = datetime.now(UTC)
    await _drop(f.name for f in await _found() if stale(f, now, alive))


def main(argv: list[str]) -> None:
    command, *names = argv
    if command == "drop":
        asyncio.run(_drop(names))
    elif command == "sweep":
        asyncio.run(_sweep())
    else:
        raise SystemExit(f"usage: python -m tests.keyspaces drop NAME... | sweep (not {command})")


if __name__ == "__main__":
    main(sys.argv[1:])
