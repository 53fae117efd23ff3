"""The live settings' applier of a consumer (``services.consumers.live.ConsumerSettings``)
over a World's dispatcher, splitter and broker, as the consumer tests build it."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from services.consumers.live import ConsumerSettings, LiveMetrics
from tests.fakes.world import World


async def _no_handler(message: object) -> None:
    raise AssertionError("the world delivers by itself")


def consumer_settings(w: World, clock: Callable[[], float] = time.monotonic) -> ConsumerSettings:
    """``w``'s applier, with its own metrics; ``clock`` times the wake-ups' linger."""
    return ConsumerSettings(
        w.dispatcher,
        w.running,
        w.broker,  # type: ignore[arg-type]
        _no_handler,
        4,
        LiveMetrics.create(CollectorRegistry()),
        clock=clock,
    )
