"""A typed client for the Safedelivr API: :class:`Client` (sync) and :class:`AsyncClient`.

Sends carry an ``Idempotency-Key`` so that retries never make a second batch; ``429`` and
``503`` are retried after their ``Retry-After``, as the API documents.
"""

from ._clients import AsyncClient, Client
from ._core import OPERATIONS, ApiError, Page
from ._types import Accepted, BatchItem, KeyCreated, LogEntry, StatsDay

__all__ = [
    "OPERATIONS",
    "Accepted",
    "ApiError",
    "AsyncClient",
    "BatchItem",
    "Client",
    "KeyCreated",
    "LogEntry",
    "Page",
    "StatsDay",
]
