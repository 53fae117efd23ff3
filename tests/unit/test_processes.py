"""The tests' ``/proc`` readers (``tests.processes``): a process reaped while one of its files
is read is gone, never an error out of the test that was waiting for it to end (as
``test_a_first_job_given_up_on_frees_the_worker_it_started`` once failed in CI)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.processes import alive, children, cmdline


@pytest.fixture
def reaped_mid_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``/proc`` read fails as it does for a process reaped between open and read."""

    def esrch(self: Path) -> bytes:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(Path, "read_bytes", esrch)


def test_a_running_process_is_alive_and_a_reaped_one_is_not() -> None:
    process = subprocess.Popen(["sleep", "60"])
    try:
        assert alive(process.pid)  # from the fork on (its command line is set only at exec)
    finally:
        process.kill()
        process.wait()
    assert not alive(process.pid)


@pytest.mark.usefixtures("reaped_mid_read")
def test_a_process_reaped_during_a_read_is_gone() -> None:
    assert (alive(1), children(1), cmdline(1)) == (False, set(), b"")
