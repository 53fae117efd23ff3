"""The original's helpers and shapes (``/api/*``); its own test cases come first."""

from __future__ import annotations

import pytest

from services.api.original_form import (
    batch_body,
    batch_row,
    has_essentials,
    is_email,
    is_multipart,
    log_row,
    midnight,
    options,
    stat_rows,
)
from tests.unit import readmodels


@pytest.mark.parametrize(
    ("email", "valid"),
    [
        # validations_test.go TestIsEmail
        ("sample@sample.com", True),
        ("sample-@sample.com", True),
        ("sample-sample@sample.com", True),
        ("sample.sample@sample.co.mn", True),
        ("sample.sample@sample", False),
        ("", False),
        # ours
        ("Ann.Lee+tag@Example.ORG", True),
        ("t@.com", False),
        ("a@b.c\n", False),
        ("x" * 320 + "@example.com", False),
    ],
)
def test_is_email(email: str, valid: bool) -> None:
    assert is_email(email) is valid


def test_has_essentials_as_the_originals_own_test_walks_it() -> None:
    """validations_test.go TestHasEssentials, step by step."""
    body: dict[str, list[str]] = {}
    assert has_essentials(body) is False
    body["to"], body["from"] = [], []
    assert has_essentials(body) is False  # empty to and from
    body["to"], body["from"] = ["t@.com"], ["t@t.com"]
    assert has_essentials(body) is False  # an invalid to
    body["subject"], body["body"] = [], []
    assert has_essentials(body) is False  # empty subject and body
    body["to"], body["subject"], body["body"] = ["t@t.com"], ["Hello World"], ["Mah message"]
    assert has_essentials(body) is True


def test_has_essentials_lets_a_missing_to_pass_as_the_original_did() -> None:
    assert has_essentials({"from": ["a@b.co"], "subject": ["s"], "body": ["b"]}) is True


@pytest.mark.parametrize(
    ("header", "multipart"),
    [
        # webhook_test.go TestIsMultipart
        ("lol; noboundary=kkk", False),
        ("form-data; boundary=acdefawoeoeoeo", True),
        ("form-data; boundaryies=acdefawoeoeoeo", False),
        # ours
        ("multipart/form-data; boundary=x", True),
        ("Multipart/Form-Data; charset=utf-8; boundary=x", True),
        ("lol; boundary=kkk", False),
        ("application/x-www-form-urlencoded", False),
        (None, False),
    ],
)
def test_is_multipart(header: str | None, multipart: bool) -> None:
    assert is_multipart(header) is multipart


def test_batch_body_maps_the_original_fields() -> None:
    body = batch_body(
        {
            "from": ["shop@example.com"],
            "name": ["Shop"],
            "to": ["a@example.com", "b@example.com"],
            "subject": ["Hi"],
            "body": ["<p>Hello</p>"],
            "is_bulk": ["true"],
        }
    )
    assert body == {
        "from": {"email": "shop@example.com", "name": "Shop"},
        "to": ["a@example.com", "b@example.com"],
        "subject": "Hi",
        "html": "<p>Hello</p>",
        "bulk": True,
    }


@pytest.mark.parametrize(("name", "bulk"), [("S", "TRUE"), ("", "1"), ("", "")])
def test_a_one_character_name_is_dropped_and_only_exactly_true_is_bulk(
    name: str, bulk: str
) -> None:
    body = batch_body({"from": ["s@e.com"], "name": [name], "is_bulk": [bulk]})
    assert body["from"] == "s@e.com"
    assert body["bulk"] is False


def test_stat_rows_keep_active_days_only_at_utc_midnight() -> None:
    days = [
        {"date": "2026-11-24", "queued": 0, "success": 0, "failed": 0, "opened": 3},
        {"date": "2026-11-25", "queued": 2, "success": 5, "failed": 1, "opened": 0},
    ]
    assert stat_rows("u", days) == [
        {"user_id": "u", "date": "2026-11-25T00:00:00Z", "queued": 2, "success": 5, "failed": 1}
    ]


def test_a_log_row_has_the_original_columns() -> None:
    entry = readmodels.recipient(state="success", providers={"sg": "delivered"})
    assert log_row(entry, "b", "u", "2026-11-25T10:00:00+00:00") == {
        "log_id": str(readmodels.LOG_ID),
        "batch_id": "b",
        "user_id": "u",
        "email": "a@example.com",
        "state": "success",
        "status": {"sg": True},
        "created_at": "2026-11-25T10:00:00+00:00",
        "last_update": "2026-11-25T10:00:00+00:00",
    }


def test_midnight_is_rfc3339_utc() -> None:
    from datetime import date

    assert midnight(date(2017, 8, 1)) == "2017-08-01T00:00:00Z"


def test_a_batch_row_has_the_original_columns_and_options() -> None:
    header = readmodels.header(sender={"email": "s@example.com", "name": "Shop"}, subject="Hi")
    reasons = {"mailbox full": 2, "unknown user": 1}

    row = batch_row(header, "completed", reasons, ["a@example.com", "b@example.com"])

    assert row == {
        "batch_id": str(readmodels.BATCH_ID),
        "user_id": str(readmodels.USER_ID),
        "subject": "Hi",
        "created_at": readmodels.T0.isoformat(),
        "last_updated": readmodels.T0.isoformat(),
        "status": "completed",
        "reason": "mailbox full",
        "code": "",
        "description": "",
        "options": {
            "from": "s@example.com",
            "subject": "Hi",
            "content": "<p>x</p>",
            "isBulk": "false",
            "name": "Shop",
            "to": "a@example.com,b@example.com",
        },
    }


def test_options_carry_no_to_when_none_is_given() -> None:
    message = readmodels.header(sender={"email": "s@example.com"}, bulk=True).message
    assert "to" not in options(message, None)
