"""How long and how hard each phase runs: the default run (~8 minutes) and ``--quick`` (~2)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from shared.infra.config import ConsumerSettings


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Every knob of a run; phases read only this (and earlier phases' results)."""

    quick: bool = False
    recipients: int = 100
    """Recipients per batch of the headline figures (N)."""
    big_recipients: int = 1000
    """Recipients per batch of the second end-to-end figure."""
    accept_warmup: float = 3.0
    accept_duration: float = 20.0
    accept_window: int = 64
    """Batches in flight in the raw acceptance loop."""
    api_levels: tuple[int, ...] = (16, 32, 64)
    """Closed-loop concurrency levels; the best throughput is the API's maximum."""
    api_warmup: float = 3.0
    api_duration: float = 12.0
    open_fractions: tuple[float, ...] = (0.5, 0.8)
    """Open-loop rates as fractions of the closed-loop maximum."""
    open_warmup: float = 3.0
    open_duration: float = 20.0
    prefetch: int = ConsumerSettings().prefetch
    """Prefetch of the raw dispatch loop: the consumers' default, for a like-for-like limit."""
    wide_prefetch: int = 64
    """Prefetch of the extra raw dispatch view (``l_e2e_wide``): is the limit CPU or latency?"""
    l_e2e_recipients: int = 250_000
    """Recipients in the raw dispatch loop's corpus (per batch size)."""
    e2e_seconds: float = 25.0
    """Intended length of an end-to-end drain; the corpus is sized from L_e2e to last this."""
    e2e_min_batches: int = 20
    e2e_max_recipients: int = 1_000_000
    e2e_timeout: float = 150.0
    """A drain still unfinished after this many seconds is reported as incomplete."""
    lanes_bulk_recipients: int = 1_000_000
    """Recipients of the bulk corpus the ``lanes`` phase drains (``--lanes-bulk``)."""
    lanes_bulk_batch: int = 10_000
    """Recipients per bulk batch (the API's largest batch)."""
    lanes_interval: float = 0.1
    """Seconds between two transactional batches while the bulk corpus drains."""
    lanes_timeout: float = 900.0
    """Longest bulk drain; transactional batches stop then."""
    lanes_target_p99: float = 2.0
    """Transactional p99 time to provider (seconds) the lanes must keep during a bulk drain."""
    rate_limit_per_s: float = 20.0
    """SendGrid's limit (calls/s, all consumer processes together) in the ``rate_limit`` phase."""
    rate_limit_spill_per_s: float = 10_000.0
    """Mailgun's limit meanwhile: far above what the consumers reach, so the spill never waits."""
    rate_limit_batches: int = 4_000
    """Single-recipient batches in the ``rate_limit`` flood: more than the consumers send in
    its two parts, so a backlog remains throughout (far above the limit times its length)."""
    rate_limit_baseline_seconds: float = 10.0
    """The flood's first part, without limits: the rate it offers and its CPU per call."""
    rate_limit_seconds: float = 30.0
    """The flood's limited part, once the limits are in force everywhere."""
    idle_seconds: float = 60.0
    """How long the ``idle`` phase samples the stack with no mail."""

    def quick_version(self) -> BenchConfig:
        return replace(
            self,
            quick=True,
            accept_warmup=2.0,
            accept_duration=8.0,
            api_levels=(32,),
            api_warmup=2.0,
            api_duration=6.0,
            open_warmup=1.0,
            open_duration=6.0,
            l_e2e_recipients=60_000,
            e2e_seconds=8.0,
            e2e_timeout=60.0,
            lanes_bulk_recipients=200_000,
            lanes_timeout=300.0,
            idle_seconds=20.0,
        )
