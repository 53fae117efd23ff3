"""``/v1/templates``: each user's versioned templates: create, add an immutable version,
publish one (live, or a canary beside the live one), list, read (with its canary rollouts'
audited verdicts), preview, and delete a template or one of its versions.

A user's templates and each template's versions are capped (``services.api.capping``): a
place is claimed before one is made and given back once it is deleted. A version's number is
taken before its place (there must be room first), so one refused at the edge of the cap by a
concurrent one leaves a gap in the numbers. A version that is live or in canary cannot be
deleted (409 ``version_in_use``), nor a template a campaign that has not ended sends (409
``in_use``).

:class:`Templates` holds the use cases (the dashboard reads through it too); the handlers
parse, call and answer. Publishing is refused (422 ``template_does_not_render``, naming each
part's error and its line) for a version that does not render with its own sample data, so
what goes live has rendered at least once. Rolling back is publishing an older version;
publishing without ``canary_percent`` ends any canary.

A version named in a body that the template does not have is a 422 naming ``version`` (the
template in the path exists; the field is wrong). Another user's template, or an id that is
not a template id, is a 404.

Renders run in the app's renderer (``shared.templates.template_pool``: worker processes under
memory, CPU and time limits), so the event loop keeps serving other requests meanwhile; a version
that passes a limit is refused naming it (``limit`` in the 422), and a renderer that cannot
take the job now is a 503 ``renderer_unavailable``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from services.api import schema
from services.api.auth import require_key
from services.api.capping import Caps, Census
from services.api.operations import TEMPLATE_ID, Param, operation
from services.api.schema import PreviewIn, PublishIn, TemplateIn, TemplateVersionIn, checked
from services.api.templated import render_refusal, renderer_refusal
from shared.core.errors import DependencyUnavailable
from shared.infra.http import Answer, ApiError, read_json
from shared.templates.canary import Counts
from shared.templates.canary_store import Canaries, Outcome
from shared.templates.template_pool import Renderer, RendererUnavailable
from shared.templates.template_render import Rendered, RenderError, render_version
from shared.templates.templates import (
    StoredTemplates,
    Template,
    TemplateChanged,
    TemplateGone,
    Version,
    VersionHeader,
)

log = logging.getLogger(__name__)

#: Two parts at their longest, JSON-escaped, with a subject and sample data.
BODY_LIMIT = 3 * 1024 * 1024
#: A preview's data (and a publish) are small.
SMALL_BODY = 256 * 1024


# --------------------------------------------------------------------------- pure decisions


def template_id_of(raw: str) -> uuid.UUID | None:
    """The template id in a path, or None for anything that cannot be one (template ids are
    time UUIDs: another kind would be refused by Cassandra, not merely not found)."""
    try:
        found = uuid.UUID(raw)
    except ValueError:
        return None
    return found if found.version == 1 else None


def publish_refusal(template: Template, number: int, canary: float | None) -> str | None:
    """Why ``number`` may not be published as asked (None: it may); the version itself is
    known to exist and to render."""
    if canary is None:
        return None
    if template.live_version is None:
        return "nothing is live yet to compare a canary with: publish a version first"
    if number == template.live_version:
        return f"version {number} is already live"
    return None


def item_view(t: Template) -> dict[str, Any]:
    canary = None
    if t.canary_version is not None and t.canary_percent is not None:
        canary = {
            "version": t.canary_version,
            "percent": t.canary_percent,
            "since": t.canary_since.isoformat() if t.canary_since else t.created_at.isoformat(),
        }
    return {
        "id": str(t.template_id),
        "name": t.name,
        "created_at": t.created_at.isoformat(),
        "live_version": t.live_version,
        "canary": canary,
    }


def version_view(t: Template, v: VersionHeader) -> dict[str, Any]:
    return {
        "version": v.version,
        "subject": v.subject,
        "created_at": v.created_at.isoformat(),
        "live": v.version == t.live_version,
        "canary": v.version == t.canary_version,
    }


def counts_view(counts: Counts) -> dict[str, int]:
    return {
        "sent": counts.sent,
        "provider_failures": counts.provider_failures,
        "hard_bounces": counts.hard_bounces,
        "complaints": counts.complaints,
    }


def rollout_view(o: Outcome) -> dict[str, Any]:
    """One audited canary verdict: what was compared, what was decided and why."""
    return {
        "at": o.at.isoformat(),
        "canary_version": o.canary_version,
        "live_version": o.live_version,
        "decision": o.decision,
        "reason": o.reason,
        "counts": {"canary": counts_view(o.canary), "live": counts_view(o.live)},
    }


async def rendered(
    renderer: Renderer, v: Version, data: Mapping[str, Any], *, with_what: str
) -> Rendered:
    """``v`` rendered with ``data`` by ``renderer``; a 422 ``template_does_not_render``
    naming each part that does not render (with ``limit`` when one passed a limit), or a 503
    when the renderer cannot take it now."""
    try:
        return await renderer.run(render_version, v.subject, v.html, v.text, data)
    except RenderError as exc:
        raise render_refusal(exc, f"version {v.version} does not render with {with_what}") from None
    except RendererUnavailable as exc:
        raise renderer_refusal(exc) from None


def _no_template() -> ApiError:
    return ApiError(404, "not_found", "no such template")


def _no_version(template: Template, number: int) -> ApiError:
    return ApiError(
        422,
        "invalid_fields",
        "the version is not valid",
        fields={"version": f"template {template.template_id} has no version {number}"},
    )


# --------------------------------------------------------------------------- use cases


@dataclass(frozen=True, slots=True)
class Templates:
    """The use cases behind ``/v1/templates``: raw values in, templates out, or ApiError."""

    store: StoredTemplates
    canaries: Canaries
    caps: Caps
    renderer: Renderer

    @classmethod
    def of(cls, request: Request) -> Templates:
        state = request.app.state
        return cls(state.template_store, state.canary_store, state.caps, state.template_pool)

    async def create(self, user_id: uuid.UUID, wanted: TemplateIn) -> Template:
        """A new template with its version 1, if the user has room for one (409
        ``too_many_templates``)."""
        template_id = uuid.uuid1()
        await self.caps.claim(user_id, "templates", str(template_id), self._templates_of(user_id))
        await self.store.create(
            user_id,
            wanted.name,
            wanted.subject,
            wanted.html,
            wanted.text,
            wanted.sample,
            template_id=template_id,
        )
        return await self.owned(user_id, str(template_id))

    async def add_version(self, template: Template, v: TemplateVersionIn) -> int:
        """The number of a new version of ``template``, if it has room for one (409
        ``too_many_versions``; 404 when it was deleted meanwhile)."""
        user_id, scope = template.user_id, template.template_id
        census = self._versions_of(template)
        await self.caps.check(user_id, "versions", census, scope=scope)
        try:
            number = await self.store.take_number(template)
        except TemplateGone:
            raise _no_template() from None
        await self.caps.claim(user_id, "versions", str(number), census, scope=scope)
        await self.store.write_version(
            template.template_id, number, v.subject, v.html, v.text, v.sample, datetime.now(UTC)
        )
        return number

    async def delete(self, template: Template) -> None:
        """Delete ``template`` with its versions, and give their places back."""
        await self.store.delete(template)
        await self.caps.release_quietly(template.user_id, "templates", str(template.template_id))
        try:
            await self.caps.forget(template.user_id, "versions", template.template_id)
        except (DependencyUnavailable, ApiError) as exc:
            log.warning(
                "versions of deleted template %s not forgotten: %s", template.template_id, exc
            )

    async def delete_version(self, template: Template, number: int) -> None:
        """Delete version ``number`` of ``template`` (404 when it has none; 409 while it is
        live or in canary) and give its place back."""
        await self.version(template, number, missing=404)
        if number in (template.live_version, template.canary_version):
            role = "live" if number == template.live_version else "in canary"
            raise ApiError(
                409,
                "version_in_use",
                f"version {number} is {role}: publish another version first",
            )
        await self.store.delete_version(template.template_id, number)
        await self.caps.release_quietly(
            template.user_id, "versions", str(number), scope=template.template_id
        )

    def _templates_of(self, user_id: uuid.UUID) -> Census:
        async def census(_: Collection[str]) -> set[str]:
            return {str(t.template_id) for t in await self.store.templates(user_id)}

        return census

    def _versions_of(self, template: Template) -> Census:
        async def census(_: Collection[str]) -> set[str]:
            headers = await self.store.version_headers(template.template_id)
            return {str(v.version) for v in headers}

        return census

    async def owned(self, user_id: uuid.UUID, raw_id: str) -> Template:
        template_id = template_id_of(raw_id)
        found = None if template_id is None else await self.store.get(user_id, template_id)
        if found is None:
            raise _no_template()
        return found

    async def version(self, template: Template, number: int, *, missing: int = 422) -> Version:
        """Version ``number``; when it has none, a 422 naming the field ``version`` (a
        number in a body), or with ``missing=404`` a 404 (a number in the path)."""
        found = await self.store.version(template.template_id, number)
        if found is None:
            if missing == 404:
                raise ApiError(404, "not_found", f"the template has no version {number}")
            raise _no_version(template, number)
        return found

    async def publish(self, user_id: uuid.UUID, raw_id: str, wanted: PublishIn) -> Template:
        template = await self.owned(user_id, raw_id)
        version = await self.version(template, wanted.version)
        refusal = publish_refusal(template, wanted.version, wanted.canary_percent)
        if refusal is not None:
            raise ApiError(422, "cannot_publish", refusal)
        await rendered(self.renderer, version, version.sample, with_what="its sample data")
        try:
            return await self.store.publish(template, wanted.version, wanted.canary_percent)
        except TemplateChanged:
            raise ApiError(
                409,
                "template_changed",
                "the template's live version or canary changed while publishing (another "
                "publish, or the canary's verdict): read it again and publish if still wanted",
            ) from None

    async def preview(self, user_id: uuid.UUID, raw_id: str, wanted: PreviewIn) -> dict[str, Any]:
        template = await self.owned(user_id, raw_id)
        number = wanted.version if wanted.version is not None else template.live_version
        if number is None:
            raise ApiError(
                422, "no_live_version", "nothing is live yet: name the version to preview"
            )
        version = await self.version(template, number)
        data = wanted.data if wanted.data is not None else version.sample
        what = "this data" if wanted.data is not None else "its sample data"
        out = await rendered(self.renderer, version, data, with_what=what)
        return {"version": number, "subject": out.subject, "html": out.html, "text": out.text}

    async def detail(self, template: Template) -> dict[str, Any]:
        versions, verdicts = await asyncio.gather(
            self.store.version_headers(template.template_id),
            self.canaries.history(template.template_id),
        )
        return {
            **item_view(template),
            "versions": [version_view(template, v) for v in versions],
            "rollouts": [rollout_view(o) for o in verdicts],
        }


# --------------------------------------------------------------------------- handlers


@operation(
    "list_templates",
    "Your templates, with the live version and any canary",
    schema.TemplateList,
)
async def list_templates(request: Request) -> Response:
    key = await require_key(request, "read")
    found = await Templates.of(request).store.templates(key.user_id)
    return Answer(schema.TemplateList.model_validate({"data": [item_view(t) for t in found]}))


@operation(
    "create_template",
    "Make a template with its version 1 (publish it to make it live)",
    schema.TemplateCreated,
    status=201,
    body=schema.TemplateIn,
    errors=(400, 409, 413, 415, 422),
    description="Subject, html and text are Jinja2 templates, rendered in a sandbox "
    "(no access to internals, undefined names are errors, html autoescaped) under "
    "limits of time, memory, CPU, integer size and output; a render that passes one is "
    "a 422 `template_does_not_render` naming it in `error.limit`. Without a "
    "text part, the text is derived from the html. 409 `too_many_templates` when you "
    "have as many templates as you may (`error.limit`).",
)
async def create_template(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, BODY_LIMIT)
    created = await Templates.of(request).create(key.user_id, checked(TemplateIn, body))
    return Answer(
        schema.TemplateCreated.model_validate({**item_view(created), "version": 1}), status_code=201
    )


@operation(
    "get_template",
    "A template and its versions, newest first, with which is live and which in canary",
    schema.TemplateView,
    params=(TEMPLATE_ID,),
    errors=(404,),
)
async def get_template(request: Request) -> Response:
    key = await require_key(request, "read")
    templates = Templates.of(request)
    found = await templates.owned(key.user_id, request.path_params["template_id"])
    return Answer(schema.TemplateView.model_validate(await templates.detail(found)))


@operation(
    "add_template_version",
    "Add a version (immutable; not live until published)",
    schema.VersionCreated,
    status=201,
    body=schema.TemplateVersionIn,
    params=(TEMPLATE_ID,),
    errors=(400, 404, 409, 413, 415, 422),
    description="409 `too_many_versions` when the template has as many versions as it "
    "may (`error.limit`); deleting one that is neither live nor in canary frees its "
    "place.",
)
async def add_version(request: Request) -> Response:
    key = await require_key(request, "send")
    templates = Templates.of(request)
    found = await templates.owned(key.user_id, request.path_params["template_id"])
    _, body = await read_json(request, BODY_LIMIT)
    number = await templates.add_version(found, checked(TemplateVersionIn, body))
    return Answer(
        schema.VersionCreated.model_validate({"id": str(found.template_id), "version": number}),
        status_code=201,
    )


@operation(
    "delete_template",
    "Delete a template with all of its versions",
    None,
    status=204,
    params=(TEMPLATE_ID,),
    errors=(404, 409),
    description="409 `in_use` while a campaign that has not ended (a draft included) "
    "sends it. Batches already accepted keep what they rendered.",
)
async def delete_template(request: Request) -> Response:
    key = await require_key(request, "send")
    templates = Templates.of(request)
    found = await templates.owned(key.user_id, request.path_params["template_id"])
    await request.app.state.campaigns.refuse_if_used(key.user_id, template_id=found.template_id)
    await templates.delete(found)
    return Response(status_code=204)


@operation(
    "delete_template_version",
    "Delete a version that is neither live nor in canary",
    None,
    status=204,
    params=(
        TEMPLATE_ID,
        Param("version", "path", "The version's number.", "integer", required=True),
    ),
    errors=(404, 409),
    description="409 `version_in_use` for the live version or the one in canary: "
    "publish another first.",
)
async def delete_version(request: Request) -> Response:
    key = await require_key(request, "send")
    templates = Templates.of(request)
    found = await templates.owned(key.user_id, request.path_params["template_id"])
    await templates.delete_version(found, _version_number(request))
    return Response(status_code=204)


def _version_number(request: Request) -> int:
    raw = request.path_params["version"]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10 or not 1 <= int(raw) < 2**31:
        raise ApiError(404, "not_found", "no such version")
    return int(raw)


@operation(
    "publish_template",
    "Make a version live, or start its canary beside the live one",
    schema.TemplateItem,
    body=schema.PublishIn,
    params=(TEMPLATE_ID,),
    errors=(400, 404, 409, 413, 415, 422),
    description="Without `canary_percent`, the version becomes live and any canary ends "
    "(rolling back is publishing an older version). With it, that share of the "
    "template's mail uses the version and the rest the live one. 422 "
    "`template_does_not_render` when the version does not render with its own sample "
    "data (`error.fields` names each part and its error, with the line, and "
    "`error.limit` the limit it passed, if any); `cannot_publish` "
    "for a canary with nothing live yet or of the live version itself; `invalid_fields` "
    "naming `version` when the template has no such version. 409 `template_changed` "
    "when the live version or canary changed while publishing (another publish, or the "
    "canary's verdict): nothing was written; read the template again.",
)
async def publish_template(request: Request) -> Response:
    key = await require_key(request, "send")
    _, body = await read_json(request, SMALL_BODY)
    wanted = checked(PublishIn, body)
    published = await Templates.of(request).publish(
        key.user_id, request.path_params["template_id"], wanted
    )
    return Answer(schema.TemplateItem.model_validate(item_view(published)))


@operation(
    "preview_template",
    "Render a version (default: the live one) with your data or its sample",
    schema.PreviewOut,
    body=schema.PreviewIn,
    params=(TEMPLATE_ID,),
    errors=(400, 404, 413, 415, 422),
    description="422 `template_does_not_render` naming each part's error (and line), "
    "and in `error.limit` the limit it passed, if any; "
    "`no_live_version` when none is live and no version is named; `invalid_fields` "
    "naming `version` when the template has no such version.",
)
async def preview_template(request: Request) -> Response:
    key = await require_key(request, "read")
    _, body = await read_json(request, SMALL_BODY)
    wanted = checked(PreviewIn, body)
    shown = await Templates.of(request).preview(
        key.user_id, request.path_params["template_id"], wanted
    )
    return Answer(schema.PreviewOut.model_validate(shown))
