"""What each provider accepts in one request; the API sizes chunks from these (pure)."""

from __future__ import annotations

from collections.abc import Iterable

from shared.core.catalog import CATALOG


def chunk_size(chain: Iterable[str], *, copies: int = 0) -> int:
    """The largest chunk every provider of the chain accepts, so failover never re-splits.

    ``copies`` (cc + bcc addresses) ride along with a shared message and count towards the
    provider's per-request recipient limit.
    """
    return max(1, min(CATALOG[code].max_recipients for code in chain) - copies)
