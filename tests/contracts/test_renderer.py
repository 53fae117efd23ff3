"""The renderer's contract, asserted identically of the in-process twin
(``tests/fakes/renderer.py``) and of the real pool of worker processes: a job's answer comes
back as the job made it, a version that does not render is a RenderError naming each part,
one the sandbox refuses a LimitError naming the limit and the part, and what cannot be sent
to a worker is our failure, not the template's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.infra.config import TemplateSettings
from shared.templates.template_pool import TemplatePool
from shared.templates.template_render import LimitError, Rendered, RenderError, render_version
from shared.templates.template_use import Source, per_recipient, render_batch
from tests.fakes.renderer import InlineRenderer


@pytest.fixture(params=["fake", "real"])
async def renderer(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if request.param == "fake":
        yield InlineRenderer()
        return
    pool = TemplatePool(TemplateSettings(workers=1))
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()


async def test_a_version_comes_back_rendered(renderer: Any) -> None:
    """Every part rendered, html escaped, the text derived from the html."""
    out = await renderer.run(render_version, "Hi {{ n }}", "<p>{{ n }}</p>", None, {"n": "A&B"})

    assert out == Rendered("Hi A&B", "<p>A&amp;B</p>", "A&B")


async def test_a_batch_s_copies_and_variables_come_back(renderer: Any) -> None:
    """A batch's live and canary copies, and the variables its recipients fill."""
    live = Source(1, "Hi {{ name }}", "<p>{{ shop }}</p>", None)
    canary = Source(2, "Hello {{ name }}", None, "{{ shop }}!")

    done = await renderer.run(render_batch, live, canary, {"shop": "S"})

    assert done.personal == frozenset({"name"})
    assert (done.live.version, done.live.subject, done.live.html) == (
        1,
        "Hi [[sd.t.name]]",
        "<p>S</p>",
    )
    assert done.canary is not None
    assert (done.canary.version, done.canary.text) == (2, "S!")
    assert await renderer.run(per_recipient, live, {}) == frozenset({"name", "shop"})


async def test_a_version_that_does_not_render_names_each_failing_part(renderer: Any) -> None:
    """A RenderError (not a limit) whose fields name each part and its error."""
    with pytest.raises(RenderError) as caught:
        await renderer.run(render_version, "{{ missing }}", "<p>\n{% if %}</p>", "fine", {})

    assert not isinstance(caught.value, LimitError)
    assert set(caught.value.fields or {}) == {"subject", "html"}
    assert "line 2" in (caught.value.fields or {})["html"]


async def test_a_step_the_sandbox_refuses_is_a_limit_error_naming_limit_and_part(
    renderer: Any,
) -> None:
    """The limit by name, and the part that passed it."""
    with pytest.raises(LimitError) as caught:
        await renderer.run(render_version, "s", "{{ (1).to_bytes(10**9, 'big') }}", None, {})

    assert caught.value.limit == "result_size"
    assert list(caught.value.fields or {}) == ["html"]


async def test_a_job_that_cannot_be_sent_is_our_failure(renderer: Any) -> None:
    """Data that cannot cross to a worker is a RuntimeError (a 500), never a RenderError."""
    with pytest.raises(RuntimeError, match="cannot be sent"):
        await renderer.run(render_version, "s", None, "t", {"f": lambda: 1})
