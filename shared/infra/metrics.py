"""Prometheus metrics, one registry per application (never the global default registry)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.process_collector import ProcessCollector


def new_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)  # RSS, CPU seconds, open fds of this process
    return registry


@dataclass(frozen=True)
class ApiMetrics:
    batches: Counter
    recipients: Counter
    deferred_publishes: Counter
    accept_seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ApiMetrics:
        return cls(
            Counter("safedelivr_batches_accepted", "Batches accepted (202)", registry=registry),
            Counter("safedelivr_recipients_accepted", "Recipients accepted", registry=registry),
            Counter(
                "safedelivr_publish_deferred",
                "Accepted batches left to the outbox relay",
                registry=registry,
            ),
            Histogram(
                "safedelivr_accept_seconds",
                "Time to store and publish a batch",
                buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
                registry=registry,
            ),
        )


@dataclass(frozen=True)
class DispatchMetrics:
    chunks_sent: Counter
    recipients_sent: Counter
    attempts_failed: Counter
    recipients_failed: Counter
    ambiguous: Counter
    resolutions: Counter
    lookups: Counter
    recipients_suppressed: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> DispatchMetrics:
        return cls(
            Counter(
                "safedelivr_chunks_sent",
                "Chunks a provider accepted",
                ["provider"],
                registry=registry,
            ),
            Counter(
                "safedelivr_recipients_sent",
                "Recipients a provider accepted",
                ["provider"],
                registry=registry,
            ),
            Counter(
                "safedelivr_attempts_failed",
                "Failed provider attempts",
                ["provider", "kind"],
                registry=registry,
            ),
            Counter(
                "safedelivr_recipients_failed", "Recipients that ended failed", registry=registry
            ),
            Counter(
                "safedelivr_attempts_ambiguous",
                "Attempts whose outcome was unknown",
                ["provider"],
                registry=registry,
            ),
            Counter(
                "safedelivr_attempts_resolved",
                "Ambiguous attempts resolved by evidence, by resolution",
                ["provider", "resolution"],
                registry=registry,
            ),
            Counter(
                "safedelivr_provider_lookups",
                "Questions to a provider's query API about ambiguous attempts, by result",
                ["provider", "result"],
                registry=registry,
            ),
            Counter(
                "safedelivr_recipients_suppressed",
                "Recipients dropped at send time: on the suppression list since acceptance",
                registry=registry,
            ),
        )


@dataclass(frozen=True)
class DeadLetterMetrics:
    """Dead letters archived by this process, and how many wait for an operator (counted
    from the archive, so every consumer process reports the same number)."""

    archived: Counter
    waiting: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> DeadLetterMetrics:
        return cls(
            Counter(
                "safedelivr_dead_letters_archived",
                "Dead letters taken from the dead-letter queue into the archive",
                ["queue"],
                registry=registry,
            ),
            Gauge(
                "safedelivr_dead_letters_waiting",
                "Archived dead letters not replayed yet (see GET /v1/dead-letters)",
                registry=registry,
            ),
        )


@dataclass(frozen=True)
class HookMetrics:
    """The delivery worker of users' webhooks."""

    attempts: Counter
    disabled: Counter
    seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> HookMetrics:
        return cls(
            Counter(
                "safedelivr_user_webhook_attempts",
                "Deliveries attempted to users' endpoints, by result (ok, failed)",
                ["result"],
                registry=registry,
            ),
            Counter(
                "safedelivr_user_webhooks_disabled",
                "Endpoints disabled after failing too long",
                registry=registry,
            ),
            Histogram(
                "safedelivr_user_webhook_seconds",
                "Time one delivery took",
                buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
                registry=registry,
            ),
        )
