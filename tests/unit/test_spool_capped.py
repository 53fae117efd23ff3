"""Spooling an upload to a temporary file as it arrives (``shared.infra.http.spool_capped``, the
CSV import's body): the same caps as any body, and never the whole upload in memory."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from shared.infra.http import SPOOL_FLUSH, ApiError, spool_capped

CHUNK = 64 * 1024
#: The checkout, where the measuring interpreter imports ``shared`` and ``tests`` from.
ROOT = Path(__file__).resolve().parents[2]


def request(
    parts: int, *, make: Callable[[int], bytes], delay: float = 0.0, length: str | None = None
) -> tuple[Request, list[int]]:
    """A request whose body is ``parts`` chunks, each made only when it is asked for; the
    list counts the chunks asked for."""
    headers = [(b"content-length", length.encode())] if length is not None else []
    asked = [0]

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(delay)
        asked[0] += 1
        n = asked[0]
        body = make(n) if n <= parts else b""
        return {"type": "http.request", "body": body, "more_body": n < parts}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    return Request(scope, receive), asked


def _chunk(n: int) -> bytes:
    return bytes([n % 251]) * CHUNK


async def test_the_body_is_in_the_file_rewound() -> None:
    req, _ = request(40, make=_chunk)

    spool = await spool_capped(req, 40 * CHUNK)

    with spool:
        assert spool.read() == b"".join(_chunk(n) for n in range(1, 41))


#: The measurement, in an interpreter of its own: tracemalloc counts every thread's
#: allocations, and a test process's other threads (the Cassandra driver's, refreshing its
#: schema as other workers migrate) once took the peak 1 % past the bound.
#: With ``held``, every worker-thread call keeps its arguments to the end, as a starved
#: executor's queued work items do: what the writing thread does not empty stays allocated.
_MEASURE = """
import asyncio
import sys
import tracemalloc

from shared.infra.http import spool_capped
from tests.unit.test_spool_capped import CHUNK, _chunk, request

kept = []
if sys.argv[1] == "held":
    prompt = asyncio.to_thread

    async def to_thread(func, /, *args, **kwargs):
        kept.append(args)
        return await prompt(func, *args, **kwargs)

    asyncio.to_thread = to_thread


async def main() -> None:
    req, _ = request(256, make=_chunk)
    tracemalloc.start()
    spool = await spool_capped(req, 256 * CHUNK)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    spool.close()
    print(peak)


asyncio.run(main())
"""


@pytest.mark.parametrize("executor", ["prompt", "held"])
def test_an_upload_many_times_the_flush_size_holds_about_the_flush_size(executor: str) -> None:
    """16 MB in: the memory allocated at the peak is about one flush, not the upload (which
    joined would be 16 MB, and its chunks kept 16 MB more), however late the writing thread
    lets go of what it wrote."""
    measured = subprocess.run(
        [sys.executable, "-c", _MEASURE, executor],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    peak = int(measured.stdout.split()[-1])

    assert peak < 2 * SPOOL_FLUSH


async def test_a_body_over_the_cap_is_a_413_read_no_further() -> None:
    req, asked = request(1000, make=_chunk)

    with pytest.raises(ApiError) as caught:
        await spool_capped(req, 10 * CHUNK)

    assert (caught.value.status, caught.value.code) == (413, "body_too_large")
    assert asked[0] == 11


async def test_a_declared_length_over_the_cap_is_a_413_before_reading() -> None:
    req, asked = request(2, make=_chunk, length=str(10 * CHUNK))

    with pytest.raises(ApiError) as caught:
        await spool_capped(req, CHUNK)

    assert (caught.value.status, asked[0]) == (413, 0)


async def test_a_body_that_trickles_in_past_the_timeout_is_a_408() -> None:
    req, _ = request(3, make=_chunk, delay=0.1)

    with pytest.raises(ApiError) as caught:
        await spool_capped(req, 10 * CHUNK, timeout=0.15)

    assert (caught.value.status, caught.value.code) == (408, "body_timeout")
