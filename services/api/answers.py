"""The ``/v1`` answers of the batch read models, built as ``services/api/schema.py``'s answer
models (the field names and formats of the wire; times stay ISO strings with ``+00:00``).
A page's entries are built :func:`~services.api.schema.trusted` (unvalidated; validated under
tests), the rest validated."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from services.api import schema
from services.api.queries import BatchOverview, BatchSummary, Page, RecipientLog, Step
from shared.core.models import TemplateUse


def _when(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def batch_list(page: Page[BatchSummary]) -> schema.BatchList:
    return schema.BatchList(
        data=[
            schema.trusted(
                schema.BatchItem,
                {
                    "batch_id": str(b.batch_id),
                    "subject": b.subject,
                    "recipients": b.recipients,
                    "created_at": b.created_at.isoformat(),
                    "status": b.status,
                },
            )
            for b in page.items
        ],
        next_cursor=page.next_cursor,
    )


def batch(view: BatchOverview) -> schema.BatchView:
    header, message = view.header, view.header.message
    return schema.BatchView(
        batch_id=str(header.batch_id),
        status=view.status,
        created_at=header.created_at.isoformat(),
        subject=message.subject,
        from_=message.sender.model_dump(),
        bulk=message.bulk,
        priority=message.lane,
        recipients=header.recipient_count,
        chunks=header.chunk_count,
        send_at=header.send_at.isoformat() if header.send_at else None,
        template=template(message.template),
        counts=view.counts,
        events=view.events,
        failure_reasons=view.failure_reasons,
        attachments=[
            schema.AttachmentOut(
                filename=a.filename,
                content_type=a.content_type,
                size=a.size,
                disposition=a.disposition,
                content_id=a.content_id,
            )
            for a in message.attachments
        ],
    )


def template(use: TemplateUse | None) -> schema.TemplateRefOut | None:
    """The template version(s) a batch sends, as its answers show them."""
    if use is None:
        return None
    return schema.TemplateRefOut(
        id=str(use.id),
        version=use.version,
        canary_version=use.canary.version if use.canary else None,
    )


def _step(step: Step) -> dict[str, Any]:
    # A dict: the document types ``attempts`` and ``resends`` as objects of any keys.
    return {
        "attempt": step.attempt,
        "provider": step.provider,
        "state": step.state,
        "at": _when(step.at),
        "error": step.error,
        "resolution": step.resolution,
    }


def recipient(log: RecipientLog) -> schema.LogEntry:
    return schema.trusted(
        schema.LogEntry,
        {
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
                {
                    "at": e.at.isoformat(),
                    "provider": e.provider,
                    "event": e.kind,
                    "detail": e.detail,
                }
                for e in log.events
            ],
        },
    )


def logs_page(page: Page[RecipientLog]) -> schema.LogsPage:
    return schema.LogsPage(
        data=[recipient(log) for log in page.items], next_cursor=page.next_cursor
    )
