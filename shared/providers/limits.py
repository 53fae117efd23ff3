"""What each provider accepts in one request; the API sizes chunks from these (pure)."""

from __future__ import annotations

from collections.abc import Iterable

#: Recipients (to+cc+bcc) one request may carry, per provider code.
MAX_RECIPIENTS: dict[str, int] = {"sg": 1000, "mg": 1000}


def chunk_size(chain: Iterable[str], *, copies: int = 0) -> int:
    """The largest chunk every provider of the chain accepts, so failover never re-splits.

    ``copies`` (cc + bcc addresses) ride along with a shared message and count towards the
    provider's per-request recipient limit.
    """
    return max(1, min(MAX_RECIPIENTS[code] for code in chain) - copies)
