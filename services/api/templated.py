"""A batch request naming a template: the version(s) it gets, rendered once, and the body
the ordinary validation then checks (``shared.templates.template_use`` owns the rendering rules).

``template_id`` (and optionally ``version``, and ``data`` for the variables the whole batch
shares) replace ``subject``/``html``/``text``. Without ``version`` the batch gets the live
version, and a canary beside it when one is rolling out. The answer of every refusal is a
422 naming the field.

Only the live copy goes on through the ordinary validation, so the canary's copy is checked
here by the same rules (its subject is a header: no line break, at most 998 characters), and
a per-recipient variable used in either copy's subject is header-bound: its values may not
break a line.

Parsing and rendering are one job of the renderer (``shared.templates.template_pool``: worker
processes under memory, CPU and time limits, each keeping the parts it compiled lately), so a
hostile template never stalls the API's event loop. A template that passes a limit is a 422
``template_does_not_render`` naming it in ``limit``; a renderer that cannot take the job now
(every worker busy, shutting down) a 503 ``renderer_unavailable``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from shared.core.addresses import text_problem
from shared.core.models import TemplateCopy
from shared.delivery import validation
from shared.infra.http import ApiError
from shared.templates import template_limits, template_use
from shared.templates.template_pool import Renderer, RendererUnavailable
from shared.templates.template_render import LimitError, RenderError
from shared.templates.templates import StoredTemplates, Template, Version

T = TypeVar("T")

#: Fields of a batch request that only a template batch has.
TEMPLATE_FIELDS: Final = ("template_id", "version", "data")
#: Fields a template batch may not carry: the template has them.
CONTENT_FIELDS: Final = ("subject", "html", "text")
#: What a body may not hold (as ``shared.delivery.validation`` refuses it in a request's own
#: bodies).
_BODY_FORBIDDEN: Final = re.compile("[\x00\ud800-\udfff]")
#: Longest render error told (one can quote a name from the template or the data).
MAX_ERROR: Final = 500


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
        found = uuid.UUID(value)
    except ValueError:
        raise _invalid("template_id", "must be a template id (a UUID string)") from None
    if found.version != 1:
        # Template ids are time UUIDs: another kind cannot name one (and the database would
        # refuse the query rather than find nothing).
        raise _invalid("template_id", "is not a template id (template ids are time UUIDs)")
    return found


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


def shortened(message: str) -> str:
    return message if len(message) <= MAX_ERROR else message[: MAX_ERROR - 1] + "…"


def render_refusal(exc: RenderError, what: str) -> ApiError:
    """The 422 of a template that does not render: ``what`` and why, each part's error as a
    field when they are known apart, and the limit it passed by name (pure)."""
    limit = str(exc.limit) if isinstance(exc, LimitError) else None
    told = f"{what}: {shortened(str(exc))}" + (f" (the {limit} limit)" if limit else "")
    fields = {part: shortened(why) for part, why in (exc.fields or {}).items()}
    named = (limit, template_limits.value_of(limit)) if limit else None
    return ApiError(422, "template_does_not_render", told, fields=fields or None, limit=named)


def renderer_refusal(exc: RendererUnavailable) -> ApiError:
    """The 503 of a renderer that cannot take a job now (pure)."""
    return ApiError(
        503,
        "renderer_unavailable",
        f"templates cannot be rendered right now ({exc}): try again",
        headers={"Retry-After": "1"},
    )


def _source(version: Version) -> template_use.Source:
    return template_use.Source(version.version, version.subject, version.html, version.text)


def copy_problems(copy: TemplateCopy) -> dict[str, str]:
    """Why a rendered copy cannot be sent, by field (empty: it can): the rules the ordinary
    validation applies to a request's subject and bodies (pure)."""
    problems: dict[str, str] = {}
    version = f"(version {copy.version})"
    if len(copy.subject) > validation.MAX_SUBJECT_LENGTH:
        problems["subject"] = (
            f"the template's subject {version} renders longer than "
            f"{validation.MAX_SUBJECT_LENGTH} characters"
        )
    elif (problem := text_problem(copy.subject)) is not None:
        problems["subject"] = f"the template's subject {version} {problem.message}"
    elif not copy.subject.strip():
        problems["subject"] = f"the template's subject {version} renders empty"
    for part, body in (("html", copy.html), ("text", copy.text)):
        if body is not None and _BODY_FORBIDDEN.search(body):
            problems[part] = (
                f"the template's {part} {version} must not contain NUL or lone surrogates"
            )
    if not any(body and body.strip() for body in (copy.html, copy.text)):
        problems["html"] = f"the template's html and text {version} both render empty"
    return problems


@dataclass(frozen=True, slots=True)
class TemplateBatches:
    store: StoredTemplates
    renderer: Renderer
    """Where versions are compiled and rendered (the app's pool of worker processes)."""

    async def prepare(
        self, user_id: uuid.UUID, body: Mapping[str, Any]
    ) -> tuple[dict[str, Any], Plan]:
        """The body with the template's content in place of its template fields, and the
        plan. Raises ApiError 422 (unknown template or version, no live version, content
        given as well, a version that does not parse or render, a copy whose subject or
        bodies could not be sent, a recipient missing a variable or breaking a subject)."""
        template_id = _template_id(body.get("template_id"))
        requested = _requested_version(body.get("version"))
        data = _data(body.get("data"))
        for name in CONTENT_FIELDS:
            if name in body:
                raise _invalid(name, "comes from the template: leave it out")
        template = await self.store.get(user_id, template_id)
        if template is None:
            raise _invalid("template_id", "no such template of yours")
        live, canary = await self._versions(template, requested)
        done = await self._run(
            "the template does not render",
            template_use.render_batch,
            _source(live),
            _source(canary) if canary is not None else None,
            data,
        )
        for copy in (done.live, done.canary):
            if copy is not None and (problems := copy_problems(copy)):
                raise ApiError(
                    422, "invalid_fields", "the request has invalid fields", fields=problems
                )
        headed = template_use.subject_variables((done.live, done.canary))
        to = _with_markers(body.get("to"), done.personal, headed)
        rest = {k: v for k, v in body.items() if k not in TEMPLATE_FIELDS}
        plain = {**rest, "to": to, "subject": done.live.subject}
        for name, value in (("html", done.live.html), ("text", done.live.text)):
            if value is not None:
                plain[name] = value
        if done.canary is None:
            return plain, Plan(template_id, done.live)
        return plain, Plan(
            template_id,
            done.live,
            done.canary,
            template.canary_percent or 0.0,
            template.canary_since or datetime.now(UTC),
        )

    async def personal(self, version: Version, data: Mapping[str, Any]) -> frozenset[str]:
        """The variables of ``version`` that ``data`` does not fill (each recipient's own).
        Raises ApiError 422 when it does not parse, 503 when it cannot be parsed now."""
        return await self._run(
            f"version {version.version} does not render",
            template_use.per_recipient,
            _source(version),
            data,
        )

    async def _run(self, what: str, job: Callable[..., T], *args: Any) -> T:
        try:
            return await self.renderer.run(job, *args)
        except RenderError as exc:
            raise render_refusal(exc, what) from None
        except RendererUnavailable as exc:
            raise renderer_refusal(exc) from None

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


def _with_markers(to: object, personal: frozenset[str], headed: frozenset[str]) -> object:
    """``to`` with each recipient's values of the per-recipient variables as substitutions
    of their markers (left as it is when the template has none: validation checks it). The
    values of ``headed`` (used in a subject) must be fit for a header."""
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
        for name in sorted(headed & personal):
            if (problem := text_problem(subs[name])) is not None:
                raise _invalid(
                    f"to[{index}].substitutions.{name}",
                    f"{problem.message} (the variable is used in the subject)",
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
