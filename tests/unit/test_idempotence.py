"""Which statements the driver may run twice (retried on the next replica or run speculatively),
and what the adapter's retry policy does with a failure of each."""

from __future__ import annotations

import pytest
from cassandra.policies import RetryPolicy, WriteType
from cassandra.protocol import IsBootstrappingErrorMessage, OverloadedErrorMessage, ServerError
from cassandra.query import SimpleStatement

from shared.infra import idempotence
from shared.infra.db import ReplicaRetryPolicy, _batch, mark_repeatable
from shared.infra.idempotence import Kind

_NEXT = (RetryPolicy.RETRY_NEXT_HOST, None)
_RETHROW = (RetryPolicy.RETHROW, None)


@pytest.mark.parametrize(
    ("cql", "expected"),
    [
        ("SELECT * FROM batches WHERE batch_id = ?", Kind.READ),
        ("  select count(*) from t", Kind.READ),
        ("INSERT INTO t (a, b) VALUES (?, ?)", Kind.WRITE),
        ("UPDATE t USING TTL 60 SET b = ? WHERE a = ?", Kind.WRITE),
        ("DELETE FROM t WHERE a = ?", Kind.WRITE),
        ("INSERT INTO t (a) VALUES (?) IF NOT EXISTS", Kind.CONDITIONAL),
        ("UPDATE t SET s = 'sending' WHERE a = ? IF s = 'queued'", Kind.CONDITIONAL),
        ("UPDATE t SET s = ? WHERE a = ? IF s IN ('queued', 'retry')", Kind.CONDITIONAL),
        ("UPDATE t SET s = ? WHERE a = ? if m['k'] = ?", Kind.CONDITIONAL),
        ("DELETE FROM t WHERE a = ? IF EXISTS", Kind.CONDITIONAL),
        ("UPDATE counts SET n = n + ? WHERE a = ?", Kind.ACCUMULATING),
        ("UPDATE t SET l = l + ? WHERE a = ?", Kind.ACCUMULATING),
        ("UPDATE t SET l = ? + l WHERE a = ?", Kind.ACCUMULATING),
        ("INSERT INTO t (a, at) VALUES (?, toTimestamp(now()))", Kind.ACCUMULATING),
        ("INSERT INTO t (id) VALUES (uuid())", Kind.ACCUMULATING),
        ("CREATE TABLE IF NOT EXISTS t (a int PRIMARY KEY)", Kind.SCHEMA),
        ("DROP KEYSPACE IF EXISTS k", Kind.SCHEMA),
    ],
)
def test_each_statement_has_the_kind_its_text_says(cql: str, expected: Kind) -> None:
    """A statement's kind comes from its verb, its condition and what its assignments do."""
    assert expected == idempotence.kind(cql)


def test_text_inside_quotes_is_not_read_as_a_condition_or_a_function() -> None:
    """A literal holding "IF NOT EXISTS" or "now()" leaves a plain write a plain write."""
    assert (
        idempotence.kind("INSERT INTO t (a, b) VALUES (?, 'x IF NOT EXISTS now()')") == Kind.WRITE
    )


def test_a_column_whose_name_starts_with_if_is_not_a_condition() -> None:
    """``if_match = ?`` in a SET clause is an assignment, not a lightweight transaction."""
    assert idempotence.kind("UPDATE t SET if_match = ? WHERE a = ?") == Kind.WRITE


def test_reads_are_repeatable_unmarked_but_serial_reads_never() -> None:
    """A read may always run twice; a SERIAL read is a Paxos round and never is."""
    cql = "SELECT state FROM sends WHERE id = ?"

    assert idempotence.repeatable(cql, marked=False)
    assert not idempotence.repeatable(cql, marked=True, serial=True)


def test_a_plain_write_is_repeatable_only_when_its_caller_marks_it() -> None:
    """Only the caller knows whether a write's values are fixed, so its mark decides."""
    cql = "INSERT INTO t (a, b) VALUES (?, ?)"

    assert idempotence.repeatable(cql, marked=True)
    assert not idempotence.repeatable(cql, marked=False)


@pytest.mark.parametrize(
    "cql",
    [
        "UPDATE sends SET state = 'sending' WHERE id = ? IF state = 'queued'",
        "UPDATE counts SET n = n + 1 WHERE a = ?",
        "INSERT INTO t (a, at) VALUES (?, now())",
        "CREATE TABLE t (a int PRIMARY KEY)",
    ],
)
def test_lwts_counters_fresh_values_and_schema_are_never_repeatable(cql: str) -> None:
    """A caller's mark cannot make a conditional, accumulating or schema statement repeatable."""
    assert not idempotence.repeatable(cql, marked=True)


def test_a_batch_is_repeatable_only_when_all_its_statements_are() -> None:
    """One conditional statement makes the whole batch unrepeatable."""
    plain = ("INSERT INTO t (a) VALUES (?)", True)
    claim = ("UPDATE t SET s = ? WHERE a = ? IF s = ?", True)

    assert idempotence.all_repeatable([plain, plain])
    assert not idempotence.all_repeatable([plain, claim])


def test_an_lwt_marked_idempotent_by_its_caller_is_marked_unrepeatable_for_the_driver() -> None:
    """The driver sees ``is_idempotent=False`` on an LWT, whatever the caller passed."""
    stmt = SimpleStatement("INSERT INTO t (a) VALUES (1) IF NOT EXISTS")

    mark_repeatable(stmt, marked=True)

    assert stmt.is_idempotent is False


def test_a_read_is_marked_repeatable_for_the_driver_without_its_callers_mark() -> None:
    """A read reaches the driver marked idempotent, so it is retried and run speculatively."""
    stmt = SimpleStatement("SELECT * FROM t WHERE a = 1")

    mark_repeatable(stmt, marked=False)

    assert stmt.is_idempotent is True


def test_the_adapters_batch_of_plain_writes_is_repeatable_and_a_conditional_one_is_not() -> None:
    """The batch request itself carries the decision over its statements."""
    plain = SimpleStatement("INSERT INTO t (a) VALUES (1)")
    claim = SimpleStatement("UPDATE t SET s = 'b' WHERE a = 1 IF s = 'a'")

    assert _batch([plain], logged=True).is_idempotent is True
    assert _batch([plain, claim], logged=False).is_idempotent is False


def _stmt(repeatable: bool) -> SimpleStatement:
    return SimpleStatement("SELECT 1", is_idempotent=repeatable)


def test_a_repeatable_statement_that_timed_out_goes_to_the_next_replica_twice_then_fails() -> None:
    """Read and write timeouts of a repeatable statement move on to another replica, bounded."""
    policy, stmt = ReplicaRetryPolicy(), _stmt(True)

    assert policy.on_read_timeout(stmt, 6, 2, 1, False, 0) == _NEXT
    assert policy.on_write_timeout(stmt, 6, WriteType.SIMPLE, 2, 1, 1) == _NEXT
    assert policy.on_write_timeout(stmt, 6, WriteType.SIMPLE, 2, 1, 2) == _RETHROW


def test_an_lwt_that_timed_out_is_handed_back_to_its_caller() -> None:
    """A CAS timeout has an unknown outcome: no retry, the caller resolves it at SERIAL."""
    policy, stmt = ReplicaRetryPolicy(), _stmt(False)

    assert policy.on_write_timeout(stmt, 6, WriteType.CAS, 2, 1, 0) == _RETHROW
    assert policy.on_read_timeout(stmt, 9, 2, 1, False, 0) == _RETHROW


def test_an_lwt_whose_connection_broke_is_not_sent_again() -> None:
    """Unlike the driver's default, a broken connection under an LWT is the caller's to resolve."""
    policy = ReplicaRetryPolicy()

    assert policy.on_request_error(_stmt(False), 6, ConnectionError("reset"), 0) == _RETHROW
    assert policy.on_request_error(_stmt(False), 6, ServerError(0, "", None), 0) == _RETHROW
    assert policy.on_request_error(_stmt(True), 6, ConnectionError("reset"), 0) == _NEXT


def test_any_statement_refused_before_it_ran_is_tried_once_on_the_next_host() -> None:
    """Too few replicas alive, an overloaded or bootstrapping coordinator: nothing applied."""
    policy, lwt = ReplicaRetryPolicy(), _stmt(False)
    overloaded = OverloadedErrorMessage(0x1001, "overloaded", None)
    bootstrapping = IsBootstrappingErrorMessage(0x1002, "bootstrapping", None)

    assert policy.on_unavailable(lwt, 6, 2, 1, 0) == _NEXT
    assert policy.on_unavailable(lwt, 6, 2, 1, 1) == _RETHROW
    assert policy.on_request_error(lwt, 6, overloaded, 0) == _NEXT
    assert policy.on_request_error(lwt, 6, bootstrapping, 0) == _NEXT
    assert policy.on_request_error(lwt, 6, overloaded, 1) == _RETHROW
