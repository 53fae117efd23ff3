"""The templates API's decisions (``services.api.templates``) and the dashboard's rows of
them (``services.api.dashboard.template_pages``), pure: what may be published, which ids
are template ids, and how a render failure is told."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from services.api.dashboard.template_pages import template_rows
from services.api.templates import publish_refusal, rendered, template_id_of
from shared.http import ApiError
from shared.templates import Template, Version, VersionHeader

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
    assert publish_refusal(template(), 1, None) is None
    assert publish_refusal(template(live=2), 1, None) is None


def test_a_canary_needs_something_live_other_than_itself() -> None:
    assert "nothing is live" in str(publish_refusal(template(), 1, 10.0))
    assert "already live" in str(publish_refusal(template(live=2), 2, 10.0))
    assert publish_refusal(template(live=1), 2, 10.0) is None


@pytest.mark.parametrize(
    "raw", ["", "x", str(uuid.uuid4()), "00000000-0000-0000-0000-000000000000"]
)
def test_only_a_time_uuid_is_a_template_id(raw: str) -> None:
    assert template_id_of(raw) is None


def test_a_time_uuid_is_a_template_id() -> None:
    made = uuid.uuid1()

    assert template_id_of(str(made)) == made


def test_a_render_failure_names_every_part_that_fails() -> None:
    broken = version(subject="{{ missing }}", html="<p>\n{% if %}</p>", text="fine")

    with pytest.raises(ApiError) as caught:
        rendered(broken, {}, with_what="its sample data")

    assert (caught.value.status, caught.value.code) == (422, "template_does_not_render")
    assert set(caught.value.fields or {}) == {"subject", "html"}
    assert "line 2" in (caught.value.fields or {})["html"]
    assert caught.value.message.startswith("version 1 does not render with its sample data")


def test_the_dashboard_marks_the_live_and_the_canary_version() -> None:
    t = template(live=1, canary=2)

    (row,) = template_rows([(t, [VersionHeader(n, "s", NOW) for n in (3, 2, 1)])])

    assert [(v.version, v.state) for v in row.versions] == [(3, ""), (2, "canary"), (1, "live")]
    assert (row.canary_percent, row.canary_since) == ("25%", "2026-11-26 09:00:00 UTC")
