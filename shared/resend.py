"""Choosing the provider for a single-recipient re-send after a provider-side failure (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: Provider-map values that mean "this provider failed this recipient".
_FAILED_PREFIXES = ("failed", "dropped", "deferred too long")


def next_provider(chain: Sequence[str], tried: Mapping[str, str], failed: str) -> str | None:
    """The first provider of the chain after ``failed`` that has not failed this recipient."""
    start = chain.index(failed) + 1 if failed in chain else 0
    for code in (*chain[start:], *chain[:start]):
        if code != failed and not tried.get(code, "").startswith(_FAILED_PREFIXES):
            return code
    return None
