"""HTTP plumbing of the handlers: bounded body reading, form decoding, orjson answers.

The send endpoints must answer an oversized body with the provider's own 413, so they read
the stream themselves instead of relying on a generic body-limit middleware.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import orjson
from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import Response

from shared.core.digits import natural

#: Form fields accepted in one request (1,000 repeated ``to`` plus everything else).
MAX_FORM_FIELDS = 10_000


@dataclass(frozen=True, slots=True)
class Form:
    """Decoded form: text fields in order, and the attachments' names and sizes."""

    fields: list[tuple[str, str]]
    files: list[dict[str, object]] = field(default_factory=list)


def json_response(
    content: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """``content`` serialised with orjson."""
    return Response(orjson.dumps(content), status, headers, media_type="application/json")


async def read_body(request: Request, limit: int) -> bytes | None:
    """The whole body, or None as soon as it is known to be larger than ``limit`` bytes."""
    declared = natural(request.headers.get("content-length"))
    if declared is not None and declared > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_form(headers: Headers, body: bytes, *, max_part_size: int) -> Form | str:
    """Decode an urlencoded or multipart body; return the parser's complaint when it fails."""
    content_type = headers.get("content-type", "").partition(";")[0].strip().lower()
    if content_type == "multipart/form-data":
        return await _parse_multipart(headers, body, max_part_size)
    if content_type in ("application/x-www-form-urlencoded", ""):
        try:
            text = body.decode()
            pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
        except (UnicodeDecodeError, ValueError) as exc:
            return f"invalid form body: {exc}"
        return Form(pairs)
    return f"unsupported content type {content_type!r}; send a form"


async def _parse_multipart(headers: Headers, body: bytes, max_part_size: int) -> Form | str:
    async def _stream() -> AsyncGenerator[bytes, None]:
        yield body

    parser = MultiPartParser(
        headers,
        _stream(),
        max_files=MAX_FORM_FIELDS,
        max_fields=MAX_FORM_FIELDS,
        max_part_size=max_part_size,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        return exc.message
    fields: list[tuple[str, str]] = []
    files: list[dict[str, object]] = []
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            files.append(
                {
                    "field": name,
                    "filename": value.filename,
                    "size": value.size,
                    "content_type": value.content_type,
                }
            )
        else:
            fields.append((name, value))
    await form.close()
    return Form(fields, files)
