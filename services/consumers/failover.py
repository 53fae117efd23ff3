"""What to do after a provider attempt fails: the failover policy as a pure function.

Attempt ``n`` (0-based; it travels as ``.retry.<n>``) goes to ``chain[n % len(chain)]``, so
failover walks the chain in its configured order and then cycles. The chain is the one in
force when the decision is made (live settings: reordered, paused providers left out). Each
time the walk wraps around to the start of the chain, the next attempt waits in a delay queue
(backoff tiers, the last one repeating), never in a ``sleep``; so does a provider tried again
before the walk wrapped (every other one refused or excluded). Turns passed over (a provider
that refused for good or is excluded) are no calls and use up none of the attempts. A
provider's ``Retry-After`` lengthens the wait when that same provider is next. Errors that no
provider can fix end the chunk at once. Work held at its sending domain's capacity goes to the
same provider again after the longest backoff (no other provider has more capacity for that
domain).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.core.errors import CapacityHeld, PermanentProviderError, ProviderError, WorkCancelled


@dataclass(frozen=True, slots=True)
class Retry:
    """Publish the chunk as attempt ``attempt`` to ``provider``, after ``delay`` seconds."""

    provider: str
    attempt: int
    delay: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop: the chunk's recipients end ``failed`` with ``reason``."""

    reason: str


Decision = Retry | GiveUp


def provider_for(chain: Sequence[str], attempt: int) -> str:
    return chain[attempt % len(chain)]


def decide(
    *,
    chain: Sequence[str],
    attempt: int,
    error: ProviderError,
    max_attempts: int,
    backoff: Sequence[int],
    permanent_from: frozenset[str] = frozenset(),
    excluded: frozenset[str] = frozenset(),
) -> Decision:
    """Decide the follow-up of failed attempt ``attempt``.

    Args:
        chain: provider codes in failover order.
        attempt: the attempt that just failed (0-based).
        error: why it failed.
        max_attempts: attempts allowed in total.
        backoff: delay tiers (seconds) applied each time the chain wraps around.
        permanent_from: providers that already refused this chunk as invalid.
        excluded: providers not to use for this line (those that dropped or deferred the
            recipient a re-send line is for).
    """
    if isinstance(error, WorkCancelled):
        return GiveUp(error.message)
    if isinstance(error, CapacityHeld):
        usable = [p for p in chain if p not in permanent_from | excluded] or list(chain)
        provider = error.provider if error.provider in usable else usable[0]
        return Retry(
            provider, attempt + 1, float(min(error.retry_after or backoff[-1], backoff[-1]))
        )
    refused = permanent_from | (
        {error.provider} if isinstance(error, PermanentProviderError) else set()
    )
    if refused >= set(chain):
        return GiveUp(f"rejected by every provider: {error.message}")
    refused |= excluded
    if refused >= set(chain):
        return GiveUp(f"no other provider is left to try; last: {error.provider} {error.message}")
    delay = 0.0
    nxt = attempt + 1
    # A provider outside the chain (paused or taken out by an operator since) hands its work
    # to the chain at once: it is the chain's first try, not a wrap-around.
    wraps = error.provider in chain
    wrapped = False
    while nxt < max_attempts:
        if wraps and nxt % len(chain) == 0:
            wrapped = True
            # `=` for `+=` is an equivalent mutant: the walk wraps at most once per decision (a
            # full cycle of the chain always reaches a provider not refused), so delay is 0.0 here.
            delay += backoff[  # pragma: no mutate
                min(nxt // len(chain) - 1, len(backoff) - 1)
            ]
        provider = provider_for(chain, nxt)
        if provider not in refused:
            if provider == error.provider:
                if not wrapped:
                    # The one that just failed, again before the walk wrapped (the others
                    # refused or excluded): never at once, as if it had wrapped.
                    delay = float(backoff[min(nxt // len(chain), len(backoff) - 1)])
                if error.retry_after:
                    delay = max(delay, error.retry_after)
            return Retry(provider, nxt, delay)
        nxt += 1
        # A turn passed over is no call: it uses up none of the attempts.
        max_attempts += 1
    return GiveUp(
        f"all {max_attempts} attempts failed across {', '.join(chain)}; last: "
        f"{error.provider} {error.message}"
    )
