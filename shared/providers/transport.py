"""What an ``httpx`` failure of a provider call means for the chunk (pure), for every adapter.

What matters is whether the provider can have received the whole request: without a
connection, or with the request not fully written, nothing can have been accepted (a clean
failure); once it was sent, a timeout or a lost connection leaves the outcome unknown, and
the attempt protocol then asks the provider (or waits for webhooks) before any re-send. An
answer that did arrive is judged by ``shared.providers.responses`` (a 5xx is unknown too).
"""

from __future__ import annotations

import asyncio
from types import TracebackType

import httpx

from shared.core.errors import ProviderError, ProviderMisconfigured, TransientProviderError
from shared.infra import waits


def translate(code: str, name: str, exc: Exception, timeout: float) -> ProviderError:
    """Our error for an ``httpx`` exception raised while calling provider ``code``."""
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return ProviderMisconfigured(code, f"cannot use the {name} base URL: {exc}")
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return TransientProviderError(code, f"could not reach {name}: {exc!r}")
    if isinstance(exc, httpx.WriteError | httpx.WriteTimeout):
        # A request not fully written cannot be accepted.
        return TransientProviderError(code, f"could not send the request: {exc!r}")
    if isinstance(exc, httpx.ReadTimeout):
        return TransientProviderError(
            code,
            f"no response within {timeout:g}s (the provider may have accepted the chunk)",
            outcome_unknown=True,
        )
    return TransientProviderError(
        code,
        f"connection lost after the request was sent ({exc!r}); the provider may have "
        "accepted the chunk",
        outcome_unknown=True,
    )


class Calls:
    """An adapter's requests in flight, so that closing it waits for them (each is bounded
    by the provider timeout) before its HTTP client goes: a request abandoned by its caller
    still ends and closes its connection."""

    def __init__(self) -> None:
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __enter__(self) -> None:
        self._active += 1
        self._idle.clear()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._active -= 1
        if not self._active:
            self._idle.set()

    async def drained(self, timeout: float) -> None:
        """Return once no request is in flight, or after ``timeout`` seconds."""
        await waits.set_within(self._idle, timeout)
