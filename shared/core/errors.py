"""Every error Safedelivr raises on purpose, as one tree.

* SafedelivrError
  + ConfigError                 bad or missing configuration, found at start-up
  + DependencyUnavailable       Cassandra or RabbitMQ cannot be reached right now (HTTP 503)
  + PublishError                the broker did not confirm, or returned, a publish
  + TooLargeToStore             Cassandra refused a write for its size; nothing of it applied
  + ProviderError               a provider call failed; ``retry_after`` says when to try again
    x TransientProviderError    429, 5xx, timeouts, connection errors: another provider may work
                                (``outcome_unknown`` for a 5xx, a timeout or a reset after the
                                request was written: only evidence may send it elsewhere)
      x ProviderSkipped         not called (paused, at its rate limit): spill over, no attempt used
        x CapacityHeld          not called: the sending domain is at today's capacity, or its
                                campaign is paused; held
    x WorkCancelled             not called: its campaign was cancelled; the recipients fail
    x ProviderMisconfigured     401/403, unknown domain: our side is wrong, try the next provider
    x PermanentProviderError    the request itself is bad (400, 413): no provider will accept it

Adapters translate library exceptions (aiormq, cassandra, httpx, sendgrid) into these at the
boundary with ``raise X(...) from exc``; service code never sees a library exception.
"""

from __future__ import annotations


class SafedelivrError(Exception):
    """Base class for the errors we raise deliberately."""


class ConfigError(SafedelivrError):
    """Configuration is missing or invalid; the message names the variable."""


class DependencyUnavailable(SafedelivrError):
    """A data service (Cassandra, RabbitMQ) is down or timing out."""

    def __init__(self, service: str, detail: str) -> None:
        super().__init__(f"{service} unavailable: {detail}")
        self.service = service
        self.detail = detail


class PublishError(DependencyUnavailable):
    """A publish was not confirmed (nack, timeout, connection lost) or was returned unroutable."""

    def __init__(self, detail: str) -> None:
        super().__init__("rabbitmq", detail)


class TooLargeToStore(SafedelivrError):
    """Cassandra refused a write for its size: a batch of statements over several partitions
    past ``batch_size_fail_threshold`` ("Batch too large"), or a mutation of one partition
    past ``max_mutation_size``. It was refused before it applied anywhere, and the same write
    will be refused again (the API answers 413: what it would store is too large)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"cassandra refused a write for its size: {detail}")
        self.detail = detail


class ProviderError(SafedelivrError):
    """A provider call failed.

    Args:
        provider: the provider code (``sg``, ``mg``).
        message: a human-readable reason, shown to users when recipients end ``failed``.
        status: the HTTP status, when there was a response.
        retry_after: seconds the provider asked us to wait, if it said.
        outcome_unknown: the request went out and nothing proves it was not processed (a
            read timeout, a connection lost after it was written, a 5xx answer): the provider
            may have accepted it, so resending risks a duplicate.
    """

    #: Whether another provider (or a later attempt) might succeed.
    retryable = True

    def __init__(
        self,
        provider: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        outcome_unknown: bool = False,
    ) -> None:
        super().__init__(f"{provider}: {message}")
        self.outcome_unknown = outcome_unknown
        self.provider = provider
        self.message = message
        self.status = status
        self.retry_after = retry_after


class TransientProviderError(ProviderError):
    """The provider is unhealthy or throttling us; the same request may succeed later."""


class ProviderSkipped(TransientProviderError):
    """The provider was not called: an operator paused it, or it is at its rate limit. The
    work moves on to the next provider (spill-over) without using up an attempt."""


class CapacityHeld(ProviderSkipped):
    """No provider was called: the batch's sending domain reached today's capacity
    (``shared.delivery.domain_capacity``). The chunk waits in a delay queue and goes to the same
    place later; no provider can help, so it does not spill over, and it uses up no attempt."""


class WorkCancelled(ProviderError):
    """No provider was called: the work's owner cancelled it (a cancelled campaign). Its
    recipients end failed with the reason; nothing is retried."""

    retryable = False


class ProviderMisconfigured(ProviderError):
    """Our credentials or account settings for this provider are wrong."""


class PermanentProviderError(ProviderError):
    """The request is invalid for every provider; retrying cannot help."""

    retryable = False
