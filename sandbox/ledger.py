"""What each provider accepted: request and recipient counts, and the latest raw requests.

Bounded: per-recipient counts stop growing at ``Tuning.max_tracked_recipients`` distinct
addresses (later ones are only counted in the totals), only the last
``Tuning.recent_requests`` requests are kept, and the arrival times of the last
:data:`ARRIVALS` requests (``?times=1``: what a rate-limit test measures), so a benchmark
cannot exhaust memory.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandbox.faults import PROVIDERS
from sandbox.tuning import Tuning

#: Arrival times kept per provider.
ARRIVALS = 100_000


@dataclass(slots=True)
class _ProviderLedger:
    recent: deque[dict[str, Any]]
    arrivals: deque[float] = field(default_factory=lambda: deque(maxlen=ARRIVALS))
    requests: int = 0
    recipients: int = 0
    untracked: int = 0
    by_recipient: dict[str, int] = field(default_factory=dict)


class SendLedger:
    """Accepted send calls of every provider."""

    def __init__(self, tuning: Tuning) -> None:
        self._tuning = tuning
        self._ledgers = {p: self._empty() for p in PROVIDERS}

    def record(
        self,
        provider: str,
        recipients: Iterable[str],
        *,
        message_id: str,
        size: int,
        request: Any,
        attachments: Sequence[Mapping[str, object]] = (),
    ) -> None:
        """Count one accepted request; keep ``request`` unless it is larger than allowed, and
        its files' names and sizes (``attachments``) always."""
        ledger = self._ledgers[provider]
        ledger.requests += 1
        counts = ledger.by_recipient
        cap = self._tuning.max_tracked_recipients
        for address in recipients:
            key = address.lower()
            ledger.recipients += 1
            if key in counts:
                counts[key] += 1
            elif len(counts) < cap:
                counts[key] = 1
            else:
                ledger.untracked += 1
        kept = request if size <= self._tuning.recent_body_bytes else {"truncated": True}
        now = time.time()
        ledger.arrivals.append(now)
        ledger.recent.append(
            {
                "message_id": message_id,
                "received_at": now,
                "bytes": size,
                "request": kept,
                "attachments": [dict(a) for a in attachments],
            }
        )

    def accepted(self, provider: str, address: str) -> int:
        """How many times ``provider`` accepted mail for ``address``."""
        return self._ledgers[provider].by_recipient.get(address.lower(), 0)

    def snapshot(
        self, *, email: str | None = None, recent: int | None = None, times: bool = False
    ) -> dict[str, Any]:
        """The ``GET /_control/sends`` document, optionally for one address only, and with
        every kept arrival time."""
        result: dict[str, Any] = {}
        for provider, ledger in self._ledgers.items():
            if email is None:
                by_recipient = dict(ledger.by_recipient)
            else:
                by_recipient = {email.lower(): ledger.by_recipient.get(email.lower(), 0)}
            requests = list(ledger.recent)
            result[provider] = {
                "requests": ledger.requests,
                "recipients": ledger.recipients,
                "untracked_recipients": ledger.untracked,
                "by_recipient": by_recipient,
                "recent": requests
                if recent is None
                else requests[max(0, len(requests) - recent) :],
            }
            if times:
                result[provider]["arrivals"] = list(ledger.arrivals)
        return result

    def reset(self) -> None:
        self._ledgers = {p: self._empty() for p in PROVIDERS}

    def _empty(self) -> _ProviderLedger:
        return _ProviderLedger(recent=deque(maxlen=self._tuning.recent_requests))
