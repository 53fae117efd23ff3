"""A batch request naming a template: the version(s) it gets, rendered once, and the body
the ordinary validation then checks (``shared.template_use`` owns the rendering rules).

``template_id`` (and optionally ``version``, and ``data`` for the variables the whole batch
shares) replace ``subject``/``html``/``text``. Without ``version`` the batch gets the live
version, and a canary beside it when one is rolling out. The answer of every refusal is a
422 naming the field.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from shared import template_use
from shared.http import ApiError
from shared.models import TemplateCopy
from shared.template_render import RenderError
from shared.templates import Template, TemplateStore, Version

#: Fields of a batch request that only a template batch has.
TEMPLATE_FIELDS: Final = ("template_id", "version", "data")
#: Fields a template batch may not carry: the template has them.
CONTENT_FIELDS: Final = ("subject", "html", "text")


@dataclass(frozen=True, slots=True)
class Plan:
    """What a template batch sends: the live copy, and the canary's with its share."""

    template_id: uuid.UUID
    live: TemplateCopy
    canary: TemplateCopy | None = None
    percent: float = 0.0
    since: datetime | None = None
    """When the canary's rollout started."""


def _invalid(field: str, problem: str) -> ApiError:
    return ApiError(
        422, "invalid_fields", "the request has invalid fields", fields={field: problem}
    )


def _template_id(value: object) -> uuid.UUID:
    if not isinstance(value, str):
        raise _invalid("template_id", "must be a template id (a UUID string)")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise _invalid("template_id", "must be a template id (a UUID string)") from None


def _requested_version(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise _invalid("version", "must be a version number (1 or more)")
    return value


def _data(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid("data", "must be an object of the template's variables")
    return value


def _source(version: Version) -> template_use.Source:
    return template_use.Source(version.version, version.subject, version.html, version.text)


@dataclass(frozen=True, slots=True)
class TemplateBatches:
    store: TemplateStore

    async def prepare(
        self, user_id: uuid.UUID, body: Mapping[str, Any]
    ) -> tuple[dict[str, Any], Plan]:
        """The body with the template's content in place of its template fields, and the
        plan. Raises ApiError 422 (unknown template or version, no live version, content
        given as well, a version that does not render, a recipient missing a variable)."""
        template_id = _template_id(body.get("template_id"))
        requested = _requested_version(body.get("version"))
        data = _data(body.get("data"))
        for field in CONTENT_FIELDS:
            if field in body:
                raise _invalid(field, "comes from the template: leave it out")
        template = await self.store.get(user_id, template_id)
        if template is None:
            raise _invalid("template_id", "no such template of yours")
        live, canary = await self._versions(template, requested)
        personal = template_use.per_recipient(_source(live), data)
        if canary is not None:
            personal |= template_use.per_recipient(_source(canary), data)
        to = _with_markers(body.get("to"), personal)
        try:
            live_copy = await asyncio.to_thread(
                template_use.render_once, _source(live), data, personal
            )
            canary_copy = (
                await asyncio.to_thread(template_use.render_once, _source(canary), data, personal)
                if canary is not None
                else None
            )
        except RenderError as exc:
            raise ApiError(
                422, "template_does_not_render", f"the template does not render: {exc}"
            ) from None
        rest = {k: v for k, v in body.items() if k not in TEMPLATE_FIELDS}
        plain = {**rest, "to": to, "subject": live_copy.subject}
        for field, value in (("html", live_copy.html), ("text", live_copy.text)):
            if value is not None:
                plain[field] = value
        if canary_copy is None:
            return plain, Plan(template_id, live_copy)
        return plain, Plan(
            template_id,
            live_copy,
            canary_copy,
            template.canary_percent or 0.0,
            template.canary_since or datetime.now(UTC),
        )

    async def _versions(
        self, template: Template, requested: int | None
    ) -> tuple[Version, Version | None]:
        tid = template.template_id
        if requested is not None:
            version = await self.store.version(tid, requested)
            if version is None:
                raise _invalid("version", f"the template has no version {requested}")
            return version, None
        if template.live_version is None:
            raise _invalid(
                "template_id", "the template has no live version: publish one (or name a version)"
            )
        live = await self.store.version(tid, template.live_version)
        if live is None:  # pragma: no cover - versions are written before they are published
            raise _invalid("template_id", "the template's live version is missing")
        canary = None
        if template.canary_version is not None and template.canary_percent:
            canary = await self.store.version(tid, template.canary_version)
        return live, canary


def _with_markers(to: object, personal: frozenset[str]) -> object:
    """``to`` with each recipient's values of the per-recipient variables as substitutions
    of their markers (left as it is when the template has none: validation checks it)."""
    if not personal:
        return to
    if not isinstance(to, list):
        raise _invalid(
            "to",
            "must be a list of {email, substitutions} objects: the template uses "
            f"per-recipient variables ({', '.join(sorted(personal))})",
        )
    out: list[object] = []
    for index, entry in enumerate(to):
        subs = entry.get("substitutions") if isinstance(entry, dict) else None
        if not isinstance(subs, dict):
            subs = {}
        lacking = sorted(n for n in personal if not isinstance(subs.get(n), str))
        if lacking:
            raise _invalid(
                f"to[{index}].substitutions",
                f"needs {', '.join(lacking)} (the template's per-recipient variables; "
                "variables shared by the whole batch go in data)",
            )
        assert isinstance(entry, dict)  # noqa: S101 - subs came from it
        kept = {k: v for k, v in subs.items() if k not in personal}
        out.append(
            {
                **entry,
                "substitutions": {
                    **kept,
                    **template_use.recipient_substitutions(subs, personal),
                },
            }
        )
    return out
