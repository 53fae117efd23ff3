"""The broker topology as data: exchange and queue names, bindings, arguments and routing keys.

Pure: nothing here talks to RabbitMQ (``shared.infra.broker`` declares what :class:`Topology`
describes). Routing keys are the contract of ``design.md``:

* ``batch.<batch_uuid>``                                  a newly accepted batch
* ``<ns>.<batch_uuid>`` / ``<ns>.<batch_uuid>.retry.<n>``  a chunk dispatched to provider ``ns``
* ``bulk.<ns>.<batch_uuid>[.retry.<n>]``                  the same, for a batch in the bulk lane
* ``log.<ns>.<log_uuid>`` / ``log.<ns>.<log_uuid>.retry.<n>``  one recipient re-sent via ``ns``

The bulk lane (``shared.core.lanes``) has queues of its own per provider, bound to
``bulk.<ns>.#``: its first word is not a provider code, so the transactional queues' ``<ns>.#``
bindings never match it and a draining newsletter never waits in front of a password reset.
Recipient re-sends (``log.``) have no lane: each is one recipient, small next to any chunk.

and one of our own: ``hook.<ns>``, a verified webhook delivery from ``ns`` queued for when
Cassandra is back (``services.webhooks.intake``), and ``whook.<endpoint_uuid>``, "a user's
webhook endpoint has events to deliver" (``services.hooks``).

Every name is derived from the exchange name, so a test can declare a private copy of the
whole topology under a random exchange name.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.core.catalog import CODES
from shared.core.digits import natural
from shared.core.lanes import Priority

#: Provider short codes that may appear as the first word of a dispatch key.
PROVIDER_CODES = CODES

#: Header that routes a message to a delay queue on the delay (headers) exchange. It must not
#: start with ``x-``: a headers exchange ignores such headers when matching, so every binding
#: would match and a delayed message would land in every delay queue.
DELAY_HEADER = "safedelivr-delay"
#: The header name of earlier releases (matched every delay queue); its bindings are removed.
LEGACY_DELAY_HEADER = "x-safedelivr-delay"

Kind = Literal["batch", "dispatch", "log"]
#: The first word of a bulk-lane dispatch key.
BULK = "bulk"


@dataclass(frozen=True, slots=True)
class RoutingKey:
    """A parsed routing key; ``attempt`` counts the attempts made before this one."""

    kind: Kind
    id: uuid.UUID
    provider: str | None = None
    attempt: int = 0
    lane: Priority = "transactional"
    """A dispatch key's lane (batch and re-send keys are always ``transactional``)."""

    def __str__(self) -> str:
        if self.kind == "batch":
            return batch_key(self.id)
        assert self.provider is not None  # noqa: S101 - constructor invariant
        if self.kind == "dispatch":
            return dispatch_key(self.provider, self.id, self.attempt, self.lane)
        return log_key(self.provider, self.id, self.attempt)


def batch_key(batch_id: uuid.UUID) -> str:
    return f"batch.{batch_id}"


def dispatch_key(
    provider: str, batch_id: uuid.UUID, attempt: int = 0, lane: Priority = "transactional"
) -> str:
    """The key of attempt ``attempt`` of a chunk of ``batch_id`` via ``provider``, in ``lane``."""
    _check_provider(provider)
    prefix = f"{BULK}." if lane == "bulk" else ""
    return f"{prefix}{provider}.{batch_id}" + (f".retry.{attempt}" if attempt else "")


def log_key(provider: str, log_id: uuid.UUID, attempt: int = 0) -> str:
    """The key of one recipient's re-send; laneless: a single recipient never makes a queue
    wait long, whichever batch it belongs to."""
    _check_provider(provider)
    return f"log.{provider}.{log_id}" + (f".retry.{attempt}" if attempt else "")


def wake_key(endpoint_id: uuid.UUID) -> str:
    """The routing key that wakes a user's webhook endpoint."""
    return f"whook.{endpoint_id}"


def parse_wake_key(key: str) -> uuid.UUID:
    """The endpoint a wake key names; ValueError for anything else."""
    kind, _, rest = key.partition(".")
    if kind != "whook":
        raise ValueError(f"not a webhook wake key: {key!r}")
    return _uuid(rest, key)


def parse_routing_key(key: str) -> RoutingKey:
    """Parse any of our routing keys; raise ValueError for anything else."""
    parts = key.split(".")
    if parts[0] == "batch" and len(parts) == 2:
        return RoutingKey("batch", _uuid(parts[1], key))
    lane: Priority = "transactional"
    if parts[0] == BULK:
        # Only a dispatch key has a lane: what follows must start with a provider code.
        parts, lane = parts[1:] or [""], "bulk"
        if parts[0] == "log":
            raise ValueError(f"not a Safedelivr routing key: {key!r}")
    if parts[0] == "log":
        provider, rest = (parts[1], parts[2:]) if len(parts) >= 3 else ("", [])
        kind: Kind = "log"
    else:
        provider, rest, kind = parts[0], parts[1:], "dispatch"
    if provider not in PROVIDER_CODES or len(rest) not in (1, 3):
        raise ValueError(f"not a Safedelivr routing key: {key!r}")
    attempt = 0
    if len(rest) == 3:
        retry = natural(rest[2], max_digits=6)
        if rest[1] != "retry" or retry is None or retry < 1:
            raise ValueError(f"bad retry suffix in routing key: {key!r}")
        attempt = retry
    return RoutingKey(kind, _uuid(rest[0], key), provider, attempt, lane)


def _uuid(text: str, key: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ValueError(f"bad uuid in routing key: {key!r}") from None


def _check_provider(provider: str) -> None:
    if provider not in PROVIDER_CODES:
        raise ValueError(f"unknown provider code {provider!r}")


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """One queue: its arguments and the (exchange, binding key or headers) pairs that feed it."""

    name: str
    arguments: dict[str, Any]
    bindings: tuple[tuple[str, str], ...] = ()
    header_binding: tuple[str, dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class Topology:
    """Names and arguments of every exchange and queue, derived from the main exchange."""

    exchange: str = "safedelivr"
    providers: tuple[str, ...] = PROVIDER_CODES
    delay_tiers: tuple[int, ...] = (5, 30, 120, 600)
    delivery_limit: int = 10
    extra_delay_tiers: tuple[int, ...] = field(default=())

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.exchange}.dlx"

    @property
    def delay_exchange(self) -> str:
        return f"{self.exchange}.delay"

    @property
    def settings_exchange(self) -> str:
        """Fanout: "the live settings changed"; each process listens with a queue of its own."""
        return f"{self.exchange}.settings"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.exchange}.dead"

    @property
    def batches_queue(self) -> str:
        return f"{self.exchange}.batches"

    @property
    def webhooks_queue(self) -> str:
        return f"{self.exchange}.webhooks"

    @property
    def hooks_queue(self) -> str:
        """Wake-ups of users' webhook endpoints (``whook.<endpoint_uuid>``)."""
        return f"{self.exchange}.whooks"

    def provider_queue(self, provider: str) -> str:
        return f"{self.exchange}.{provider}"

    def bulk_queue(self, provider: str) -> str:
        """The bulk lane's chunks for ``provider`` (``bulk.<ns>.#``)."""
        return f"{self.exchange}.{provider}.bulk"

    def lane_queue(self, provider: str, lane: Priority) -> str:
        return self.bulk_queue(provider) if lane == "bulk" else self.provider_queue(provider)

    def log_queue(self, provider: str) -> str:
        return f"{self.exchange}.log.{provider}"

    def sender_queues(self, provider: str) -> tuple[str, str, str]:
        """Every queue a provider's sender consumes: its two lanes, then its re-sends."""
        return (self.provider_queue(provider), self.bulk_queue(provider), self.log_queue(provider))

    def delay_queue(self, seconds: int) -> str:
        return f"{self.exchange}.delay.{seconds}s"

    @property
    def all_delay_tiers(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.delay_tiers) | set(self.extra_delay_tiers)))

    def delay_tier_for(self, seconds: float) -> int:
        """The smallest declared tier that waits at least ``seconds`` (else the largest)."""
        tiers = self.all_delay_tiers
        return next((t for t in tiers if t >= seconds), tiers[-1])

    def work_queues(self) -> list[QueueSpec]:
        """Queues that consumers read; poison messages dead-letter to the dead queue."""
        args = {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": self.dead_letter_exchange,
            # At-least-once dead-lettering needs reject-publish overflow (RabbitMQ docs, DLX).
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }
        specs = [
            QueueSpec(self.batches_queue, args, ((self.exchange, "batch.#"),)),
            QueueSpec(self.webhooks_queue, args, ((self.exchange, "hook.#"),)),
            # Added in a later release: every service declares the whole topology at
            # start-up (and ``safedelivr topology`` does), so existing deployments get it.
            QueueSpec(self.hooks_queue, args, ((self.exchange, "whook.#"),)),
        ]
        for p in self.providers:
            specs.append(QueueSpec(self.provider_queue(p), args, ((self.exchange, f"{p}.#"),)))
            specs.append(QueueSpec(self.log_queue(p), args, ((self.exchange, f"log.{p}.#"),)))
            # Added with the bulk lane; existing deployments get it at declare time too.
            specs.append(QueueSpec(self.bulk_queue(p), args, ((self.exchange, f"{BULK}.{p}.#"),)))
        return specs

    def delay_queues(self) -> list[QueueSpec]:
        """One queue per delay tier; expiry dead-letters back to the main exchange."""
        return [
            QueueSpec(
                self.delay_queue(t),
                {
                    "x-queue-type": "quorum",
                    "x-message-ttl": t * 1000,
                    "x-dead-letter-exchange": self.exchange,
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                },
                header_binding=(self.delay_exchange, {"x-match": "all", DELAY_HEADER: str(t)}),
            )
            for t in self.all_delay_tiers
        ]

    def dead_queue(self) -> QueueSpec:
        return QueueSpec(
            self.dead_letter_queue,
            {"x-queue-type": "quorum"},
            ((self.dead_letter_exchange, ""),),
        )

    def queues(self) -> list[QueueSpec]:
        return [*self.work_queues(), *self.delay_queues(), self.dead_queue()]
