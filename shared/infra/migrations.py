"""Versioned CQL migrations: discovery (pure) and application (against Cassandra).

Migration files are ``NNNN_name.cql`` in ``deploy/cql``; statements end with ``;`` at the end
of a line. Applied versions are recorded in ``schema_migrations`` with a checksum. A
lightweight-transaction lock makes concurrent ``safedelivr migrate`` runs safe: one applies,
the others wait and then find nothing left to do. Every statement is ``IF NOT EXISTS`` style,
so a run interrupted half-way can simply be repeated.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from shared.core.errors import DependencyUnavailable
from shared.infra.config import CassandraSettings
from shared.infra.db import Database

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.cql$")
#: Seconds a migration lock lives if its holder dies mid-way.
LOCK_TTL = 300
#: Seconds one schema statement or lock round may take: a node busy with other keyspaces'
#: schema changes answers a DDL or a Paxos round in tens of seconds, not the usual 10.
SCHEMA_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    checksum: str


def migrations_dir() -> Path:
    """``deploy/cql`` in a source checkout, or the copy packaged inside ``shared``."""
    packaged = Path(__file__).with_name("cql")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "deploy" / "cql"


def split_statements(text: str) -> tuple[str, ...]:
    """Split a CQL file into statements, dropping ``--`` comment lines."""
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("--")]
    chunks = re.split(r";\s*$", "\n".join(lines), flags=re.MULTILINE)
    return tuple(c.strip() for c in chunks if c.strip())


def discover(directory: Path) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.cql")):
        match = _NAME.match(path.name)
        if not match:
            raise ValueError(f"migration file name must be NNNN_name.cql: {path.name}")
        text = path.read_text(encoding="utf-8")
        found.append(
            Migration(
                int(match.group(1)),
                match.group(2),
                split_statements(text),
                hashlib.sha256(text.encode()).hexdigest(),
            )
        )
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError("two migrations share a version number")
    return found


async def migrate(settings: CassandraSettings, *, directory: Path | None = None) -> list[int]:
    """Create the keyspace and apply pending migrations; return the versions applied now."""
    pending = discover(directory or migrations_dir())
    db = await Database.connect(settings)
    try:
        ks = settings.keyspace
        await db.execute(
            f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {settings.replication}",
            prepare=False,
            timeout=SCHEMA_TIMEOUT,
        )
        await db.execute(
            f"CREATE TABLE IF NOT EXISTS {ks}.schema_migrations "
            "(version int PRIMARY KEY, name text, checksum text, applied_at timestamp)",
            prepare=False,
            timeout=SCHEMA_TIMEOUT,
        )
        await db.execute(
            f"CREATE TABLE IF NOT EXISTS {ks}.schema_lock (name text PRIMARY KEY, owner uuid)",
            prepare=False,
            timeout=SCHEMA_TIMEOUT,
        )
        await asyncio.to_thread(db.session.set_keyspace, ks)
        owner = uuid.uuid4()
        try:
            # Inside the try: a round that timed out may have taken the lock (the release
            # deletes it only when the owner is ours).
            await _acquire(db, owner)
            return await _apply(db, pending, owner)
        finally:
            await _release(db, owner)
    finally:
        await db.close()


async def _acquire(db: Database, owner: uuid.UUID, *, wait: float = 120.0) -> None:
    """Take the lock, or wait for it. A round that timed out may still have applied: the next
    round then finds the lock held by ``owner`` itself, which is ours."""
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        try:
            row = await db.one(
                "INSERT INTO schema_lock (name, owner) VALUES ('migrate', ?) "
                "IF NOT EXISTS USING TTL ?",
                (owner, LOCK_TTL),
                timeout=SCHEMA_TIMEOUT,
            )
        except DependencyUnavailable as exc:  # a timed-out round: its outcome is unknown
            log.warning("the schema lock's round did not answer (%s); asking again", exc)
            row = None
        if row and (row.get("[applied]") or row.get("owner") == owner):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("another migration holds the schema lock")
        await asyncio.sleep(0.5)


class LockLost(RuntimeError):
    """The schema lock expired during a run and is no longer this run's: it stops before
    its next migration (every statement is idempotent, so running ``migrate`` again is safe)."""


async def _renew(db: Database, owner: uuid.UUID, *, tries: int = 3) -> None:
    """Hold the lock for another ``LOCK_TTL`` before a migration, so a slow run (statements
    may take ``SCHEMA_TIMEOUT`` each) never outlives it while another run takes it over."""
    for _ in range(tries):
        try:
            row = await db.one(
                "UPDATE schema_lock USING TTL ? SET owner = ? WHERE name = 'migrate' IF owner = ?",
                (LOCK_TTL, owner, owner),
                timeout=SCHEMA_TIMEOUT,
            )
        except DependencyUnavailable as exc:  # unknown outcome: ask again (it is idempotent)
            log.warning("the schema lock's renewal did not answer (%s); asking again", exc)
            continue
        if row and row.get("[applied]"):
            return
        raise LockLost("the schema lock expired and is no longer this run's")
    raise LockLost("the schema lock could not be renewed")


async def _release(db: Database, owner: uuid.UUID, *, tries: int = 3) -> None:
    """Give the lock back; if no round answers, its TTL frees it (``LOCK_TTL``)."""
    for _ in range(tries):
        try:
            await db.execute(
                "DELETE FROM schema_lock WHERE name = 'migrate' IF owner = ?",
                (owner,),
                timeout=SCHEMA_TIMEOUT,
            )
            return
        except DependencyUnavailable as exc:
            log.warning("the schema lock's release did not answer (%s); trying again", exc)
    log.warning("the schema lock was not released; it expires in %d s", LOCK_TTL)


async def _apply(db: Database, pending: list[Migration], owner: uuid.UUID) -> list[int]:
    """Apply what ``schema_migrations`` does not record, renewing ``owner``'s lock first."""
    applied_rows = await db.rows("SELECT version, checksum FROM schema_migrations")
    applied = {r["version"]: r["checksum"] for r in applied_rows}
    done = []
    for m in pending:
        if m.version in applied:
            if applied[m.version] != m.checksum:
                log.warning("migration %04d_%s changed after it was applied", m.version, m.name)
            continue
        await _renew(db, owner)
        log.info("applying migration %04d_%s", m.version, m.name)
        for statement in m.statements:
            await db.execute(statement, prepare=False, timeout=SCHEMA_TIMEOUT)
        await db.execute(
            "INSERT INTO schema_migrations (version, name, checksum, applied_at) "
            "VALUES (?, ?, ?, ?)",
            (m.version, m.name, m.checksum, datetime.now(UTC)),
        )
        done.append(m.version)
    return done


class LayoutMismatch(RuntimeError):
    """The configured bucket count is not the one the keyspace's stats were written with."""


async def fix_layout(db: Database, buckets: int) -> None:
    """Record the stats bucket count in the keyspace the first time, and refuse another one
    after that (a recipient's bucket must never move, or its outcome would count twice)."""
    row = await db.one(
        "INSERT INTO layout (name, value) VALUES ('stats_buckets', ?) IF NOT EXISTS", (buckets,)
    )
    recorded = buckets if row is None or row.get("[applied]") else row.get("value")
    if recorded != buckets:
        raise LayoutMismatch(
            f"SAFEDELIVR_STATS_BUCKETS is {buckets} but this keyspace's stats were written "
            f"with {recorded} buckets; set it back to {recorded}"
        )
