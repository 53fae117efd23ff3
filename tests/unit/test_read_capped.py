"""Reading request bodies: capped in size while they stream in, and in time (every service's
handlers read bodies through ``shared.infra.http.read_capped``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from shared.infra.http import ApiError, read_capped


def request(parts: list[bytes], *, delay: float = 0.0, length: str | None = None) -> Request:
    headers = [(b"content-length", length.encode())] if length is not None else []
    pending = list(parts)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(delay)
        part = pending.pop(0) if pending else b""
        return {"type": "http.request", "body": part, "more_body": bool(pending)}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    return Request(scope, receive)


async def test_a_body_within_its_limits_is_read_whole() -> None:
    assert await read_capped(request([b"ab", b"cd"]), 4) == b"abcd"


async def test_a_body_over_the_cap_is_a_413_while_it_streams() -> None:
    with pytest.raises(ApiError) as caught:
        await read_capped(request([b"ab", b"cde"]), 4)
    assert caught.value.status == 413


@pytest.mark.parametrize("length", ["5", "99999999999999999999999"])
async def test_a_declared_length_over_the_cap_is_a_413_before_reading(length: str) -> None:
    with pytest.raises(ApiError) as caught:
        await read_capped(request([], length=length), 4)
    assert caught.value.status == 413


@pytest.mark.parametrize("length", ["²", "-1", "4 ", ""])
async def test_a_garbled_declared_length_is_not_trusted_either_way(length: str) -> None:
    assert await read_capped(request([b"ab"], length=length), 4) == b"ab"


async def test_a_body_that_trickles_in_past_the_timeout_is_a_408() -> None:
    with pytest.raises(ApiError) as caught:
        await read_capped(request([b"a", b"b", b"c"], delay=0.1), 10, timeout=0.15)
    assert (caught.value.status, caught.value.code) == (408, "body_timeout")
