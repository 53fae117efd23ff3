"""The Preferences page (``services.api.dashboard.preference_pages``): the form as the stored
preferences fill it, the ``PATCH /v1/preferences`` body it stands for, and its HTML."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from services.api.dashboard import create_templates
from services.api.dashboard.preference_pages import form_values, patch_body, submitted
from services.api.sessions import SessionUser
from shared.accounts.preferences import MAX_COOLDOWN, Preferences
from shared.infra.http import ApiError

USER = SessionUser(uuid.uuid4(), "ann", None, None, None, "CSRF-TOKEN-1", "s")


def rendered(values: dict[str, Any], errors: dict[str, list[str]] | None = None) -> str:
    context = {"user": USER, "operator": False, "active": "preferences", "notice": None}
    context |= {"title": "Preferences", "values": values, "errors": errors or {}}
    return (
        create_templates()
        .env.get_template("preferences.html")
        .render({**context, "max_cooldown": MAX_COOLDOWN})
    )


def test_an_unticked_box_is_off_and_the_body_names_every_field() -> None:
    values = submitted({"clicks": "on", "cooldown": " 60 ", "per_category": "on"})

    assert patch_body(values) == {
        "tracking": {"opens": False, "clicks": True},
        "unsubscribe": False,
        "cooldown": {"seconds": 60, "per_category": True},
    }


def test_an_empty_cooldown_is_none() -> None:
    assert patch_body(submitted({}))["cooldown"]["seconds"] == 0


@pytest.mark.parametrize("raw", ["ten", "-1", "1.5", "١٢", "9999999999"])
def test_a_cooldown_that_is_not_a_whole_number_of_seconds_is_refused(raw: str) -> None:
    with pytest.raises(ApiError) as caught:
        patch_body(submitted({"cooldown": raw}))

    assert caught.value.status == 422
    assert caught.value.fields is not None and "cooldown" in caught.value.fields


def test_the_form_shows_the_stored_preferences() -> None:
    stored = Preferences(track_opens=True, unsubscribe=True, cooldown_seconds=3600)

    page = rendered(form_values(stored))

    assert 'name="opens" type="checkbox" checked' in page
    assert 'name="clicks" type="checkbox" aria' in page
    assert 'name="unsubscribe" type="checkbox" checked' in page
    assert 'value="3600"' in page
    assert 'name="csrf_token" value="CSRF-TOKEN-1"' in page


def test_a_refused_cooldown_is_told_beside_its_field_with_what_was_typed() -> None:
    values = submitted({"cooldown": "ten"})

    page = rendered(values, {"cooldown": ["a whole number of seconds, 0 to 604,800"]})

    assert 'id="cooldown-errors"' in page and 'aria-invalid="true"' in page
    assert 'value="ten"' in page
