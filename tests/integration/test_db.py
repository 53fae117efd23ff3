"""The Cassandra adapter against the real server: what it does when a node forgot a batch's
prepared statement, and how it reports a lightweight transaction whose outcome is unknown."""

from __future__ import annotations

import copy
import os
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from cassandra.protocol import ErrorMessage
from cassandra.query import BoundStatement
from cassandra.util import uuid_from_time

from shared.core.errors import DependencyUnavailable
from shared.infra.config import CassandraSettings
from shared.infra.db import Database, ReplicaRetryPolicy
from tests.conftest import unique

_INSERT = (
    "INSERT INTO outbox_minutes (namespace, minute, shard, batch_id, user_id, published) "
    "VALUES (?, ?, ?, ?, ?, false)"
)


async def test_a_batch_whose_statement_no_node_knows_is_prepared_again_and_applied(
    db: Database,
) -> None:
    # An id neither the nodes nor the driver know: what a batch meets when a node restarted
    # without its prepared statements and the driver's lookup by the reported id misses.
    forgotten = copy.copy(await db.prepare(_INSERT))
    forgotten.query_id = os.urandom(16)
    namespace, minute = unique("ns"), datetime.now(UTC).replace(second=0, microsecond=0)
    batch_id = uuid_from_time(datetime.now(UTC))

    await db.batch([forgotten.bind((namespace, minute, 0, batch_id, uuid.uuid4()))])

    row = await db.one(
        "SELECT batch_id FROM outbox_minutes WHERE namespace = ? AND minute = ? AND shard = 0",
        (namespace, minute),
    )
    assert row is not None and row["batch_id"] == batch_id


async def _bound(db: Database) -> BoundStatement:
    values = (unique("ns"), datetime.now(UTC), 0, uuid_from_time(datetime.now(UTC)), None)
    return (await db.prepare(_INSERT)).bind(values)


class _Failing:
    """A session whose every request fails with one server error (the server cannot be made to
    answer CAS_WRITE_UNKNOWN on demand: it needs a Paxos round cut short between replicas)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def execute_async(self, *_: Any, **__: Any) -> _Failing:
        return self

    def add_callbacks(self, _ok: Any, on_err: Any) -> None:
        on_err(self.error)


async def test_a_cas_write_of_unknown_outcome_is_a_dependency_outage(db: Database) -> None:
    unknown = ErrorMessage(0x1700, "CAS operation result is unknown - proposal accepted by 1", None)
    failing = Database(db.cluster, _Failing(unknown), db.keyspace)

    with pytest.raises(DependencyUnavailable):
        await failing.execute(await _bound(db))


async def test_other_server_errors_stay_loud(db: Database) -> None:
    invalid = ErrorMessage(0x2200, "Invalid query", None)
    failing = Database(db.cluster, _Failing(invalid), db.keyspace)

    with pytest.raises(ErrorMessage):
        await failing.execute(await _bound(db))


async def test_reads_writes_lwts_and_batches_run_under_the_replica_retry_settings(
    db: Database,
) -> None:
    """With speculative execution, the replica retry policy and short heartbeats, every kind of
    statement still runs: an LWT applies once and a repeat reads "not applied"."""
    namespace, minute = unique("ns"), datetime.now(UTC).replace(second=0, microsecond=0)
    key = (namespace, minute, 0, uuid_from_time(datetime.now(UTC)), uuid.uuid4())
    lwt = _INSERT + " IF NOT EXISTS"
    select = "SELECT batch_id FROM outbox_minutes WHERE namespace = ? AND minute = ? AND shard = ?"

    first = await db.one(lwt, key)
    again = await db.one(lwt, key)
    serial = await db.one(select, (namespace, minute, 0), serial=True)
    await db.execute(_INSERT, (namespace, minute, 1, key[3], key[4]), idempotent=True)
    await db.batch([(await db.prepare(_INSERT)).bind((namespace, minute, 2, key[3], key[4]))])
    written = [await db.one(select, (namespace, minute, shard)) for shard in (1, 2)]

    profile = db.cluster.profile_manager.default
    assert isinstance(profile.retry_policy, ReplicaRetryPolicy)
    assert profile.speculative_execution_policy is not None
    assert first is not None and first["[applied]"] is True
    assert again is not None and again["[applied]"] is False
    assert serial is not None and serial["batch_id"] == key[3]
    assert [key[3], key[3]] == [row["batch_id"] if row else None for row in written]


async def test_the_control_connection_waits_as_long_as_a_request(
    migrated: CassandraSettings,
) -> None:
    """Connecting reads the nodes and the whole schema over the control connection: those
    queries get ``request_timeout``, not the driver's 2 s (a suite's CLI once failed to
    connect, NoHostAvailable, while parallel tests were creating keyspaces)."""
    settings = migrated.model_copy(update={"request_timeout": 7.5})
    db = await Database.connect(settings, keyspace=settings.keyspace)
    try:
        assert db.cluster.control_connection_timeout == 7.5
        assert await db.one("SELECT release_version FROM system.local") is not None
    finally:
        await db.close()
