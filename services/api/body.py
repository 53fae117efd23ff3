"""Reading request bodies with a size cap enforced while they stream in."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from services.api.responses import ApiError


async def read_capped(request: Request, limit: int) -> bytes:
    """The raw body, or 413 as soon as it (or its declared length) passes ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, limit: int) -> tuple[bytes, Any]:
    ctype = request.headers.get("content-type", "")
    if ctype and "json" not in ctype.split(";")[0]:
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    raw = await read_capped(request, limit)
    try:
        return raw, orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from exc


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "body_too_large", f"the request body exceeds {limit} bytes")
