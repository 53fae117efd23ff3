"""The provider interface every adapter implements, and the receipt it returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from shared.models import Chunk


@dataclass(frozen=True, slots=True)
class Receipt:
    """A provider accepted a chunk: its HTTP status and message id (for webhook correlation)."""

    provider: str
    status: int
    message_id: str | None


class Provider(Protocol):
    """Sends chunks. Raises subclasses of ``shared.errors.ProviderError`` on failure:

    * ``TransientProviderError`` for 5xx, 429 (with ``retry_after``), timeouts, connection errors;
    * ``ProviderMisconfigured`` for 401/403/404 (bad key, unknown domain);
    * ``PermanentProviderError`` for requests no provider will take (400 on our payload, 413).
    """

    #: Short code used in routing keys (``sg``, ``mg``).
    code: str
    #: Human name, for logs and the dashboard.
    name: str
    #: Most recipients (to+cc+bcc across personalisations) one request may carry.
    max_recipients: int

    async def send(self, chunk: Chunk) -> Receipt: ...

    async def aclose(self) -> None: ...
