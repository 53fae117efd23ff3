"""The template pool (``shared.templates.template_pool``) over real worker processes: a job runs in
a worker and answers; a breach of the memory, CPU or time limit, a crash, a caller giving up or
a worker dying idle ends in a typed error (never a hang) and a new worker that takes the next
job; a closed pool refuses jobs and leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from shared.infra.config import TemplateSettings
from shared.templates.template_pool import RendererBusy, RendererUnavailable, TemplatePool
from shared.templates.template_render import LimitError, Rendered, RendererCrashed, render_version
from tests.processes import alive
from tests.unit import pool_jobs

#: 1,500 strings of a megabyte: 1.46 GB in the API process before the pool.
MEGABYTES = "".join(f'{{% set a{i} = "x" * 1000000 %}}' for i in range(1500)) + "done"
#: 2**49999 squared 14 times: refused by the sandbox itself, in the worker.
SQUARINGS = "{% set v0 = 2**49999 %}" + "".join(
    f"{{% set v{i + 1} = v{i} * v{i} %}}" for i in range(14)
)


@pytest.fixture
async def pool() -> AsyncIterator[TemplatePool]:
    """One worker, with limits small enough to breach quickly."""
    made = TemplatePool(
        TemplateSettings(warm=True, workers=1, memory_mb=256, cpu_seconds=1, deadline=3)
    )
    await made.start()
    try:
        yield made
    finally:
        await made.close()


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(6000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


def _sleeping(pool: TemplatePool, started: Path) -> asyncio.Task[None]:
    """A job that sleeps for an hour, once its worker has it (``started`` exists)."""
    return asyncio.create_task(pool.run(pool_jobs.sleep, 3600, str(started)))


async def _replaced(pool: TemplatePool, before: list[int]) -> list[int]:
    """The workers once the one that broke is replaced (the next job waits for it anyway)."""
    assert await pool.run(pool_jobs.pid) not in before
    return pool.pids()


async def test_a_pool_that_is_not_warm_starts_a_worker_only_for_a_job() -> None:
    """No process until a job needs one, and the first job starts one worker, not all."""
    pool = TemplatePool(TemplateSettings(warm=False, workers=2))
    await pool.start()
    try:
        before = pool.pids()
        first = await pool.run(pool_jobs.pid)
        assert (before, pool.pids()) == ([], [first])
    finally:
        await pool.close()


async def test_a_first_job_given_up_on_frees_the_worker_it_started(tmp_path: Path) -> None:
    """A pool that is not warm: the worker started for a job its caller gave up on is killed
    at once, not at the deadline."""
    pool = TemplatePool(TemplateSettings(warm=False, workers=1, deadline=300))
    await pool.start()
    try:
        job = _sleeping(pool, tmp_path / "started")
        await _until((tmp_path / "started").exists)
        (worker,) = pool.pids()

        job.cancel()

        with pytest.raises(asyncio.CancelledError):
            await job
        await _until(lambda: not alive(worker))
    finally:
        await pool.close()


async def test_a_job_that_cannot_be_sent_starts_no_worker() -> None:
    """A pool that is not warm, asked to run a job it cannot send (not picklable): the caller
    is told, and no process starts for it."""
    pool = TemplatePool(TemplateSettings(warm=False, workers=1))
    await pool.start()
    try:
        with pytest.raises(RuntimeError, match="cannot be sent"):
            await pool.run(lambda: None)
        await asyncio.sleep(2)  # a refill would have started its process by now
        assert pool.pids() == []
    finally:
        await pool.close()


async def test_a_job_runs_in_a_worker_and_answers(pool: TemplatePool) -> None:
    """A version rendered in the worker comes back as it renders in-process."""
    out = await pool.run(render_version, "Hi {{ n }}", "<p>{{ n }}</p>", None, {"n": "<Ann>"})

    assert out == Rendered("Hi <Ann>", "<p>&lt;Ann&gt;</p>", "<Ann>")
    assert await pool.run(pool_jobs.pid) in pool.pids()
    assert os.getpid() not in pool.pids()


async def test_a_sandbox_refusal_names_its_limit_and_keeps_the_worker(pool: TemplatePool) -> None:
    """A step the sandbox refuses is a LimitError naming it; the worker goes on."""
    before = pool.pids()

    with pytest.raises(LimitError) as caught:
        await pool.run(render_version, "s", None, SQUARINGS, {})

    assert caught.value.fields is not None
    assert (caught.value.limit, caught.value.fields) == (
        "integer_size",
        {"text": caught.value.fields["text"]},
    )
    assert await pool.run(pool_jobs.pid) in before


async def test_a_template_past_the_memory_limit_is_refused_and_its_worker_replaced() -> None:
    """1,500 megabyte strings hit the worker's address-space limit: ``memory``, a new worker.
    The time limits are far away: which limit it passes first must not depend on how busy
    the machine is."""
    pool = TemplatePool(
        TemplateSettings(warm=True, workers=1, memory_mb=256, cpu_seconds=120, deadline=120)
    )
    await pool.start()
    try:
        before = pool.pids()

        with pytest.raises(LimitError) as caught:
            await pool.run(render_version, "s", None, MEGABYTES, {})

        assert caught.value.limit == "memory"
        assert await _replaced(pool, before) != before
        assert (await pool.run(render_version, "ok", None, "fine", {})).text == "fine"
    finally:
        await pool.close()


async def test_a_job_past_the_deadline_is_refused_and_its_worker_replaced(
    pool: TemplatePool,
) -> None:
    """A job still running at the deadline is killed: ``time``, and the next job runs."""
    before = pool.pids()

    with pytest.raises(LimitError) as caught:
        await pool.run(pool_jobs.sleep, 3600)

    assert caught.value.limit == "time"
    assert await _replaced(pool, before) != before


async def test_a_job_past_its_cpu_time_is_ended_by_the_kernel() -> None:
    """With the deadline far away, the CPU limit ends a computing worker: ``cpu_time``."""
    pool = TemplatePool(TemplateSettings(warm=True, workers=1, cpu_seconds=1, deadline=300))
    await pool.start()
    try:
        before = pool.pids()
        with pytest.raises(LimitError) as caught:
            await pool.run(pool_jobs.spin)

        assert caught.value.limit == "cpu_time"
        assert await _replaced(pool, before) != before
    finally:
        await pool.close()


async def test_a_worker_that_crashes_is_an_error_not_a_hang(pool: TemplatePool) -> None:
    """A worker dying of a signal mid-job is RendererCrashed naming it; the next job runs."""
    before = pool.pids()

    with pytest.raises(RendererCrashed, match="SIGABRT"):
        await pool.run(pool_jobs.abort)

    assert await _replaced(pool, before) != before


async def test_a_worker_killed_mid_job_is_reported_and_replaced(
    pool: TemplatePool, tmp_path: Path
) -> None:
    """A worker killed from outside while it renders: RendererCrashed, not a hang."""
    (worker,) = pool.pids()
    job = _sleeping(pool, tmp_path / "started")
    await _until((tmp_path / "started").exists)

    os.kill(worker, signal.SIGKILL)

    with pytest.raises(RendererCrashed, match="SIGKILL"):
        await job
    assert await _replaced(pool, [worker]) != [worker]


async def test_a_worker_that_died_idle_does_not_fail_the_next_job(pool: TemplatePool) -> None:
    """A worker gone while idle is not the next job's fault: it runs on a new worker."""
    (worker,) = pool.pids()
    os.kill(worker, signal.SIGKILL)
    await _until(lambda: worker not in pool.pids())

    assert await pool.run(pool_jobs.pid) != worker


async def test_a_caller_that_gives_up_frees_its_worker(pool: TemplatePool, tmp_path: Path) -> None:
    """A cancelled job's worker is killed at once, and the slot serves the next job."""
    (worker,) = pool.pids()
    job = _sleeping(pool, tmp_path / "started")
    await _until((tmp_path / "started").exists)

    job.cancel()

    with pytest.raises(asyncio.CancelledError):
        await job
    assert await pool.run(pool_jobs.pid) != worker


async def test_every_worker_busy_past_the_wait_is_renderer_busy(tmp_path: Path) -> None:
    """A job that cannot get a worker within the wait is refused (a 503), not queued forever."""
    pool = TemplatePool(TemplateSettings(warm=True, workers=1, wait=0.2, deadline=300))
    await pool.start()
    try:
        first = _sleeping(pool, tmp_path / "started")
        await _until((tmp_path / "started").exists)

        with pytest.raises(RendererBusy):
            await pool.run(pool_jobs.pid)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    finally:
        await pool.close()


async def test_a_job_cancelled_as_a_slot_reaches_it_ends_cancelled_and_passes_the_slot_on() -> None:
    """A job waiting for a worker, cancelled in the turn a slot reaches it, ends cancelled and
    leaves the slot to the next job waiting (the slot of closing, which refuses that job)."""
    pool = TemplatePool(TemplateSettings(warm=True, workers=1, wait=60))  # not started: no slot yet
    first = asyncio.create_task(pool.run(pool_jobs.pid))
    second = asyncio.create_task(pool.run(pool_jobs.pid))
    await asyncio.sleep(0)  # both wait for a slot
    closing = asyncio.create_task(pool.close())
    await asyncio.sleep(0)  # closing has handed its slot to the first job

    first.cancel()
    await asyncio.wait({first, second}, timeout=5.0)
    await closing

    assert (first.cancelled(), second.done() and type(second.exception())) == (
        True,
        RendererUnavailable,
    )


async def test_a_closed_pool_refuses_jobs_and_leaves_no_worker(tmp_path: Path) -> None:
    """Closing ends the job in flight (RendererUnavailable), every worker, and new jobs."""
    pool = TemplatePool(TemplateSettings(warm=True, workers=2, deadline=300))
    await pool.start()
    running = _sleeping(pool, tmp_path / "started")
    await _until((tmp_path / "started").exists)
    workers = pool.pids()

    await pool.close()

    with pytest.raises(RendererUnavailable):
        await running
    with pytest.raises(RendererUnavailable):
        await pool.run(pool_jobs.pid)
    assert pool.pids() == []
    for worker in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(worker, 0)


async def test_a_worker_cannot_read_the_services_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers start without the ``SAFEDELIVR_*`` variables (secrets among them)."""
    monkeypatch.setenv("SAFEDELIVR_GITHUB_CLIENT_SECRET", "s3cret")
    pool = TemplatePool(TemplateSettings(warm=True, workers=1))
    await pool.start()
    try:
        assert await pool.run(pool_jobs.settings_seen) == []
    finally:
        await pool.close()
