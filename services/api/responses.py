"""JSON responses and the error envelope ``{"error": {"code", "message", "fields"?}}``."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class ApiError(Exception):
    """Raised by handlers; rendered as the error envelope with ``status``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        fields: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields
        self.headers = headers


def error_response(error: ApiError) -> JSON:
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.fields:
        body["fields"] = error.fields
    return JSON({"error": body}, status_code=error.status, headers=error.headers)
