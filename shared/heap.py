"""The garbage collector's policy for a long-running service process.

Measured under ``make bench`` (API at half its maximum, ``gc.callbacks`` timing every
collection): with CPython's defaults the API ran about one full (generation 2) collection a
second, each walking every object the imports and the Cassandra driver had made, and each
stopping the event loop for 50-210 ms: the largest part of the open-loop p99 then.
:func:`gc.freeze` moves everything alive once the process is ready (modules, prepared
statements, connection pools) into a permanent generation that no collection walks again: a
full collection then walks only what requests made (about 10k objects, 6-9 ms). Raising the
thresholds as well cut the collections further but cost the webhook service 20 MB of peak
RSS (cyclic garbage lives longer) for no measurable latency gain, so they stay CPython's.
"""

from __future__ import annotations

import gc

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def settle() -> None:
    """Call once a service is ready: collect what start-up left, then freeze the rest."""
    gc.collect()
    gc.freeze()


def settle_when_started(app: ASGIApp) -> ASGIApp:
    """``app``, calling :func:`settle` once its lifespan start-up has completed (the service
    entry points wrap their app with this; tests, which start many apps in one process, do
    not)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_settled(message: Message) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete":
                settle()

        await app(scope, receive, send_settled)

    return wrapped
