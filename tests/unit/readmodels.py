"""Builders of the batch read models (``services.api.queries``) for tests of the views that
shape them: every field has a plain default, a test names only what it is about."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, TypeVar

from services.api.queries import (
    BatchOverview,
    BatchSummary,
    Page,
    ProviderEvent,
    RecipientLog,
    Step,
)
from shared.core.models import Message
from shared.delivery.batchstore import BatchHeader

T0 = datetime(2026, 11, 2, 10, 0, 0, 400_000, tzinfo=UTC)
BATCH_ID = uuid.UUID("6c1f0a2e-cb0b-11f0-8000-0242ac120002")
USER_ID = uuid.UUID("00000000-0000-4000-8000-000000000001")
LOG_ID = uuid.UUID("7d2f0a2e-cb0b-11f0-8000-0242ac120002")

T = TypeVar("T")


def summary(**fields: Any) -> BatchSummary:
    defaults: dict[str, Any] = {
        "batch_id": BATCH_ID,
        "subject": "Hi",
        "recipients": 1,
        "created_at": T0,
        "status": "accepted",
    }
    return BatchSummary(**{**defaults, **fields})


def header(*, sender: dict[str, Any] | None = None, **fields: Any) -> BatchHeader:
    message = Message.model_validate(
        {
            "from": sender or {"email": "shop@example.com", "name": "Shop"},
            "subject": fields.pop("subject", "Hi"),
            "html": fields.pop("html", "<p>x</p>"),
            "bulk": fields.pop("bulk", False),
            "attachments": fields.pop("attachments", ()),
        }
    )
    defaults: dict[str, Any] = {
        "batch_id": BATCH_ID,
        "user_id": USER_ID,
        "created_at": T0,
        "message": message,
        "recipient_count": 1,
        "chunk_size": 1000,
        "chunk_count": 1,
        "status": "dispatched",
        "reason": None,
    }
    return BatchHeader(**{**defaults, **fields})


def overview(**fields: Any) -> BatchOverview:
    defaults: dict[str, Any] = {
        "header": header(),
        "status": "dispatched",
        "counts": {"queued": 1, "success": 0, "failed": 0},
        "events": {},
        "failure_reasons": {},
    }
    return BatchOverview(**{**defaults, **fields})


def step(attempt: int, provider: str, state: str, at: datetime | None) -> Step:
    return Step(attempt=attempt, provider=provider, state=state, at=at, error=None)


def event(
    at: datetime, kind: str, provider: str = "sg", detail: str | None = None
) -> ProviderEvent:
    return ProviderEvent(at=at, provider=provider, kind=kind, detail=detail)


def recipient(**fields: Any) -> RecipientLog:
    defaults: dict[str, Any] = {
        "log_id": LOG_ID,
        "email": "a@example.com",
        "name": None,
        "state": "queued",
        "event": "queued",
        "providers": {},
        "message_ids": {},
        "reason": None,
        "updated_at": None,
        "attempts": [],
        "resends": [],
        "events": [],
    }
    return RecipientLog(**{**defaults, **fields})


def page(items: list[T], next_cursor: str | None = None) -> Page[T]:
    return Page(items, next_cursor)
