"""Migration discovery and statement splitting (pure), and the schema lock's rounds against a
scripted database."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from shared.core.errors import DependencyUnavailable
from shared.infra.migrations import _acquire, discover, migrations_dir, split_statements


def test_split_drops_comments_and_blank_statements() -> None:
    """Statements end at a line-final semicolon; comment lines are ignored."""
    text = "-- a comment; not a statement\nCREATE TABLE a (x int PRIMARY KEY);\n\nSELECT 1;\n"

    assert split_statements(text) == ("CREATE TABLE a (x int PRIMARY KEY)", "SELECT 1")


def test_shipped_migrations_are_well_formed() -> None:
    """Every shipped migration has a number, a name and idempotent statements."""
    found = discover(migrations_dir())

    assert [m.version for m in found] == sorted({m.version for m in found})
    for m in found:
        for statement in m.statements:
            upper = statement.upper()
            assert "IF NOT EXISTS" in upper or "IF EXISTS" in upper or "ALTER" in upper


def test_bad_file_names_are_refused(tmp_path: Path) -> None:
    """A file that does not follow NNNN_name.cql stops discovery."""
    (tmp_path / "1_oops.cql").write_text("SELECT 1;")

    with pytest.raises(ValueError, match="NNNN_name"):
        discover(tmp_path)


def test_duplicate_versions_are_refused(tmp_path: Path) -> None:
    """Two files with the same number cannot both be applied in a defined order."""
    (tmp_path / "0001_a.cql").write_text("SELECT 1;")
    (tmp_path / "0001_b.cql").write_text("SELECT 1;")

    with pytest.raises(ValueError, match="share a version"):
        discover(tmp_path)


class _TimedOutThenHeld:
    """The lock's first round times out though it applied; later rounds see the lock held."""

    def __init__(self) -> None:
        self.owner: uuid.UUID | None = None

    async def one(self, query: str, params: tuple[Any, ...], **kw: Any) -> dict[str, Any]:
        if self.owner is None:
            self.owner = params[0]
            raise DependencyUnavailable("cassandra", "OperationTimedOut")
        return {"[applied]": False, "owner": self.owner}


async def test_a_lock_round_that_timed_out_but_applied_holds_the_lock() -> None:
    db = _TimedOutThenHeld()
    owner = uuid.uuid4()

    await _acquire(db, owner, wait=5)  # type: ignore[arg-type]

    assert db.owner == owner


async def test_a_lock_another_run_holds_is_waited_for_not_taken() -> None:
    db = _TimedOutThenHeld()
    db.owner = uuid.uuid4()

    with pytest.raises(TimeoutError):
        await _acquire(db, uuid.uuid4(), wait=0.6)  # type: ignore[arg-type]
