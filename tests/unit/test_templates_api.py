"""The templates API's decisions (``services.api.templates``) and the dashboard's rows of
them (``services.api.dashboard.template_pages``), pure: what may be published, which ids
are template ids, and how a render failure is told."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from services.api.dashboard.template_pages import template_rows
from services.api.schema import (
    ErrorBody,
    PreviewIn,
    PublishIn,
    TemplateIn,
    TemplateVersionIn,
    checked,
)
from services.api.templated import render_refusal
from services.api.templates import publish_refusal, rendered, template_id_of
from shared.infra.http import ApiError, error_response
from shared.templates.canary import Counts
from shared.templates.canary_store import Outcome
from shared.templates.template_pool import RendererUnavailable
from shared.templates.template_render import RenderError, render_version
from shared.templates.templates import Template, Version, VersionHeader
from tests.fakes.renderer import InlineRenderer

NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


def template(live: int | None = None, canary: int | None = None) -> Template:
    return Template(
        uuid.uuid4(),
        uuid.uuid1(),
        "t",
        live,
        canary,
        25.0 if canary else None,
        NOW if canary else None,
        NOW,
    )


def version(
    number: int = 1, subject: str = "Hi {{ n }}", html: str | None = None, text: str | None = "t"
) -> Version:
    return Version(number, subject, html, text, {"n": "Ann"}, NOW)


def test_a_version_may_be_published_live_whatever_is_live() -> None:
    """Publishing live is never refused here: nothing live, or another version live."""
    assert publish_refusal(template(), 1, None) is None
    assert publish_refusal(template(live=2), 1, None) is None


def test_a_canary_needs_something_live_other_than_itself() -> None:
    """A canary is refused with nothing live, or of the live version itself."""
    assert "nothing is live" in str(publish_refusal(template(), 1, 10.0))
    assert "already live" in str(publish_refusal(template(live=2), 2, 10.0))
    assert publish_refusal(template(live=1), 2, 10.0) is None


@pytest.mark.parametrize(
    "raw", ["", "x", "9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", "00000000-0000-0000-0000-000000000000"]
)
def test_only_a_time_uuid_is_a_template_id(raw: str) -> None:
    """Text, random UUIDs and the nil UUID are not template ids (Cassandra would refuse them)."""
    assert template_id_of(raw) is None


def test_a_time_uuid_is_a_template_id() -> None:
    """A time UUID is read as the template id it names."""
    made = uuid.uuid1()

    assert template_id_of(str(made)) == made


async def test_a_render_failure_names_every_part_that_fails() -> None:
    """Each failing part is a field of the 422, with its error and line."""
    broken = version(subject="{{ missing }}", html="<p>\n{% if %}</p>", text="fine")

    with pytest.raises(ApiError) as caught:
        await rendered(InlineRenderer(), broken, {}, with_what="its sample data")

    assert (caught.value.status, caught.value.code) == (422, "template_does_not_render")
    assert set(caught.value.fields or {}) == {"subject", "html"}
    assert "line 2" in (caught.value.fields or {})["html"]
    assert caught.value.message.startswith("version 1 does not render with its sample data")


async def test_a_version_past_a_limit_is_a_422_naming_the_limit_and_the_part() -> None:
    """The 422 of a preview or publish names the limit (``error.limit``) and the part."""
    hostile = version(html="{% set s = 'x' * 1000000 %}{% set s = s + s %}{{ s }}")

    with pytest.raises(ApiError) as caught:
        await rendered(InlineRenderer(), hostile, {}, with_what="its sample data")

    body = orjson.loads(error_response(caught.value).body)["error"]
    assert (body["code"], body["limit"]) == (
        "template_does_not_render",
        {"name": "result_size", "value": 1_000_000},
    )
    assert list(body["fields"]) == ["html"]
    assert "result_size" in body["message"]


async def test_a_renderer_that_cannot_take_a_preview_now_is_a_503() -> None:
    """The pool shutting down (or every worker busy) is a 503 to retry."""
    renderer = InlineRenderer()
    renderer.fail(RendererUnavailable("the template renderer is shutting down"))

    with pytest.raises(ApiError) as caught:
        await rendered(renderer, version(), {}, with_what="this data")

    assert (caught.value.status, caught.value.code) == (503, "renderer_unavailable")


def test_the_dashboard_marks_the_live_and_the_canary_version() -> None:
    """Rows mark the live and the canary version and show the canary's share and start."""
    t = template(live=1, canary=2)

    (row,) = template_rows([(t, [VersionHeader(n, "s", NOW) for n in (3, 2, 1)], [])])

    assert [(v.version, v.state) for v in row.versions] == [(3, ""), (2, "canary"), (1, "live")]
    assert (row.canary_percent, row.canary_since) == ("25%", "2026-11-26 09:00:00 UTC")


def test_the_dashboard_marks_a_rolled_back_canary_with_its_reason() -> None:
    """A rollback verdict is marked as one, with why and the counts it was judged on."""
    verdicts = [
        Outcome(NOW, 3, 2, "rollback", "hard bounces 4.0% vs 0.5%", Counts(100, 0, 4, 0),
                Counts(900, 0, 5, 0)),
        Outcome(NOW, 2, 1, "promote", "no metric worse", Counts(50), Counts(450)),
    ]  # fmt: skip

    (row,) = template_rows([(template(live=2, canary=None), [], verdicts)])

    assert [(r.canary_version, r.rolled_back) for r in row.rollouts] == [(3, True), (2, False)]
    assert row.rollouts[0].reason == "hard bounces 4.0% vs 0.5%"
    assert row.rollouts[0].canary.startswith("100 sent: 0 provider failures, 4 hard bounces")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    ["name", "subject", "html", "text", "sample", "version", "canary_percent", "data", "x"]
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from([TemplateIn, TemplateVersionIn, PublishIn, PreviewIn]),
    body=JSON | st.dictionaries(FIELDS, JSON),
)
def test_any_json_body_is_a_model_or_a_422_naming_fields(
    model: type[BaseModel], body: object
) -> None:
    """Whatever JSON arrives, the templates' bodies validate or are a 422 in the envelope."""
    try:
        checked(model, body)
    except ApiError as exc:
        assert (exc.status, exc.code) == (422, "invalid_fields")
        assert exc.fields
        ErrorBody.model_validate(orjson.loads(error_response(exc).body))


TOKENS = st.sampled_from(
    [
        "{{",
        "}}",
        "{%",
        "%}",
        " for x in ",
        " if ",
        " endfor ",
        " endif ",
        "n",
        "x",
        " | ",
        "upper",
        "(",
        ")",
        "[",
        "]",
        "'",
        ".",
        "_",
        "__class__",
        "*",
        "**",
        "9",
        "range",
        "loop",
        " recursive ",
        " set ",
        "=",
        ",",
        "{#",
        "#}",
        "\n",
        " else ",
    ]
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    source=st.lists(TOKENS, max_size=24).map("".join),
    data=st.dictionaries(st.text(max_size=3), JSON),
)
def test_any_source_renders_or_is_a_render_error_naming_it(
    source: str, data: dict[str, object]
) -> None:
    """A 422 for whatever a user writes, never another exception (a 500): what a renderer
    runs (``render_version``) and how its refusal is told (``render_refusal``)."""
    try:
        render_version(source, source, source, {"n": 1, **data})
    except RenderError as exc:
        refused = render_refusal(exc, "it")
        assert refused.code == "template_does_not_render"
        assert refused.fields


async def test_a_render_error_quoting_a_huge_name_is_told_shortened() -> None:
    """An error quoting a megabyte-long name from the template stays a short 422."""
    huge = version(subject="{{ " + "n" * 100_000 + " }}")

    with pytest.raises(ApiError) as caught:
        await rendered(InlineRenderer(), huge, {}, with_what="it")

    assert len((caught.value.fields or {})["subject"]) <= 500
    assert len(caught.value.message) < 1000
