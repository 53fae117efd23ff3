"""Batches naming a template (``services.api.templated``): every refusal is a 422 naming the
problem, the canary's copy is held to the rules the live one is validated by, and a version's
parts are compiled once."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from services.api.templated import TemplateBatches
from shared.infra.http import ApiError
from shared.templates.template_limits import Limit
from shared.templates.template_pool import RendererBusy
from shared.templates.template_render import LimitError, RendererCrashed
from tests.fakes.renderer import InlineRenderer
from tests.fakes.templates import FakeTemplates

HTML = "<p>Hello {{ first_name }}</p>"


async def _batches(*subjects: str, canary: bool = False) -> tuple[TemplateBatches, uuid.UUID]:
    """Templates of one user whose versions have ``subjects``: the first live, the second
    its canary at 50% when ``canary``."""
    store = FakeTemplates()
    user = uuid.uuid4()
    tid = await store.create(user, "t", subjects[0], HTML, None, {})
    template = await store.get(user, tid)
    assert template is not None
    for subject in subjects[1:]:
        await store.add_version(template, subject, HTML, None, {})
    template = await store.publish(template, 1)
    if canary:
        await store.publish(template, 2, canary_percent=50.0)
    return TemplateBatches(store, InlineRenderer()), tid


def _user(batches: TemplateBatches) -> uuid.UUID:
    store: Any = batches.store
    user_id: uuid.UUID = next(iter(store.rows))[0]
    return user_id


def _body(tid: uuid.UUID | str, name: str = "Ann", **more: Any) -> dict[str, Any]:
    to = [{"email": "a@example.com", "substitutions": {"first_name": name}}]
    return {"from": "s@example.com", "to": to, "template_id": str(tid), **more}


async def _refusal(batches: TemplateBatches, body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await batches.prepare(_user(batches), body)
    assert caught.value.status == 422
    return caught.value


async def test_a_stored_version_that_does_not_parse_is_a_422_naming_the_error() -> None:
    """A version named by number that does not parse is refused with the template's error."""
    batches, tid = await _batches("Hi", "{{")

    refused = await _refusal(batches, _body(tid, version=2))

    assert refused.code == "template_does_not_render"
    assert "line 1" in refused.message


async def test_a_template_raising_any_exception_is_a_422() -> None:
    """A filter failing inside a user's template is a 422, not a server error."""
    batches, tid = await _batches("Hi", "{{ 'x'|truncate(-1) }}")

    refused = await _refusal(batches, _body(tid, version=2))

    assert refused.code == "template_does_not_render"


async def test_a_template_past_a_limit_is_a_422_naming_the_limit() -> None:
    """Integers past their cap are refused in the sandbox, the 422 naming ``integer_size``."""
    squarings = "{% set v = 2**49999 %}{% set w = v * v %}{{ (w * w) % 7 }}"
    batches, tid = await _batches("Hi", squarings)

    refused = await _refusal(batches, _body(tid, version=2))

    assert (refused.code, refused.limit) == ("template_does_not_render", ("integer_size", 100_000))
    assert "integers are limited" in refused.message


@pytest.mark.parametrize(
    ("breach", "limit"),
    [
        (LimitError(Limit.MEMORY, "the template needs too much memory"), ("memory", None)),
        (
            LimitError(Limit.CPU_TIME, "the template used more than 6 s of CPU"),
            ("cpu_time", None),
        ),
        (RendererCrashed("the process rendering the template died (signal SIGSEGV)"), None),
    ],
)
async def test_a_worker_killed_over_the_template_is_a_422(
    breach: Exception, limit: tuple[str, None] | None
) -> None:
    """A breach only a worker's limits catch (or its death) refuses the batch, naming it."""
    batches, tid = await _batches("Hi")
    batches.renderer.fail(breach)  # type: ignore[attr-defined]

    refused = await _refusal(batches, _body(tid))

    assert (refused.code, refused.limit) == ("template_does_not_render", limit)
    assert str(breach) in refused.message


async def test_a_renderer_that_cannot_take_the_batch_now_is_a_503() -> None:
    """Every worker busy is not the template's fault: a 503 to retry, not a 422."""
    batches, tid = await _batches("Hi")
    batches.renderer.fail(RendererBusy("every template renderer stayed busy for 10 s"))  # type: ignore[attr-defined]

    with pytest.raises(ApiError) as caught:
        await batches.prepare(_user(batches), _body(tid))

    assert (caught.value.status, caught.value.code) == (503, "renderer_unavailable")
    assert caught.value.headers == {"Retry-After": "1"}


@pytest.mark.parametrize("tid", ["9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", str(uuid.UUID(int=0))])
async def test_a_template_id_that_is_not_a_time_uuid_is_a_422_naming_it(tid: str) -> None:
    """Template ids are time UUIDs: another kind is refused before any query."""
    batches, _ = await _batches("Hi")

    refused = await _refusal(batches, _body(tid))

    assert refused.code == "invalid_fields"
    assert "time UUID" in (refused.fields or {})["template_id"]


@pytest.mark.parametrize(
    ("canary_subject", "data", "problem"),
    [
        ("Hi {{ shop }}", {"shop": "A\r\nBcc: x@example.com"}, "line break"),
        ("{{ 'x' * 1000 }}", {}, "longer than 998"),
    ],
)
async def test_the_canary_copy_s_subject_is_checked_as_the_live_one_is(
    canary_subject: str, data: dict[str, Any], problem: str
) -> None:
    """A canary whose rendered subject could not be a header is a 422 naming the subject."""
    batches, tid = await _batches("Hi", canary_subject, canary=True)

    refused = await _refusal(batches, _body(tid, data=data))

    assert refused.code == "invalid_fields"
    assert "version 2" in (refused.fields or {})["subject"]
    assert problem in (refused.fields or {})["subject"].replace("CR or LF", "line break")


async def test_a_recipient_value_used_only_in_the_canary_subject_may_not_break_a_line() -> None:
    """A per-recipient variable in either copy's subject is header-bound for every recipient."""
    batches, tid = await _batches("Hi", "Hi {{ first_name }}", canary=True)

    refused = await _refusal(batches, _body(tid, name="Ann\r\nBcc: x@example.com"))

    assert (
        "the variable is used in the subject"
        in (refused.fields or {})["to[0].substitutions.first_name"]
    )


async def test_a_recipient_value_used_only_in_bodies_may_break_lines() -> None:
    """Body-only variables keep their line breaks (bodies are multi-line)."""
    batches, tid = await _batches("Hi")

    body, _ = await batches.prepare(_user(batches), _body(tid, name="Ann\nSmith"))

    assert body["subject"] == "Hi"


async def test_a_version_s_parts_are_compiled_once_for_many_batches() -> None:
    """A second batch naming the same version renders from the parts kept by the first."""
    batches, tid = await _batches("Hi {{ shop }}")
    renderer = batches.renderer
    assert isinstance(renderer, InlineRenderer)

    first, _ = await batches.prepare(_user(batches), _body(tid, data={"shop": "A"}))
    kept = len(renderer.parts)
    second, _ = await batches.prepare(_user(batches), _body(tid, data={"shop": "B"}))

    assert (first["subject"], second["subject"]) == ("Hi A", "Hi B")
    assert kept == len(renderer.parts) > 0


async def test_a_batch_is_one_job_of_the_renderer_whatever_its_recipients() -> None:
    """All of a batch's rendering is one job: its cost in IPC is per batch, not per recipient."""
    batches, tid = await _batches("Hi {{ first_name }}", "Hello {{ first_name }}", canary=True)
    to = [{"email": f"r{i}@example.com", "substitutions": {"first_name": "A"}} for i in range(50)]

    await batches.prepare(_user(batches), {**_body(tid), "to": to})

    assert batches.renderer.jobs == ["render_batch"]  # type: ignore[attr-defined]
