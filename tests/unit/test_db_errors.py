"""Which failures of a batch the Cassandra adapter takes for a statement a node forgot."""

from __future__ import annotations

from cassandra.protocol import PreparedQueryNotFound

from shared.infra.db import _lost_prepared


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - handed back for inspection
        return caught


def test_the_servers_unprepared_is_a_lost_statement() -> None:
    assert _lost_prepared(PreparedQueryNotFound(0x2500, "unprepared", b"id"))


def test_a_lookup_error_raised_outside_the_driver_is_not() -> None:
    assert not _lost_prepared(_raised(AttributeError("'bytes' object has no attribute 'encode'")))
    assert not _lost_prepared(_raised(KeyError(b"id")))


def test_an_error_never_raised_is_not() -> None:
    assert not _lost_prepared(AttributeError("no traceback"))
