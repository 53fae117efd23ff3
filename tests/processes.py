"""What tests read about other processes from ``/proc``, safely while those processes end.

A process can be reaped between ``open`` and ``read`` of one of its ``/proc`` files; the read
then fails with ``ProcessLookupError`` (ESRCH), not ``FileNotFoundError``. Each reader here
treats both as "gone", so a test that waits for a process to end never fails because it ended
in the middle of a look.
"""

from __future__ import annotations

from pathlib import Path


def _read(path: str) -> bytes | None:
    """The file's bytes, or None when its process is gone (before the open or during the read)."""
    try:
        return Path(path).read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None


def alive(pid: int) -> bool:
    """Running: a process that exited but was not yet reaped (a zombie) is not."""
    stat = _read(f"/proc/{pid}/stat")
    return stat is not None and stat.rpartition(b")")[2].split()[0] != b"Z"


def children(pid: int) -> set[int]:
    """The process's children now (none once it is gone)."""
    listed = _read(f"/proc/{pid}/task/{pid}/children")
    return {int(p) for p in listed.split()} if listed is not None else set()


def cmdline(pid: int) -> bytes:
    """The process's command line, NUL-separated (empty once it is gone)."""
    return _read(f"/proc/{pid}/cmdline") or b""
