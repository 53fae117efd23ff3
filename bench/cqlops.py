"""Cassandra operations of a phase's window, per batch, from the node's ``system_views``.

A phase takes a :class:`Snapshot` before and after its window (:class:`OpsProbe`, the one
adapter here) and :func:`per_unit` (pure) turns the two into its operations per batch (or
per webhook post), so a regression in round trips shows at once.

What Cassandra 5.0 exposes, and what each figure is:

* ``round_trips``: requests on the client connections bound to the run's keyspace
  (``system_views.clients.request_count``): every statement, batch and LWT the services and
  the load's own processes sent, background loops included (they are the window's work too).
  The probe reads through a connection with no keyspace, so its own queries are not counted.
  A connection that closed during the window took its last requests with it: the figure is
  then null, with why.
* ``reads``, ``writes``, ``scans``: the bench keyspace's tables' ``count`` in
  ``coordinator_read_latency`` (one per partition read), ``coordinator_write_latency`` (one
  per write request per table it writes: a batch over three tables counts three, a batch
  within one table one) and ``coordinator_scan_latency`` (range reads). Only the run's keyspace
  is read: the machine is shared, and other keyspaces are other people's work.
* ``lwt``: conditional writes (``IF ...``, applied or not), which 5.0 counts in no virtual
  table of its own: each one's Paxos prepare reads the partition locally without a
  coordinator read, so they are ``local_read_latency`` minus ``coordinator_read_latency``,
  per table (a SERIAL read does count as a coordinator read: it is among ``reads``). That
  holds on one node with replication factor 1 (``deploy/local``, where ``make bench`` runs);
  on a cluster the local counts are one node's and the figure means nothing.

Checked against the local node: 10 inserts, 5 reads, 6 conditional writes (4 applied), 2
SERIAL reads, a logged batch over two tables, an unlogged one within one table and a scan
gave 27 round trips (the scan's statement prepared on first use: one more), reads 7,
writes 13, lwt 6, scans 1.

Batches have no counter of their own per keyspace (``system_views.batch_metrics`` holds
machine-wide histograms of partitions per batch, without counts): a batch is in ``writes``
once per table it touches, and in ``round_trips`` once.

Counters restart from zero when the node restarts: the node's gossip generation (its start
time) is part of a snapshot, and a window across a restart, or with any counter lower after
than before, gives null figures with why, never a negative number.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.infra.config import CassandraSettings
from shared.infra.db import Database

#: The ``system_views`` tables read per table of the keyspace, and what each count is here.
VIEWS = {
    "coordinator_read_latency": "reads",
    "coordinator_write_latency": "writes",
    "coordinator_scan_latency": "scans",
    "local_read_latency": "local_reads",
}
#: The figures per unit, in the order the summary prints them.
KINDS = ("round_trips", "reads", "writes", "lwt", "scans")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The keyspace's counters at one moment (plain data: :class:`OpsProbe` reads it)."""

    generations: Mapping[str, int]
    """Each node's gossip generation (its start time): a different one is a restart."""
    tables: Mapping[str, Mapping[str, int]]
    """Per table of the keyspace, each :data:`VIEWS` count."""
    connections: Mapping[str, int]
    """``request_count`` per client connection (``address:port``) bound to the keyspace."""


@dataclass(frozen=True, slots=True)
class Delta:
    """The operations between two snapshots; a figure is None when it cannot be known."""

    round_trips: int | None
    reads: int | None
    writes: int | None
    lwt: int | None
    scans: int | None
    per_table: Mapping[str, Mapping[str, int]]
    why: tuple[str, ...] = ()
    """Why a figure is None (empty when every figure is known)."""

    def totals(self) -> dict[str, int | None]:
        return {kind: getattr(self, kind) for kind in KINDS}


def _table_ops(counts: Mapping[str, int]) -> dict[str, int]:
    reads = counts.get("reads", 0)
    return {
        "reads": reads,
        "writes": counts.get("writes", 0),
        "lwt": max(0, counts.get("local_reads", 0) - reads),
        "scans": counts.get("scans", 0),
    }


def _restart(before: Snapshot, after: Snapshot) -> str | None:
    for node, generation in before.generations.items():
        later = after.generations.get(node)
        if later is not None and later != generation:
            return (
                f"node {node} restarted during the window (gossip generation {generation} -> "
                f"{later}): its counters started again from zero"
            )
    return None


def _backwards(before: Snapshot, after: Snapshot) -> str | None:
    for table, counts in sorted(before.tables.items()):
        later = after.tables.get(table)
        if later is None:
            return f"table {table} left the counters during the window (dropped, or a restart)"
        for view, count in counts.items():
            if later.get(view, 0) < count:
                return (
                    f"{table}'s {view} count went back from {count} to {later.get(view, 0)} "
                    "(a restarted node's counters start again from zero)"
                )
    return None


def _round_trips(before: Snapshot, after: Snapshot) -> tuple[int | None, str | None]:
    closed = sorted(
        conn
        for conn, count in before.connections.items()
        if conn not in after.connections or after.connections[conn] < count
    )
    if closed:
        return None, (
            f"{len(closed)} client connection(s) of the keyspace closed during the window "
            f"({', '.join(closed[:3])}{', ...' if len(closed) > 3 else ''}): their last "
            "requests are not in any counter"
        )
    total = sum(
        count - before.connections.get(conn, 0) for conn, count in after.connections.items()
    )
    return total, None


def delta(before: Snapshot, after: Snapshot) -> Delta:
    """The operations between ``before`` and ``after`` (pure); figures a restart or a closed
    connection makes unknowable are None, with why."""
    reset = _restart(before, after) or _backwards(before, after)
    if reset is not None:
        return Delta(None, None, None, None, None, {}, (reset,))
    per_table: dict[str, dict[str, int]] = {}
    for table, counts in after.tables.items():
        earlier = before.tables.get(table, {})
        ops = _table_ops({view: count - earlier.get(view, 0) for view, count in counts.items()})
        if any(ops.values()):
            per_table[table] = ops
    round_trips, why = _round_trips(before, after)
    return Delta(
        round_trips=round_trips,
        reads=sum(t["reads"] for t in per_table.values()),
        writes=sum(t["writes"] for t in per_table.values()),
        lwt=sum(t["lwt"] for t in per_table.values()),
        scans=sum(t["scans"] for t in per_table.values()),
        per_table=dict(sorted(per_table.items())),
        why=() if why is None else (why,),
    )


def per_unit(
    before: Snapshot | None, after: Snapshot | None, units: int, unit: str = "batch"
) -> dict[str, Any]:
    """A phase's ``cassandra_ops_per_batch`` (pure): each figure of :data:`KINDS` divided by
    the ``units`` (batches, or webhook posts) of the window, its totals and its tables';
    a figure is None, and ``why`` says why, when it cannot be known."""
    out: dict[str, Any] = {"unit": unit, "units": units}
    if before is None or after is None:
        out.update(dict.fromkeys(KINDS), why=["system_views could not be read"])
        return out
    d = delta(before, after)
    why = list(d.why)
    if units <= 0:
        why.append(f"no {unit} in the window")
    for kind, total in d.totals().items():
        out[kind] = None if total is None or units <= 0 else round(total / units, 2)
    out["totals"] = d.totals()
    out["per_table"] = {t: dict(ops) for t, ops in d.per_table.items()}
    if why:
        out["why"] = why
    return out


def summary(ops: Mapping[str, Any] | None) -> str:
    """One phase's figures as the summary prints them (``6.0 round trips per batch (reads
    1.0, writes 3.0, lwt 2.0, scans 0.0; 100 batches)``), or ``n/a`` and why."""
    if not ops:
        return "not measured"
    if ops.get("round_trips") is None and ops.get("reads") is None:
        return "n/a: " + "; ".join(ops.get("why") or ["not measured"])
    rt = "?" if ops.get("round_trips") is None else f"{ops['round_trips']:,.1f}"
    parts = [f"{ops[k]:,.1f}" if ops.get(k) is not None else "?" for k in KINDS[1:]]
    unit = str(ops["unit"])
    plural = unit + ("es" if unit.endswith("ch") else "s")
    text = (
        f"{rt} round trips per {unit} (reads {parts[0]}, writes {parts[1]}, lwt {parts[2]}, "
        f"scans {parts[3]}; {ops['units']:,} {plural})"
    )
    if ops.get("why"):
        text += " [" + "; ".join(ops["why"]) + "]"
    return text


class OpsProbe:
    """Reads :class:`Snapshot` s of one keyspace through a connection bound to no keyspace
    (so that its own queries are not among the keyspace's round trips)."""

    def __init__(self, db: Database, keyspace: str) -> None:
        self.db = db
        self.keyspace = keyspace

    @classmethod
    async def connect(cls, settings: CassandraSettings, keyspace: str) -> OpsProbe:
        return cls(await Database.connect(settings), keyspace)

    async def close(self) -> None:
        await self.db.close()

    async def snapshot(self) -> Snapshot | None:
        """The keyspace's counters now; None when ``system_views`` cannot be read (the
        figures are then null, the phase goes on)."""
        try:
            return await self._read()
        except Exception:  # noqa: BLE001 - a figure missing must not fail a phase
            return None

    async def settled(self, quiet: float = 0.5, limit: float = 3.0) -> Snapshot | None:
        """A snapshot once the keyspace's round trips stop moving for ``quiet`` s (at most
        ``limit`` s): work that trails a window's end (the last chunk's rows written after the
        provider accepted it) belongs to the window."""
        deadline = time.monotonic() + limit
        last = await self.snapshot()
        while last is not None and time.monotonic() < deadline:
            await asyncio.sleep(quiet)
            now = await self.snapshot()
            if now is None or now.connections == last.connections:
                return now or last
            last = now
        return last

    async def _read(self) -> Snapshot:
        tables: dict[str, dict[str, int]] = {}
        for view, name in VIEWS.items():
            rows = await self.db.rows(
                # The view is one of VIEWS, never input.
                f"SELECT table_name, count FROM system_views.{view} WHERE keyspace_name = ?",  # noqa: S608
                (self.keyspace,),
            )
            for row in rows:
                tables.setdefault(row["table_name"], {})[name] = int(row["count"])
        clients = await self.db.rows(
            "SELECT address, port, keyspace_name, request_count FROM system_views.clients"
        )
        connections = {
            f"{row['address']}:{row['port']}": int(row["request_count"])
            for row in clients
            if row["keyspace_name"] == self.keyspace
        }
        gossip = await self.db.rows(
            "SELECT address, port, generation FROM system_views.gossip_info"
        )
        generations = {f"{row['address']}:{row['port']}": int(row["generation"]) for row in gossip}
        return Snapshot(generations=generations, tables=tables, connections=connections)
