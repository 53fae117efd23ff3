"""In-process twin of :class:`shared.templates.template_pool.TemplatePool` (the ``Renderer``
protocol).

A job runs in a worker thread of this process with a :class:`CompiledParts` of the twin's
own, its arguments and its answer pickled both ways as the pool sends them through its
sockets (what cannot cross there fails here too). It has no process limits: the sandbox's own
checks answer as they do in a worker, and what only a worker's limits catch (memory, CPU, the
deadline, a crash, a pool that cannot take the job) is injected with :meth:`fail`.
``tests/contracts/test_renderer.py`` runs one suite over this twin and the real pool.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

from shared.templates.template_limits import Limit
from shared.templates.template_render import CompiledParts, LimitError, RenderError

T = TypeVar("T")


class InlineRenderer:
    """Twin of :class:`shared.templates.template_pool.TemplatePool` (``run``)."""

    def __init__(self) -> None:
        self.parts = CompiledParts()
        self.jobs: list[str] = []
        """The name of every job run, in order."""
        self._faults: list[tuple[str | None, BaseException]] = []

    def fail(self, error: BaseException, *, job: str | None = None, times: int = 1) -> None:
        """The next ``times`` jobs (named ``job``, or any) end with ``error`` instead of
        running: a LimitError of ``memory``, ``cpu_time`` or ``time``, RendererCrashed (the
        worker killed mid-job), RendererUnavailable."""
        self._faults.extend([(job, error)] * times)

    async def run(self, job: Callable[..., T], *args: Any) -> T:
        self.jobs.append(job.__name__)
        for at, (name, error) in enumerate(self._faults):
            if name in (None, job.__name__):
                del self._faults[at]
                raise error
        try:
            sent = pickle.loads(pickle.dumps(args))  # noqa: S301 - our own bytes, as the pool's socket
        except Exception as exc:  # noqa: BLE001 - told as the pool tells a job it cannot send
            raise RuntimeError(f"the template job cannot be sent: {exc}") from None
        try:
            value = await asyncio.to_thread(job, *sent, parts=self.parts)
        except RenderError:
            raise
        except MemoryError:
            raise LimitError(Limit.MEMORY, "the template needs too much memory") from None
        except Exception as exc:  # noqa: BLE001 - told as the pool tells a job of ours that failed
            raise RuntimeError(f"a template job failed: {type(exc).__name__}: {exc}") from None
        answer: T = pickle.loads(pickle.dumps(value))  # noqa: S301 - as above
        return answer
