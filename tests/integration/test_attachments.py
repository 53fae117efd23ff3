"""Attachments on the real stack (Cassandra, RabbitMQ, consumers, the sandbox): a batch's
files are stored with it, shown by name and size, and reach the provider it goes through."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import pytest

from shared.delivery.validation import MAX_ATTACHMENTS_BYTES
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.integration.stack import Stack, emails, fast_settings, full_stack

PDF = b"%PDF-1.4 " + bytes(range(256)) * 64
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 100
FILES = [
    {
        "filename": "invoice.pdf",
        "content_type": "application/pdf",
        "content": base64.b64encode(PDF).decode(),
    },
    {
        "filename": "logo.png",
        "content_type": "image/png",
        "content": base64.b64encode(PNG).decode(),
        "disposition": "inline",
        "content_id": "logo",
    },
]


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings), db) as s:
        yield s


@pytest.mark.parametrize(
    ("provider", "inline_name"),
    [("sendgrid", "logo.png"), ("mailgun", "logo")],
    ids=["sendgrid", "mailgun"],
)
async def test_a_batch_with_two_attachments_is_delivered_with_both(
    stack: Stack, provider: str, inline_name: str
) -> None:
    """Both files reach each recipient's copy (the sandbox records their names and sizes),
    and the batch's answer lists them without their content."""
    to = emails(2, f"files-{provider}")
    async with stack.consuming():
        batch_id = await stack.submit(
            to, html='<p>Invoice <img src="cid:logo"></p>', attachments=FILES, provider=provider
        )
        logs = await stack.final(batch_id, 2)
        received = await stack.received(to[1])
    view = (await stack.api.get(f"/v1/batches/{batch_id}", headers=stack.auth)).json()

    assert {r["state"] for r in logs.values()} == {"success"}
    assert received["provider"] == provider
    assert [(a["filename"], a["size"]) for a in received["attachments"]] == [
        ("invoice.pdf", len(PDF)),
        (inline_name, len(PNG)),
    ]
    assert [(a["filename"], a["size"], a["disposition"]) for a in view["attachments"]] == [
        ("invoice.pdf", len(PDF), "attachment"),
        ("logo.png", len(PNG), "inline"),
    ]
    assert "content" not in view["attachments"][0]


async def test_a_bad_attachment_is_a_422_naming_it(stack: Stack) -> None:
    bad = {**FILES[0], "content": "not base64"}
    resp = await stack.post(emails(1, "files-bad"), attachments=[FILES[0], bad])

    assert resp.status_code == 422
    assert set(resp.json()["error"]["fields"]) == {"attachments[1].content"}


async def test_files_at_the_size_limit_are_stored_and_delivered(stack: Stack) -> None:
    """7 MiB of files (9.3 MiB of base64) fit in the API's body cap, in one batch's stored
    content and in a SendGrid request."""
    half = MAX_ATTACHMENTS_BYTES // 2
    files = [
        {"filename": f"{n}.bin", "content_type": "application/octet-stream",
         "content": base64.b64encode(bytes([n]) * size).decode()}
        for n, size in enumerate((half, MAX_ATTACHMENTS_BYTES - half))
    ]  # fmt: skip
    to = emails(1, "files-big")
    async with stack.consuming():
        batch_id = await stack.submit(to, attachments=files, provider="sendgrid")
        logs = await stack.final(batch_id, 1)
        received = await stack.received(to[0])

    assert [r["state"] for r in logs.values()] == ["success"]
    assert sum(a["size"] for a in received["attachments"]) == MAX_ATTACHMENTS_BYTES
