"""The Templates page's forms (``services.api.dashboard.template_pages``): the API bodies they
stand for, and the confirmation told after a step."""

from __future__ import annotations

import pytest

from services.api.dashboard.template_pages import done_notice, publish_body, version_body
from shared.infra.http import ApiError


def test_a_version_form_leaves_blank_parts_out_and_reads_its_sample_as_json() -> None:
    form = {"subject": " Hi ", "html": "", "text": "a\r\nb", "sample": '{"n": 1}'}

    assert version_body(form) == {"subject": "Hi", "text": "a\nb", "sample": {"n": 1}}


@pytest.mark.parametrize("sample", ["[1]", "{oops", '"text"'])
def test_a_sample_that_is_not_a_json_object_is_refused_naming_it(sample: str) -> None:
    with pytest.raises(ApiError) as caught:
        version_body({"subject": "Hi", "sample": sample})

    assert caught.value.status == 422
    assert caught.value.fields is not None and "sample" in caught.value.fields


def test_a_blank_share_publishes_live_and_a_share_is_a_number() -> None:
    assert publish_body({"version": "2", "canary_percent": " "}) == {"version": 2}
    assert publish_body({"version": "2", "canary_percent": "12.5%"}) == {
        "version": 2,
        "canary_percent": 12.5,
    }
    assert publish_body({"version": "x", "canary_percent": "lots"}) == {
        "version": "x",
        "canary_percent": "lots",
    }


def test_the_confirmation_names_only_a_known_step_and_a_version_number() -> None:
    assert done_notice({"done": "published", "version": "3"}) == "Version 3 is published."
    assert done_notice({"done": "published", "version": "<b>"}) is None
    assert done_notice({"done": "other", "version": "3"}) is None
