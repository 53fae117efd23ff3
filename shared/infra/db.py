"""Cassandra adapter: cluster session, prepared statements, and driver futures bridged to asyncio.

The driver runs its own I/O thread (libev when available); :meth:`Database.execute` hands the
driver's ``ResponseFuture`` callbacks back to the event loop with ``call_soon_threadsafe`` so
no coroutine ever blocks. Driver exceptions become
:class:`~shared.core.errors.DependencyUnavailable` here, at the boundary, and so does the server's
"CAS operation result is unknown" (protocol v5 error 0x1700, which the driver does not know): like a
CAS write timeout, the caller re-reads. A request Cassandra refuses for its size (a batch past
``batch_size_fail_threshold``, a mutation past ``max_mutation_size``) becomes
:class:`~shared.core.errors.TooLargeToStore`: the same request would be refused again, so it is no
outage.

A batch of prepared statements that a node no longer knows is re-prepared here: the driver
re-prepares single statements itself, but for a batch it looks the statement up by the id the
node reports and, when that lookup misses, fails inside its own callback (``AttributeError:
'bytes' object has no attribute 'encode'``, seen after a node of a 3-node cluster was killed
under load). Left alone, every retry of that batch failed the same way.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import socket
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, overload

from cassandra import ConsistencyLevel, OperationTimedOut, RequestExecutionException
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    Session,
)
from cassandra.connection import ConnectionException
from cassandra.policies import (
    ConstantSpeculativeExecutionPolicy,
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    RetryPolicy,
    TokenAwarePolicy,
)
from cassandra.protocol import (
    ErrorMessage,
    IsBootstrappingErrorMessage,
    OverloadedErrorMessage,
    PreparedQueryNotFound,
)
from cassandra.query import (
    BatchStatement,
    BatchType,
    BoundStatement,
    PreparedStatement,
    SimpleStatement,
    Statement,
    dict_factory,
)

from shared.core.errors import DependencyUnavailable, TooLargeToStore
from shared.infra import idempotence
from shared.infra.config import CassandraSettings

log = logging.getLogger(__name__)

Row = dict[str, Any]

#: Driver errors that mean "Cassandra is unreachable or overloaded right now" (a 503), as
#: opposed to errors in our statements (invalid queries are bugs and stay loud).
_OUTAGE: tuple[type[BaseException], ...] = (
    NoHostAvailable,
    ConnectionException,
    OperationTimedOut,
    RequestExecutionException,
    OSError,
)
#: Protocol v5 CAS_WRITE_UNKNOWN: a lightweight transaction may or may not have applied.
_CAS_WRITE_UNKNOWN = 0x1700
#: What Cassandra's refusals of a request for its size say (``_refused_for_size``).
_SIZE_REFUSALS = (
    "Batch too large",
    "oversized mutation",
    "is too large for the maximum size",
    "exceeds allowed maximum",
)
Params = Sequence[Any] | Mapping[str, Any] | None
#: Tries of a repeatable statement after the first: on each other replica of RF=3 once.
_NEXT_HOST_RETRIES = 2
#: Speculative executions of a slow repeatable statement: one more replica, not all.
_SPECULATIVE_EXECUTIONS = 1


class ReplicaRetryPolicy(RetryPolicy):  # type: ignore[misc]  # the driver is untyped
    """Retries what may run twice on the next replica, and nothing else.

    A repeatable statement (``Statement.is_idempotent``, decided by :mod:`shared.infra.idempotence`)
    that timed out, found too few replicas alive, or lost its connection is sent to the next
    host of its plan, up to :data:`_NEXT_HOST_RETRIES` times: a restarting node costs a retry,
    not the request. Any statement refused before it ran (too few replicas, an overloaded or
    bootstrapping coordinator) is tried once on the next host: nothing was applied. The rest,
    lightweight transactions above all, fail to the caller, which resolves an unknown outcome
    by a SERIAL read. (The driver's default policy re-sends *any* statement whose connection
    broke, LWTs included: a repeat of an applied claim would then read "not applied".)
    """

    def on_read_timeout(
        self,
        query: Statement,
        consistency: int,
        required_responses: int,
        received_responses: int,
        data_retrieved: bool,
        retry_num: int,
    ) -> tuple[int, int | None]:
        if query.is_idempotent:
            return self._next_host(retry_num)
        return self.RETHROW, None

    def on_write_timeout(
        self,
        query: Statement,
        consistency: int,
        write_type: int,
        required_responses: int,
        received_responses: int,
        retry_num: int,
    ) -> tuple[int, int | None]:
        if query.is_idempotent:
            return self._next_host(retry_num)
        return self.RETHROW, None

    def on_unavailable(
        self,
        query: Statement,
        consistency: int,
        required_replicas: int,
        alive_replicas: int,
        retry_num: int,
    ) -> tuple[int, int | None]:
        if query.is_idempotent:
            return self._next_host(retry_num)
        return (self.RETRY_NEXT_HOST, None) if retry_num == 0 else (self.RETHROW, None)

    def on_request_error(
        self, query: Statement, consistency: int | None, error: BaseException, retry_num: int
    ) -> tuple[int, int | None]:
        if query.is_idempotent:
            return self._next_host(retry_num)
        if retry_num == 0 and isinstance(
            error, (OverloadedErrorMessage, IsBootstrappingErrorMessage)
        ):
            return self.RETRY_NEXT_HOST, None
        return self.RETHROW, None

    def _next_host(self, retry_num: int) -> tuple[int, int | None]:
        if retry_num < _NEXT_HOST_RETRIES:
            return self.RETRY_NEXT_HOST, None
        return self.RETHROW, None


def mark_repeatable(stmt: Statement, *, marked: bool, serial: bool = False) -> None:
    """Set ``stmt.is_idempotent`` from what it does (:func:`idempotence.repeatable`): the
    driver retries and speculatively runs only statements so marked."""
    stmt.is_idempotent = idempotence.repeatable(_cql(stmt), marked=marked, serial=serial)


@overload
def utc(value: datetime) -> datetime: ...
@overload
def utc(value: None) -> None: ...
def utc(value: datetime | None) -> datetime | None:
    """A timestamp as read from Cassandra (the driver gives naive datetimes, in UTC) made
    aware; an aware one is returned as it is."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Page:
    """One page of rows and the opaque driver state to fetch the next (None when done)."""

    rows: list[Row]
    paging_state: bytes | None


def _connection_class() -> Any:
    try:
        from cassandra.io.libevreactor import LibevConnection
    except ImportError:  # pragma: no cover - wheels ship libev on Linux
        from cassandra.io.asyncioreactor import AsyncioConnection

        return AsyncioConnection
    return LibevConnection


class Database:
    """A connected session bound to one keyspace (or none, for migrations)."""

    def __init__(self, cluster: Cluster, session: Session, keyspace: str | None) -> None:
        self.cluster = cluster
        self.session = session
        self.keyspace = keyspace
        self._prepared: dict[str, PreparedStatement] = {}

    @classmethod
    async def connect(cls, settings: CassandraSettings, *, keyspace: str | None = None) -> Database:
        """Open a session; ``keyspace`` defaults to none so migrations can create it."""
        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(
                DCAwareRoundRobinPolicy(local_dc=settings.local_dc)
            ),
            retry_policy=ReplicaRetryPolicy(),
            consistency_level=ConsistencyLevel.LOCAL_QUORUM,
            serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
            request_timeout=settings.request_timeout,
            row_factory=dict_factory,
            # A repeatable statement still unanswered after the delay also goes to the next
            # replica, and the first answer wins: a node that stalls (restarting, in a long
            # GC pause) costs the delay, not the request timeout. Only statements marked
            # idempotent are ever run twice (the driver checks).
            speculative_execution_policy=(
                ConstantSpeculativeExecutionPolicy(
                    settings.speculative_delay, _SPECULATIVE_EXECUTIONS
                )
                if settings.speculative_delay > 0
                else None
            ),
        )
        auth = None
        if settings.username and settings.password:
            auth = PlainTextAuthProvider(settings.username, settings.password.get_secret_value())
        cluster = Cluster(
            settings.contact_points,
            port=settings.port,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            connection_class=_connection_class(),
            connect_timeout=settings.connect_timeout,
            # The control connection's own queries (the nodes, the whole schema) get a request's
            # time, not the driver's 2 s: on a node busy with schema changes (a suite creating
            # keyspaces, a migration) reading the schema took longer, and connecting failed with
            # NoHostAvailable although the node was up.
            control_connection_timeout=settings.request_timeout,
            auth_provider=auth,
            protocol_version=5,
            # Retry a lost node every 0.5-10 s (the default backs off to 10 minutes, which
            # keeps a service answering 503 long after Cassandra is back).
            reconnection_policy=ExponentialReconnectionPolicy(0.5, 10.0),
            # A connection to a node that died without closing it (kill -9, a lost host) is
            # found out by the next heartbeat and dropped, the node marked down until the
            # reconnection policy opens a connection again, which a restarting node accepts
            # only once it serves CQL. The driver's default (30 s, then 30 s for the answer)
            # kept sending requests to a dead node for up to a minute.
            idle_heartbeat_interval=settings.heartbeat_interval,
            idle_heartbeat_timeout=settings.heartbeat_interval,
            # The driver leaves Nagle's algorithm on: a multi-kB batch then waits ~40 ms for
            # the server's delayed ACK. Measured by `make bench` (bench/experiments).
            sockopts=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )
        try:
            session = await asyncio.to_thread(cluster.connect, keyspace)
        except _OUTAGE as exc:
            await asyncio.to_thread(cluster.shutdown)
            raise DependencyUnavailable("cassandra", _describe(exc)) from exc
        return cls(cluster, session, keyspace)

    async def close(self) -> None:
        await asyncio.to_thread(self.cluster.shutdown)

    async def prepare(self, cql: str, *, again: bool = False) -> PreparedStatement:
        """``cql`` prepared (once, then cached); ``again`` prepares it anew on every node."""
        stmt = None if again else self._prepared.get(cql)
        if stmt is None:
            try:
                stmt = await asyncio.to_thread(self.session.prepare, cql)
            except _OUTAGE as exc:
                raise DependencyUnavailable("cassandra", _describe(exc)) from exc
            self._prepared[cql] = stmt
        return stmt

    async def execute(
        self,
        query: str | Statement,
        params: Params = None,
        *,
        page_size: int | None = None,
        paging_state: bytes | None = None,
        prepare: bool = True,
        idempotent: bool = False,
        timeout: float | None = None,
        serial: bool = False,
    ) -> Page:
        """Run one statement and return one page of rows.

        Plain strings are prepared once and cached. Mark ``idempotent=True`` only for writes
        that are safe to run twice (the driver then retries them on the next replica, and runs
        them speculatively on a second one when the first is slow); reads are repeatable
        without it, and lightweight transactions, counters and ``now()`` never are, whatever
        the mark (:mod:`shared.infra.idempotence`). ``serial=True``
        reads at (LOCAL_)SERIAL consistency, as our LWTs are: a Paxos read that sees (and
        completes) any lightweight transaction in progress, which is how an LWT whose outcome
        is unknown is resolved.
        """
        if isinstance(query, str):
            stmt: Statement = (
                (await self.prepare(query)).bind(params or ())
                if prepare
                else SimpleStatement(query)
            )
            mark_repeatable(stmt, marked=idempotent, serial=serial)
        else:
            stmt = query
            if not isinstance(stmt, BatchStatement):
                mark_repeatable(stmt, marked=idempotent or stmt.is_idempotent, serial=serial)
        if page_size is not None:
            stmt.fetch_size = page_size
        if serial:
            stmt.consistency_level = ConsistencyLevel.LOCAL_SERIAL
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Page] = loop.create_future()
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        try:
            future = self.session.execute_async(
                stmt,
                None if isinstance(query, str) and prepare else params,
                paging_state=paging_state,
                **extra,
            )
        except _OUTAGE as exc:
            raise DependencyUnavailable("cassandra", _describe(exc)) from exc

        def on_ok(rows: list[Row] | None) -> None:
            # DDL and plain writes answer None; the driver swallows exceptions raised here,
            # so nothing in this callback may fail.
            page = Page(list(rows or ()), future._paging_state if future.has_more_pages else None)
            loop.call_soon_threadsafe(_settle, result, page, None)

        def on_err(exc: BaseException) -> None:
            loop.call_soon_threadsafe(_settle, result, None, exc)

        future.add_callbacks(on_ok, on_err)
        try:
            return await result
        except Exception as exc:
            if _refused_for_size(exc):
                raise TooLargeToStore(_describe(exc)) from exc
            if isinstance(exc, _OUTAGE) or (
                isinstance(exc, ErrorMessage) and exc.code == _CAS_WRITE_UNKNOWN
            ):
                raise DependencyUnavailable("cassandra", _describe(exc)) from exc
            raise

    async def batch(self, statements: Sequence[Statement], *, logged: bool = False) -> None:
        """Run bound statements as one batch: unlogged (one partition, or several where
        atomicity does not matter) or logged (all of them eventually apply, or none).

        Every statement must be safe to repeat (fixed timestamps or idempotent values): the
        driver retries the batch."""
        if not statements:
            return
        try:
            await self.execute(_batch(statements, logged))
        except Exception as exc:
            if not _lost_prepared(exc):
                raise
            log.warning("a node lost a prepared statement of a batch; re-preparing: %r", exc)
            try:
                fresh = await self._reprepared(statements)
                await self.execute(_batch(fresh, logged))
            except Exception as again:
                if not _lost_prepared(again):
                    raise
                raise DependencyUnavailable("cassandra", _describe(again)) from again

    async def _reprepared(self, statements: Sequence[Statement]) -> list[Statement]:
        """The same bound values under their statements prepared again (each once) on every
        node."""
        again: dict[str, PreparedStatement] = {}
        out: list[Statement] = []
        for stmt in statements:
            if not isinstance(stmt, BoundStatement):
                out.append(stmt)
                continue
            cql = stmt.prepared_statement.query_string
            if cql not in again:
                again[cql] = await self.prepare(cql, again=True)
            bound = copy.copy(stmt)
            bound.prepared_statement = again[cql]
            out.append(bound)
        return out

    async def rows(self, query: str | Statement, params: Params = None, **kw: Any) -> list[Row]:
        return (await self.execute(query, params, **kw)).rows

    async def one(self, query: str | Statement, params: Params = None, **kw: Any) -> Row | None:
        rows = (await self.execute(query, params, **kw)).rows
        return rows[0] if rows else None

    async def all_pages(
        self, query: str, params: Params = None, *, page_size: int = 1000
    ) -> list[Row]:
        out: list[Row] = []
        state: bytes | None = None
        while True:
            page = await self.execute(query, params, page_size=page_size, paging_state=state)
            out.extend(page.rows)
            if page.paging_state is None:
                return out
            state = page.paging_state


def slices(sizes: Sequence[int], limit: int, *, count: int | None = None) -> list[range]:
    """``sizes`` (bytes of each write) cut, in order, into runs of at most ``limit`` bytes
    together (an item larger than ``limit`` alone) and at most ``count`` items (None: any
    number): how writes are grouped so that each request stays within Cassandra's limits
    (pure)."""
    out: list[range] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        full = count is not None and i - start >= count
        if i > start and (full or total + size > limit):
            out.append(range(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out


def _batch(statements: Sequence[Statement], logged: bool) -> BatchStatement:
    batch = BatchStatement(batch_type=BatchType.LOGGED if logged else BatchType.UNLOGGED)
    for stmt in statements:
        batch.add(stmt)
    # Every statement of a batch is safe to repeat (the contract of Database.batch), unless
    # it is one that never is (a conditional batch, a counter).
    batch.is_idempotent = idempotence.all_repeatable((_cql(stmt), True) for stmt in statements)
    return batch


def _cql(stmt: Statement) -> str:
    if isinstance(stmt, BoundStatement):
        return str(stmt.prepared_statement.query_string)
    return str(getattr(stmt, "query_string", ""))


def _refused_for_size(exc: BaseException) -> bool:
    """Whether Cassandra refused a request for its size, before applying it: a batch over
    several partitions past ``batch_size_fail_threshold`` (an invalid request, "Batch too
    large"), or a mutation past ``max_mutation_size`` (the coordinator's "oversized
    mutation", or a replica's commit log refusing it, which reaches us as a write failure:
    not an outage, since the same write fails every time), or a request past the native
    protocol's ``native_transport_max_message_size`` (16 MiB too: "CQL Message of size ...
    exceeds allowed maximum", refused whole before it is read as a query)."""
    text = str(exc)
    return any(sign in text for sign in _SIZE_REFUSALS)


def _lost_prepared(exc: BaseException) -> bool:
    """Whether a batch failed because a node no longer knows one of its statements: the
    server's UNPREPARED, or the driver's own failure while handling it (a lookup error raised
    in its ResponseFuture, never one of ours)."""
    if isinstance(exc, PreparedQueryNotFound):
        return True
    if not isinstance(exc, (AttributeError, KeyError)) or exc.__traceback__ is None:
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    return (
        bool(frames)
        and frames[-1].filename.endswith("cassandra/cluster.py")
        # The wheel's compiled module names it ``cassandra.cluster.ResponseFuture._set_result``.
        and frames[-1].name.endswith("_set_result")
    )


def _settle(fut: asyncio.Future[Page], page: Page | None, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        assert page is not None  # noqa: S101 - on_ok always passes a page
        fut.set_result(page)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
