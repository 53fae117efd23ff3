"""What live settings and providers' health decide for one consumer process, as one value.

A :class:`Running` is replaced whole (``shared.infra.current.Current``) by the live-settings
applier (``services.consumers.live``) and never mutated: the dispatcher, its collaborators,
the hand-off and the splitter call the cell at the point of use, so each decision sees one
consistent set of values and every reader the latest one. Static configuration (timeouts,
backoff, resolve intervals) stays in ``ProviderSettings``: live settings never change it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from shared.delivery.domain_capacity import CapacityRules
from shared.infra.config import ProviderSettings
from shared.ops.livesettings import LiveSettings


@dataclass(frozen=True, slots=True)
class Running:
    """The settings in force in this consumer process (a ``shared.delivery.handoff.Route``)."""

    chain: tuple[str, ...]
    """The running chain, health-ordered; its head is where new chunks go."""
    paused: frozenset[str] = frozenset()
    """Providers an operator paused: their jobs go to the next provider, uncalled."""
    max_attempts: int = 6
    """Attempts a chunk or recipient may use (hops skipped without a call not counted)."""
    limits: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """Requests per second by provider code, shared by every process; absent or 0: none."""
    capacity: CapacityRules = field(default_factory=CapacityRules)
    """The sending domains' daily capacity rules (``shared.delivery.domain_capacity``)."""

    @classmethod
    def start(cls, settings: ProviderSettings, *, capacity: CapacityRules | None = None) -> Running:
        """The env's values, in force until the live settings are loaded (``capacity``:
        rules to start with, for a process that loads no live settings)."""
        return cls(
            chain=settings.chain_codes,
            max_attempts=settings.max_attempts,
            capacity=capacity or CapacityRules(),
        )

    @classmethod
    def of(cls, live: LiveSettings, chain: tuple[str, ...], configured: Sequence[str]) -> Running:
        """The values ``live`` decides, with ``chain`` the running chain as health ordered it
        (pure): only this process's ``configured`` providers can be paused here."""
        return cls(
            chain=chain,
            paused=live.paused & frozenset(configured),
            max_attempts=live.max_attempts,
            limits=MappingProxyType(live.limits()),
            capacity=live.capacity,
        )
