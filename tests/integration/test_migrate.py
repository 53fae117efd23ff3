"""Migrations against the real Cassandra."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from shared.infra.config import CassandraSettings
from shared.infra.db import Database
from shared.infra.migrations import LockLost, _apply, discover, migrate
from tests.conftest import unique


async def test_migrate_twice_and_concurrently_applies_each_version_once(
    services_up: None, tmp_path: Path
) -> None:
    """Three concurrent runs then a fourth: every version recorded once, nothing re-applied.
    Over three small migrations of its own: the real ones (applied to every keyspace the
    suite migrates, so any that fails fails the suite) took 20 s of schema changes here."""
    settings = CassandraSettings(keyspace=unique("m"))
    for version, table in enumerate(("one", "two", "three"), start=1):
        (tmp_path / f"{version:04d}_{table}.cql").write_text(
            f"CREATE TABLE {table} (k int PRIMARY KEY);\n"  # applied twice, it would fail
        )
    versions = [m.version for m in discover(tmp_path)]
    try:
        results = await asyncio.gather(*(migrate(settings, directory=tmp_path) for _ in range(3)))
        again = await migrate(settings, directory=tmp_path)

        assert versions == [1, 2, 3]
        assert sorted(v for r in results for v in r) == versions
        assert again == []
        db = await Database.connect(settings, keyspace=settings.keyspace)
        try:
            rows = await db.rows("SELECT version FROM schema_migrations")
            tables = await db.rows(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?",
                (settings.keyspace,),
            )
        finally:
            await db.close()
        assert sorted(r["version"] for r in rows) == versions
        assert {"one", "two", "three"} <= {t["table_name"] for t in tables}
    finally:
        db = await Database.connect(settings)
        await db.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", prepare=False, timeout=60)
        await db.close()


async def test_a_run_whose_lock_another_run_took_over_applies_nothing_more(
    services_up: None, tmp_path: Path
) -> None:
    """A slow run's lock expired and another run holds it now: the slow run stops before its
    next migration instead of applying it beside the other."""
    settings = CassandraSettings(keyspace=unique("m"))
    (tmp_path / "0001_one.cql").write_text("CREATE TABLE IF NOT EXISTS one (k int PRIMARY KEY);\n")
    try:
        assert await migrate(settings, directory=tmp_path) == [1]
        (tmp_path / "0002_two.cql").write_text(
            "CREATE TABLE IF NOT EXISTS two (k int PRIMARY KEY);\n"
        )
        db = await Database.connect(settings, keyspace=settings.keyspace)
        try:
            await db.execute(
                "INSERT INTO schema_lock (name, owner) VALUES ('migrate', ?) USING TTL 60",
                (uuid.uuid4(),),  # the run that took the lock over
            )

            with pytest.raises(LockLost):
                await _apply(db, discover(tmp_path), uuid.uuid4())

            rows = await db.rows("SELECT version FROM schema_migrations")
        finally:
            await db.close()
        assert [r["version"] for r in rows] == [1]
    finally:
        db = await Database.connect(settings)
        await db.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", prepare=False, timeout=60)
        await db.close()
