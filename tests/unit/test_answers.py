"""The /v1 answers of the batch read models: the documented shapes, field for field."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
from pydantic import BaseModel

from services.api import answers, schema
from services.api.dashboard.views import batch_detail
from shared.infra.http import Answer
from tests.unit import readmodels


def _wire(model: BaseModel) -> Any:
    return orjson.loads(Answer(model).body)


def test_a_recipient_answer_is_the_documented_log_entry() -> None:
    log = readmodels.recipient(
        attempts=[readmodels.step(0, "sg", "sent", readmodels.T0)],
        events=[readmodels.event(readmodels.T0 + timedelta(seconds=1), "delivered")],
        updated_at=readmodels.T0,
    )
    answer = _wire(answers.recipient(log))

    assert set(answer) == set(schema.LogEntry.model_fields)
    schema.LogEntry.model_validate(answer)
    assert answer["updated_at"] == "2026-11-02T10:00:00.400000+00:00"
    assert answer["timeline"] == [
        {"at": "2026-11-02T10:00:01.400000+00:00", "provider": "sg", "event": "delivered",
         "detail": None}
    ]  # fmt: skip


def test_status_says_which_providers_took_the_recipient() -> None:
    log = readmodels.recipient(providers={"sg": "dropped", "mg": "delivered", "safedelivr": "x"})
    assert _wire(answers.recipient(log))["status"] == {"sg": False, "mg": True}


def test_a_batch_answer_is_the_documented_view_with_its_sender_under_from() -> None:
    answer = _wire(answers.batch(readmodels.overview(failure_reasons={"mailbox full": 2})))

    schema.BatchView.model_validate(answer)
    assert answer["from"] == {"email": "shop@example.com", "name": "Shop"}
    assert answer["batch_id"] == str(readmodels.BATCH_ID)
    assert answer["failure_reasons"] == {"mailbox full": 2}
    assert answer["priority"] == "transactional"  # stored without a lane: before lanes existed


FILE = {"filename": "a.pdf", "content_type": "application/pdf", "content": "JVBERi0xLjQK"}


def test_a_batch_answer_shows_each_attachment_but_never_its_content() -> None:
    inline = {**FILE, "filename": "l.png", "disposition": "inline", "content_id": "logo"}
    view = readmodels.overview(header=readmodels.header(attachments=[FILE, inline]))
    answer = _wire(answers.batch(view))

    schema.BatchView.model_validate(answer)
    assert answer["attachments"] == [
        {"filename": "a.pdf", "content_type": "application/pdf", "size": 9,
         "disposition": "attachment", "content_id": None},
        {"filename": "l.png", "content_type": "application/pdf", "size": 9,
         "disposition": "inline", "content_id": "logo"},
    ]  # fmt: skip
    assert b"JVBERi0xLjQK" not in Answer(answers.batch(view)).body


def test_the_batch_page_lists_attachments_by_name_type_and_size() -> None:
    view = readmodels.overview(header=readmodels.header(attachments=[FILE]))
    assert batch_detail(view).attachments == [("a.pdf", "application/pdf", 9)]


def test_a_batch_list_answer_is_the_documented_list() -> None:
    page = _wire(answers.batch_list(readmodels.page([readmodels.summary()], "next")))

    schema.BatchList.model_validate(page)
    assert page["next_cursor"] == "next"
    assert page["data"][0]["created_at"] == readmodels.T0.isoformat()


def test_a_trusted_answer_is_byte_equal_to_the_validated_one() -> None:
    log = readmodels.recipient(
        attempts=[readmodels.step(0, "sg", "sent", readmodels.T0)],
        events=[readmodels.event(readmodels.T0 + timedelta(seconds=1), "delivered")],
        updated_at=readmodels.T0,
    )
    fields = _wire(answers.recipient(log))
    built = schema.trusted(schema.LogEntry, fields)
    validated = schema.LogEntry.model_validate(fields)
    assert Answer(built).body == Answer(validated).body


def test_an_answer_leaves_out_what_was_not_set_and_names_from_by_its_alias() -> None:
    view = answers.batch(readmodels.overview())
    wire = _wire(view)
    assert "from" in wire and "from_" not in wire
    accepted = schema.Accepted(
        batch_id="b", accepted=1, suppressed=[], rejected=[], skipped=[], priority="bulk"
    )
    assert "status" not in _wire(accepted)  # never set: absent, as a dict key would be
