"""The /v1 answers of the batch read models: the documented shapes, field for field."""

from __future__ import annotations

from datetime import timedelta

from services.api import answers, schema
from tests.unit import readmodels


def test_a_recipient_answer_is_the_documented_log_entry() -> None:
    log = readmodels.recipient(
        attempts=[readmodels.step(0, "sg", "sent", readmodels.T0)],
        events=[readmodels.event(readmodels.T0 + timedelta(seconds=1), "delivered")],
        updated_at=readmodels.T0,
    )
    answer = answers.recipient(log)

    assert set(answer) == set(schema.LogEntry.model_fields)
    schema.LogEntry.model_validate(answer)
    assert answer["updated_at"] == "2026-11-02T10:00:00.400000+00:00"
    assert answer["timeline"] == [
        {"at": "2026-11-02T10:00:01.400000+00:00", "provider": "sg", "event": "delivered",
         "detail": None}
    ]  # fmt: skip


def test_status_says_which_providers_took_the_recipient() -> None:
    log = readmodels.recipient(providers={"sg": "dropped", "mg": "delivered", "safedelivr": "x"})
    assert answers.recipient(log)["status"] == {"sg": False, "mg": True}


def test_a_batch_answer_is_the_documented_view_with_its_sender_under_from() -> None:
    answer = answers.batch(readmodels.overview(failure_reasons={"mailbox full": 2}))

    schema.BatchView.model_validate(answer)
    assert answer["from"] == {"email": "shop@example.com", "name": "Shop"}
    assert answer["batch_id"] == str(readmodels.BATCH_ID)
    assert answer["failure_reasons"] == {"mailbox full": 2}
    assert answer["priority"] == "transactional"  # stored without a lane: before lanes existed


def test_a_batch_list_answer_is_the_documented_list() -> None:
    page = answers.batch_list(readmodels.page([readmodels.summary()], "next"))

    schema.BatchList.model_validate(page)
    assert page["next_cursor"] == "next"
    assert page["data"][0]["created_at"] == readmodels.T0.isoformat()
