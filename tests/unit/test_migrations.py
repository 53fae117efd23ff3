"""Migration discovery and statement splitting (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.infra.migrations import discover, migrations_dir, split_statements


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
