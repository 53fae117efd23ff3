"""Each user's templates and their immutable versions: the one writer of ``templates`` and
``template_versions``.

A template is created with its first version. A new version takes the next number by a
lightweight transaction on the template's ``next_version`` (two at once never share one),
then its row is written: a writer that dies in between (or is refused a place under the
cap) leaves a gap in the numbers, never a half-written version (versions are immutable,
written once, and deleted whole). Publishing names the live
version, or a canary with its share beside the live one; whether a version renders with its
sample data is checked before (``shared.templates.template_render``), not here. Publishing and the
canary judge's conclusion are conditional updates on what their writer read, so neither
silently undoes the other (a publish racing a promotion gets :class:`TemplateChanged`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from shared.infra.db import Database, Row, utc


class TemplateChanged(Exception):
    """The template's live version or canary changed since it was read (another publish,
    or the canary judge's verdict): nothing was written; read it again and decide."""


class TemplateGone(LookupError):
    """The template was deleted while a version was being added to it."""


@dataclass(frozen=True, slots=True)
class Version:
    version: int
    subject: str
    html: str | None
    text: str | None
    sample: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class VersionHeader:
    """A version without its sources: what listings show."""

    version: int
    subject: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Template:
    user_id: uuid.UUID
    template_id: uuid.UUID
    name: str
    live_version: int | None
    canary_version: int | None
    canary_percent: float | None
    canary_since: datetime | None
    created_at: datetime
    verdict: str | None = None
    """The last canary verdict the judge applied, as ``shared.templates.canary_store`` encodes
    it."""


class StoredTemplates(Protocol):
    """What callers use of :class:`TemplateStore` (the store, or its in-memory twin)."""

    async def create(
        self,
        user_id: uuid.UUID,
        name: str,
        subject: str,
        html: str | None,
        text: str | None,
        sample: dict[str, Any],
        template_id: uuid.UUID | None = None,
    ) -> uuid.UUID: ...

    async def add_version(
        self,
        template: Template,
        subject: str,
        html: str | None,
        text: str | None,
        sample: dict[str, Any],
    ) -> int: ...

    async def take_number(self, template: Template) -> int: ...

    async def write_version(
        self,
        template_id: uuid.UUID,
        number: int,
        subject: str,
        html: str | None,
        text: str | None,
        sample: dict[str, Any],
        at: datetime,
    ) -> None: ...

    async def delete(self, template: Template) -> bool: ...

    async def delete_version(self, template_id: uuid.UUID, number: int) -> None: ...

    async def get(self, user_id: uuid.UUID, template_id: uuid.UUID) -> Template | None: ...

    async def templates(self, user_id: uuid.UUID) -> list[Template]: ...

    async def versions(self, template_id: uuid.UUID) -> list[Version]: ...

    async def version_headers(self, template_id: uuid.UUID) -> list[VersionHeader]: ...

    async def version(self, template_id: uuid.UUID, number: int) -> Version | None: ...

    async def publish(
        self, template: Template, number: int, canary_percent: float | None = None
    ) -> Template: ...

    async def conclude(
        self, template: Template, since: datetime, live: int, verdict: str
    ) -> bool: ...


class TemplateStore:
    def __init__(self, db: Database) -> None:
        self.db = db

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
        """A new template with its version 1 (not yet live: publishing makes it so);
        ``template_id``: the id its place under the cap was claimed for."""
        template_id = template_id or uuid.uuid1()
        now = datetime.now(UTC)
        await self.write_version(template_id, 1, subject, html, text, sample, now)
        # A lightweight transaction, as every other write of the row: a plain insert carries
        # the client's microsecond timestamp, a transaction the server's milliseconds, so a
        # delete, or the next version's number taken, in the same millisecond (or within the
        # client's clock skew) would lose to it: the template back, or version 2 taken twice.
        # A retry after a timeout finds the row it made.
        await self.db.one(
            "INSERT INTO templates (user_id, template_id, name, next_version, created_at) "
            "VALUES (?, ?, ?, 2, ?) IF NOT EXISTS",
            (user_id, template_id, name, now),
        )
        return template_id

    async def add_version(
        self,
        template: Template,
        subject: str,
        html: str | None,
        text: str | None,
        sample: dict[str, Any],
    ) -> int:
        """The number of the new version (:meth:`take_number`, then
        :meth:`write_version`)."""
        number = await self.take_number(template)
        await self.write_version(
            template.template_id, number, subject, html, text, sample, datetime.now(UTC)
        )
        return number

    async def take_number(self, template: Template) -> int:
        """The next version's number, taken by a conditional update (retried on a race):
        nobody else gets it, whether or not its version is then written. Raises
        :class:`TemplateGone` when the template was deleted meanwhile."""
        while True:
            row = await self.db.one(
                "SELECT next_version FROM templates WHERE user_id = ? AND template_id = ?",
                (template.user_id, template.template_id),
                serial=True,
            )
            if row is None or row["next_version"] is None:
                raise TemplateGone(f"template {template.template_id} was deleted")
            number = int(row["next_version"])
            taken = await self.db.one(
                "UPDATE templates SET next_version = ? WHERE user_id = ? AND template_id = ? "
                "IF next_version = ?",
                (number + 1, template.user_id, template.template_id, number),
            )
            if taken is not None and taken["[applied]"]:
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
        await self.db.execute(
            "INSERT INTO template_versions (template_id, version, subject, html, text, sample, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (template_id, number, subject, html, text, orjson.dumps(sample).decode(), at),
            idempotent=True,
        )

    async def delete(self, template: Template) -> bool:
        """Delete the template, then its versions; False when there was no such template
        (its versions are deleted all the same). The template's row goes by a lightweight
        transaction, as its other changes do."""
        gone = await self.db.one(
            "DELETE FROM templates WHERE user_id = ? AND template_id = ? IF EXISTS",
            (template.user_id, template.template_id),
        )
        await self.db.execute(
            "DELETE FROM template_versions WHERE template_id = ?",
            (template.template_id,),
            idempotent=True,
        )
        return bool(gone and gone["[applied]"])

    async def delete_version(self, template_id: uuid.UUID, number: int) -> None:
        """Delete one version (whether it is live or in canary is the caller's to check)."""
        await self.db.execute(
            "DELETE FROM template_versions WHERE template_id = ? AND version = ?",
            (template_id, number),
            idempotent=True,
        )

    async def get(self, user_id: uuid.UUID, template_id: uuid.UUID) -> Template | None:
        row = await self.db.one(
            "SELECT user_id, template_id, name, live_version, canary_version, canary_percent, "
            "canary_since, created_at, verdict FROM templates "
            "WHERE user_id = ? AND template_id = ?",
            (user_id, template_id),
        )
        return _template(row) if row and _kept(row) else None

    async def templates(self, user_id: uuid.UUID) -> list[Template]:
        rows = await self.db.all_pages(
            "SELECT user_id, template_id, name, live_version, canary_version, canary_percent, "
            "canary_since, created_at, verdict FROM templates WHERE user_id = ?",
            (user_id,),
        )
        return [_template(r) for r in rows if _kept(r)]

    async def versions(self, template_id: uuid.UUID) -> list[Version]:
        """Newest first."""
        rows = await self.db.all_pages(
            "SELECT version, subject, html, text, sample, created_at FROM template_versions "
            "WHERE template_id = ?",
            (template_id,),
        )
        return [_version(r) for r in rows]

    async def version_headers(self, template_id: uuid.UUID) -> list[VersionHeader]:
        """Newest first, without the sources and samples (a listing reads a few bytes per
        version, not up to a megabyte)."""
        rows = await self.db.all_pages(
            "SELECT version, subject, created_at FROM template_versions WHERE template_id = ?",
            (template_id,),
        )
        return [
            VersionHeader(r["version"], r["subject"], utc(r["created_at"]) or datetime.now(UTC))
            for r in rows
        ]

    async def version(self, template_id: uuid.UUID, number: int) -> Version | None:
        row = await self.db.one(
            "SELECT version, subject, html, text, sample, created_at FROM template_versions "
            "WHERE template_id = ? AND version = ?",
            (template_id, number),
        )
        return _version(row) if row else None

    async def publish(
        self, template: Template, number: int, canary_percent: float | None = None
    ) -> Template:
        """Make ``number`` live (a rollback is publishing an older one), or its canary at
        ``canary_percent`` beside the live version: a conditional update on the live version
        and canary ``template`` was read with. Raises :class:`TemplateChanged`, writing
        nothing, when either moved meanwhile."""
        now = datetime.now(UTC)
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)  # as Cassandra keeps it
        if canary_percent is None or template.live_version is None:
            values: tuple[Any, ...] = (number, None, None, None)
        else:
            values = (template.live_version, number, canary_percent, now)
        row = await self.db.one(
            "UPDATE templates SET live_version = ?, canary_version = ?, canary_percent = ?, "
            "canary_since = ? WHERE user_id = ? AND template_id = ? "
            "IF live_version = ? AND canary_since = ?",
            (
                *values,
                template.user_id,
                template.template_id,
                template.live_version,
                template.canary_since,
            ),
        )
        if not (row and row["[applied]"]):
            raise TemplateChanged(f"template {template.template_id} changed while publishing")
        live, canary, percent, since = values
        return replace(
            template,
            live_version=live,
            canary_version=canary,
            canary_percent=percent,
            canary_since=since,
        )

    async def conclude(self, template: Template, since: datetime, live: int, verdict: str) -> bool:
        """End the canary rollout that started at ``since`` with ``live`` as the live
        version (the canary's: promoted; the old one: rolled back), keeping ``verdict`` with
        it. A conditional update: False, changing nothing, when the user published
        something else meanwhile (or another judge concluded it first)."""
        row = await self.db.one(
            "UPDATE templates SET live_version = ?, canary_version = null, "
            "canary_percent = null, canary_since = null, verdict = ? "
            "WHERE user_id = ? AND template_id = ? IF canary_since = ?",
            (live, verdict, template.user_id, template.template_id, since),
        )
        return bool(row and row["[applied]"])


def _kept(row: Row) -> bool:
    """Whether a row is a template: a deleted template's row brought back by a publish
    racing the deletion (its conditions on an unpublished template's empty cells hold on a
    missing row) has no name, and is none."""
    return row["name"] is not None


def _template(row: Row) -> Template:
    return Template(
        user_id=row["user_id"],
        template_id=row["template_id"],
        name=row["name"],
        live_version=row["live_version"],
        canary_version=row["canary_version"],
        canary_percent=row["canary_percent"],
        canary_since=utc(row["canary_since"]),
        created_at=utc(row["created_at"]) or datetime.now(UTC),
        verdict=row["verdict"],
    )


def _version(row: Row) -> Version:
    return Version(
        version=row["version"],
        subject=row["subject"],
        html=row["html"],
        text=row["text"],
        sample=orjson.loads(row["sample"] or "{}"),
        created_at=utc(row["created_at"]) or datetime.now(UTC),
    )
