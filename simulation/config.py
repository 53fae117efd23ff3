"""What a scenario may set about the simulated deployment, the settings it runs with, and
the services' metrics (made once per OS process: what they count is not judged)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from services.webhooks.intake import IntakeMetrics
from shared.infra.config import (
    ApiSettings,
    ConsumerSettings,
    ProviderSettings,
    Settings,
    WebhookSettings,
)
from shared.infra.metrics import ApiMetrics, DispatchMetrics
from shared.ingest.ingest import IngestMetrics


@dataclass(frozen=True)
class Config:
    """What a scenario may set about the deployment."""

    chain: str = "sg,mg"
    max_attempts: int = 4
    query_api: tuple[str, ...] = ("sg", "mg")
    """Providers whose query API the account can use."""
    event_delays: tuple[float, ...] = (1.0, 4.0, 8.0)
    resolve_interval: int = 30
    query_after: int = 300
    webhook_window: int = 3600
    deferred_deadline: int = 4 * 3600
    quota: int = 100_000
    scripts: dict[str, tuple[str | None, ...]] = field(default_factory=dict)
    """How each provider's first calls go whatever the schedule (``send`` fault kinds)."""
    duplicate_posts: bool = False
    """Whether the providers deliver every webhook post twice."""
    outages: tuple[tuple[float, float], ...] = ()
    """Windows (start, seconds) in which Cassandra answers nothing."""
    answers_lost: int = 0
    """How many of the API's first answers never reach their client, whatever the schedule."""
    relays: tuple[str, ...] = ()
    """Providers that answer recipient by recipient, as an SMTP relay does, and report
    nothing afterwards (``simulation.providers.relay_answer``)."""


@dataclass
class Metrics:
    """Prometheus metrics, made once per OS process (what they count is not judged)."""

    api: ApiMetrics
    dispatch: DispatchMetrics
    ingest: IngestMetrics
    intake: IntakeMetrics

    @classmethod
    def create(cls) -> Metrics:
        registry = CollectorRegistry()
        return cls(
            ApiMetrics.create(registry),
            DispatchMetrics.create(registry),
            IngestMetrics.create(registry),
            IntakeMetrics.create(registry),
        )


_METRICS: list[Metrics] = []


def metrics() -> Metrics:
    """The metrics every simulated run shares (registering them costs more than a run)."""
    if not _METRICS:
        _METRICS.append(Metrics.create())
    return _METRICS[0]


_SETTINGS: dict[str, Settings] = {}


def settings_for(config: Config) -> Settings:
    """The deployment's settings (made once per configuration: validating them costs more
    than a whole simulated run)."""
    key = repr(config)
    made = _SETTINGS.get(key)
    if made is None:
        made = _SETTINGS[key] = _make_settings(config)
    return made


def _make_settings(config: Config) -> Settings:
    return Settings(
        providers=ProviderSettings(
            chain=config.chain,
            max_attempts=config.max_attempts,
            backoff="5,30",
            timeout=10.0,
            resolve_interval=config.resolve_interval,
            query_after=config.query_after,
            webhook_window=config.webhook_window,
        ),
        webhooks=WebhookSettings(deferred_deadline=config.deferred_deadline),
        api=ApiSettings(sender_domains="any", daily_recipient_quota=config.quota),
        # A canary is judged on a few recipients, soon (the defaults want 100 and an hour).
        consumers=ConsumerSettings(canary_min_sent=2, canary_window=60.0, canary_deadline=600.0),
    )
