"""The ``/v1`` JSON answers of the batch read models: the field names and formats of the wire
(``services/api/schema.py`` describes the same shapes for the OpenAPI document; the contract
test holds the two together)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from services.api.queries import BatchOverview, BatchSummary, Page, RecipientLog, Step
from shared.core.models import TemplateUse


def _when(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def batch_list(page: Page[BatchSummary]) -> dict[str, Any]:
    return {
        "data": [
            {
                "batch_id": str(b.batch_id),
                "subject": b.subject,
                "recipients": b.recipients,
                "created_at": b.created_at.isoformat(),
                "status": b.status,
            }
            for b in page.items
        ],
        "next_cursor": page.next_cursor,
    }


def batch(view: BatchOverview) -> dict[str, Any]:
    header, message = view.header, view.header.message
    return {
        "batch_id": str(header.batch_id),
        "status": view.status,
        "created_at": header.created_at.isoformat(),
        "subject": message.subject,
        "from": message.sender.model_dump(),
        "bulk": message.bulk,
        "priority": message.lane,
        "recipients": header.recipient_count,
        "chunks": header.chunk_count,
        "send_at": header.send_at.isoformat() if header.send_at else None,
        "template": _template(message.template),
        "counts": view.counts,
        "events": view.events,
        "failure_reasons": view.failure_reasons,
    }


def _template(use: TemplateUse | None) -> dict[str, Any] | None:
    if use is None:
        return None
    return {
        "id": str(use.id),
        "version": use.version,
        "canary_version": use.canary.version if use.canary else None,
    }


def _step(step: Step) -> dict[str, Any]:
    return {
        "attempt": step.attempt,
        "provider": step.provider,
        "state": step.state,
        "at": _when(step.at),
        "error": step.error,
        "resolution": step.resolution,
    }


def recipient(log: RecipientLog) -> dict[str, Any]:
    return {
        "log_id": str(log.log_id),
        "email": log.email,
        "name": log.name,
        "state": log.state,
        "event": log.event,
        "providers": log.providers,
        "status": log.accepted_by,
        "message_ids": log.message_ids,
        "reason": log.reason,
        "updated_at": _when(log.updated_at),
        "template_version": log.template_version,
        "attempts": [_step(a) for a in log.attempts],
        "resends": [_step(r) for r in log.resends],
        "timeline": [
            {"at": e.at.isoformat(), "provider": e.provider, "event": e.kind, "detail": e.detail}
            for e in log.events
        ],
    }


def logs_page(page: Page[RecipientLog]) -> dict[str, Any]:
    return {"data": [recipient(log) for log in page.items], "next_cursor": page.next_cursor}
