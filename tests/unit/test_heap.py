"""A service's start-up objects are frozen out of the collector's walks once it is ready, and
its C allocator runs with the policy measured for it."""

from __future__ import annotations

import gc
import platform
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from shared.infra import heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    yield
    gc.unfreeze()


async def test_the_heap_is_settled_only_after_start_up_completes(restored_gc: None) -> None:
    seen_during_start_up: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        seen_during_start_up.append(gc.get_freeze_count())
        await send({"type": "lifespan.startup.complete"})

    messages = iter([{"type": "lifespan.startup"}])

    async def receive() -> Any:
        return next(messages)

    async def send(message: Any) -> None:
        pass

    gc.unfreeze()
    await heap.settle_when_started(app)({"type": "lifespan"}, receive, send)

    assert seen_during_start_up == [0]
    assert gc.get_freeze_count() > 0


async def test_requests_pass_through_untouched(restored_gc: None) -> None:
    calls: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        calls.append(scope["type"])

    async def receive() -> Message:
        raise AssertionError("the request is not read")

    async def send(message: Message) -> None:
        raise AssertionError("nothing is answered")

    gc.unfreeze()
    await heap.settle_when_started(app)({"type": "http"}, receive, send)

    assert calls == ["http"]
    assert gc.get_freeze_count() == 0


@pytest.mark.skipif(not platform.libc_ver()[0].startswith("glibc"), reason="mallopt is glibc's")
def test_the_allocator_policy_is_applied_on_glibc() -> None:
    """On glibc both mallopt values are accepted (a process elsewhere runs with its defaults)."""
    assert heap.tune_malloc() is True
