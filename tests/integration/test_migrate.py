"""Migrations against the real Cassandra."""

from __future__ import annotations

import asyncio

from shared.infra.config import CassandraSettings
from shared.infra.db import Database
from shared.infra.migrations import discover, migrate, migrations_dir
from tests.conftest import unique


async def test_migrate_twice_and_concurrently_applies_each_version_once(services_up: None) -> None:
    """Three concurrent runs then a fourth: every version recorded once, nothing re-applied."""
    settings = CassandraSettings(keyspace=unique("m"))
    versions = [m.version for m in discover(migrations_dir())]
    try:
        results = await asyncio.gather(*(migrate(settings) for _ in range(3)))
        again = await migrate(settings)

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
        assert {"batches", "chunk_attempts", "api_keys"} <= {t["table_name"] for t in tables}
    finally:
        db = await Database.connect(settings)
        await db.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", prepare=False, timeout=60)
        await db.close()
