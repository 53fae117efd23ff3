"""Knobs of the sandbox that are not operator configuration: batching, retries, memory bounds.

Operators configure the sandbox through :class:`shared.infra.config.SandboxSettings`; these values
shape how it imitates the providers and how much it remembers, and tests shrink them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tuning:
    """How the sandbox batches, retries and bounds its memory."""

    sendgrid_batch_size: int = 500
    """Most events in one SendGrid Event Webhook POST."""
    sendgrid_batch_wait: float = 0.2
    """Seconds SendGrid events are collected before a partial batch is posted."""
    sendgrid_workers: int = 4
    """Concurrent SendGrid webhook POSTs."""
    mailgun_workers: int = 8
    """Concurrent Mailgun webhook POSTs (Mailgun posts one event per request). More is slower:
    httpx's pool costs grow with its connections (measured: 8 → 1,600 events/s, 32 → 400)."""
    ses_workers: int = 4
    """Concurrent SNS notification POSTs (SES events, one per POST)."""
    retry_delays: tuple[float, ...] = (0.5, 1, 2, 5, 10, 20, 30, 60, 60, 60, 120, 300, 600)
    """Waits before each retry of a failed webhook POST; its length is the number of retries.
    The real providers retry for hours (SendGrid 24 h, Mailgun 8 h); this keeps trying for
    about 20 minutes, enough to outlast a restart of the webhook service or a broker."""
    post_timeout: float = 10.0
    """Seconds one webhook POST may take."""
    max_pending_events: int = 500_000
    """Events queued or awaiting a retry, per provider, beyond which new events are dropped
    and counted, so a dead webhook service cannot exhaust memory."""
    max_scheduled_recipients: int = 500_000
    """Recipients of accepted requests still waiting for their webhook delay, beyond which
    new requests get no events (and are counted)."""
    max_indexed_recipients: int = 1_000_000
    """Accepted recipients the query APIs remember per provider (the oldest are forgotten)."""
    max_tracked_recipients: int = 200_000
    """Distinct addresses whose accept counts are kept per provider; later ones are counted
    only in the totals."""
    recent_requests: int = 20
    """Accepted raw requests kept per provider for inspection."""
    recent_body_bytes: int = 256_000
    """Accepted bodies larger than this are kept as a size marker only."""
    github_default_login: str = "sandbox-user"
    """The GitHub user the OAuth stand-in approves when ``login`` is not given."""
