"""Twins of the stores of :mod:`shared.templates`: templates and their canary rollouts.

In-memory twin of :class:`shared.templates.templates.TemplateStore`: each user's templates and
their immutable versions.

It keeps what the store's callers depend on: every round trip yields to the event loop, and a
new version's number is taken by compare-and-set on the template's ``next_version`` (retried
when another caller took it first), so concurrent callers never share a number; a deleted
template takes its versions with it, and a deleted version is gone for good; versions come
back newest first, samples as JSON round-trips them, timestamps as Cassandra returns them
(UTC, millisecond precision). ``tests/contracts/test_template_store.py`` runs one suite over
this twin and the real store.

In-memory twin of :class:`shared.templates.canary_store.CanaryStore`: the batches that carried
each rollout's canary, the namespace's rollouts waiting for a verdict, and each template's
verdicts.

It keeps what the judge and the API depend on: every round trip yields to the event loop;
a rollout is listed from the write of its first batch until it is judged or forgotten; a
verdict is keyed by its rollout's start (judging again overwrites it) and verdicts read back
newest rollout first; rows read back in Cassandra's order (``timeuuid`` order, then time) with
timestamps at Cassandra's precision (UTC, milliseconds) and counts as their JSON round-trips
them. ``tests/contracts/test_canary_store.py`` runs one suite over this twin and the real
store.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import orjson

from shared.delivery.recipients import timeuuid_order
from shared.templates.canary import Counts
from shared.templates.canary_store import Canaries, Outcome, Rollout
from shared.templates.templates import (
    StoredTemplates,
    Template,
    TemplateChanged,
    TemplateGone,
    Version,
    VersionHeader,
)
from tests.fakes.cassandra import Write, millis, ms
from tests.fakes.wire import LOOPBACK, Wire, round_trip


@dataclass
class _Row:
    template: Template
    next_version: int


class FakeTemplates(StoredTemplates):
    """Twin of :class:`shared.templates.templates.TemplateStore` (every operation)."""

    def __init__(self, wire: Wire = LOOPBACK) -> None:
        self.rows: dict[tuple[uuid.UUID, uuid.UUID], _Row] = {}
        self.version_rows: dict[uuid.UUID, dict[int, Version]] = {}
        self.wire = wire
        """How each round trip travels (``tests.fakes.wire``)."""

    async def create(
        self,
        user_id: uuid.UUID,
        name: str,
        subject: str,
        html: str | None,
        text: str | None,
        sample: dict[str, Any],
        template_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        template_id = template_id or uuid.uuid1()
        now = datetime.now(UTC)
        await self.write_version(template_id, 1, subject, html, text, sample, now)
        trip = await self.wire.trip("templates.create", "lwt")
        made = Template(user_id, template_id, name, None, None, None, None, millis(now))
        self.rows[(user_id, template_id)] = _Row(made, 2)
        trip.landed()
        return template_id

    async def add_version(
        self,
        template: Template,
        subject: str,
        html: str | None,
        text: str | None,
        sample: dict[str, Any],
    ) -> int:
        number = await self.take_number(template)
        await self.write_version(
            template.template_id, number, subject, html, text, sample, datetime.now(UTC)
        )
        return number

    async def take_number(self, template: Template) -> int:
        key = (template.user_id, template.template_id)
        while True:
            trip = await self.wire.trip("templates.next_version", "read")
            row = self.rows.get(key)
            trip.landed()
            if row is None:
                raise TemplateGone(f"template {template.template_id} was deleted")
            number = row.next_version
            trip = await self.wire.trip("templates.take_version", "lwt")
            taken = row is not None and row.next_version == number
            if taken:
                assert row is not None
                row.next_version = number + 1
            trip.landed()
            if taken:
                return number

    async def write_version(
        self,
        template_id: uuid.UUID,
        number: int,
        subject: str,
        html: str | None,
        text: str | None,
        sample: dict[str, Any],
        at: datetime,
    ) -> None:
        trip = await self.wire.trip("templates.write_version", "write")
        kept = orjson.loads(orjson.dumps(sample))
        written = Version(number, subject, html, text, kept, millis(at))
        self.version_rows.setdefault(template_id, {})[number] = written
        trip.landed()

    async def delete(self, template: Template) -> bool:
        trip = await self.wire.trip("templates.delete", "lwt")
        gone = self.rows.pop((template.user_id, template.template_id), None) is not None
        trip.landed()
        trip = await self.wire.trip("templates.delete_versions", "write")
        self.version_rows.pop(template.template_id, None)
        trip.landed()
        return gone

    @round_trip("templates.delete_version", "write")
    async def delete_version(self, template_id: uuid.UUID, number: int) -> None:
        self.version_rows.get(template_id, {}).pop(number, None)

    @round_trip("templates.get", "read")
    async def get(self, user_id: uuid.UUID, template_id: uuid.UUID) -> Template | None:
        row = self.rows.get((user_id, template_id))
        return row.template if row else None

    @round_trip("templates.templates", "read")
    async def templates(self, user_id: uuid.UUID) -> list[Template]:
        found = [row.template for (user, _), row in self.rows.items() if user == user_id]
        return sorted(found, key=lambda t: (t.template_id.time, t.template_id.bytes))

    @round_trip("templates.versions", "read")
    async def versions(self, template_id: uuid.UUID) -> list[Version]:
        found = self.version_rows.get(template_id, {})
        return [found[n] for n in sorted(found, reverse=True)]

    async def version_headers(self, template_id: uuid.UUID) -> list[VersionHeader]:
        return [
            VersionHeader(v.version, v.subject, v.created_at)
            for v in await self.versions(template_id)
        ]

    @round_trip("templates.version", "read")
    async def version(self, template_id: uuid.UUID, number: int) -> Version | None:
        return self.version_rows.get(template_id, {}).get(number)

    async def publish(
        self, template: Template, number: int, canary_percent: float | None = None
    ) -> Template:
        since = millis(datetime.now(UTC))
        if canary_percent is None or template.live_version is None:
            values: tuple[Any, ...] = (number, None, None, None)
        else:
            values = (template.live_version, number, canary_percent, since)
        live, canary, percent, since = values
        trip = await self.wire.trip("templates.publish", "lwt")
        row = self.rows.get((template.user_id, template.template_id))
        read = (template.live_version, template.canary_since)
        if row is None or (row.template.live_version, row.template.canary_since) != read:
            trip.landed()
            raise TemplateChanged(f"template {template.template_id} changed while publishing")
        fields = {
            "live_version": live,
            "canary_version": canary,
            "canary_percent": percent,
            "canary_since": since,
        }
        row.template = replace(row.template, **fields)
        trip.landed()
        return replace(template, **fields)

    @round_trip("templates.conclude", "lwt")
    async def conclude(self, template: Template, since: datetime, live: int, verdict: str) -> bool:
        row = self.rows.get((template.user_id, template.template_id))
        if row is None or row.template.canary_since != millis(since):
            return False
        row.template = replace(
            row.template,
            live_version=live,
            canary_version=None,
            canary_percent=None,
            canary_since=None,
            verdict=verdict,
        )
        return True


#: A rollout's key in ``canary_batches`` and ``canary_rollouts``: (template, since).
_Key = tuple[uuid.UUID, datetime]


@dataclass
class CanaryTables:
    """``canary_batches``, ``canary_rollouts`` and ``template_rollouts``, shared by the twins
    of one keyspace."""

    batches: dict[_Key, set[uuid.UUID]] = field(default_factory=dict)
    rollouts: dict[str, dict[_Key, Rollout]] = field(default_factory=dict)
    verdicts: dict[uuid.UUID, dict[datetime, Outcome]] = field(default_factory=dict)
    """template -> the rollout's start (exact: the row's key is a time UUID made of it)."""
    wire: Wire = LOOPBACK
    """How each round trip travels (``tests.fakes.wire``)."""


class FakeCanary(Canaries):
    """Twin of :class:`shared.templates.canary_store.CanaryStore` (every operation; ``statements``
    gives :data:`tests.fakes.cassandra.Write` s to apply with the batch's own write)."""

    def __init__(self, namespace: str, tables: CanaryTables | None = None) -> None:
        self.namespace = namespace
        self.tables = tables or CanaryTables()

    @property
    def wire(self) -> Wire:
        return self.tables.wire

    async def statements(self, rollout: Rollout, batch_id: uuid.UUID) -> list[Write]:
        key = (rollout.template_id, ms(rollout.since))

        def carried() -> None:
            self.tables.batches.setdefault(key, set()).add(batch_id)

        def listed() -> None:
            waiting = self.tables.rollouts.setdefault(self.namespace, {})
            waiting[key] = replace(rollout, since=key[1])

        return [carried, listed]

    @round_trip("canary.rollouts", "read")
    async def rollouts(self) -> list[Rollout]:
        waiting = self.tables.rollouts.get(self.namespace, {})
        return [waiting[k] for k in sorted(waiting, key=lambda k: (timeuuid_order(k[0]), k[1]))]

    @round_trip("canary.batches", "read")
    async def batches(self, rollout: Rollout) -> list[uuid.UUID]:
        found = self.tables.batches.get((rollout.template_id, ms(rollout.since)), set())
        return sorted(found, key=timeuuid_order)

    async def judged(self, rollout: Rollout, outcome: Outcome) -> None:
        trip = await self.wire.trip("canary.judged", "write")
        kept = replace(
            outcome,
            at=ms(outcome.at),
            canary=Counts(**_counts(outcome.canary)),
            live=Counts(**_counts(outcome.live)),
        )
        self.tables.verdicts.setdefault(rollout.template_id, {})[rollout.since] = kept
        trip.landed()
        await self.forget(rollout)

    @round_trip("canary.forget", "write")
    async def forget(self, rollout: Rollout) -> None:
        waiting = self.tables.rollouts.get(self.namespace, {})
        waiting.pop((rollout.template_id, ms(rollout.since)), None)

    @round_trip("canary.history", "read")
    async def history(self, template_id: uuid.UUID) -> list[Outcome]:
        verdicts = self.tables.verdicts.get(template_id, {})
        return [verdicts[s] for s in sorted(verdicts, reverse=True)]


def _counts(counts: Counts) -> dict[str, int]:
    """The counts as the audit row's JSON keeps them."""
    return {
        "sent": counts.sent,
        "provider_failures": counts.provider_failures,
        "hard_bounces": counts.hard_bounces,
        "complaints": counts.complaints,
    }
