"""The typed client's rules: Idempotency-Key on every send, kept across retries; 429/503
retried after Retry-After; what must not repeat is not repeated; errors carry the API's
fields. The HTTP exchange is scripted at the transport (``httpx.MockTransport``); the real
API is in ``tests/integration/test_client.py``."""

from __future__ import annotations

import json

import httpx
import pytest
from safedelivr_client import OPERATIONS, ApiError, AsyncClient, Client
from safedelivr_client._core import Request, wait_before_retry

from services.api.openapi import OPERATIONS as DOCUMENTED

ACCEPTED = {"batch_id": "b", "accepted": 1, "suppressed": [], "rejected": []}


def scripted(*answers: httpx.Response) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return queue.pop(0)

    return httpx.MockTransport(handler), seen


def _client(transport: httpx.MockTransport) -> Client:
    return Client("http://api.test", "sd_live_k", transport=transport, max_wait=0)


def test_every_documented_operation_has_a_method_on_both_clients() -> None:
    assert set(OPERATIONS) == {op.operation_id for op in DOCUMENTED}
    for method in OPERATIONS.values():
        assert callable(getattr(Client, method)) and callable(getattr(AsyncClient, method))


def test_a_send_retried_after_503_keeps_its_idempotency_key() -> None:
    transport, seen = scripted(
        httpx.Response(
            503, headers={"Retry-After": "0"}, json={"error": {"code": "x", "message": "y"}}
        ),
        httpx.Response(202, json=ACCEPTED),
    )
    with _client(transport) as sd:
        assert sd.send("s@example.com", ["a@example.com"], "Hi", text="t") == ACCEPTED

    keys = [r.headers["idempotency-key"] for r in seen]
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0]
    assert json.loads(seen[0].content)["from"] == "s@example.com"
    assert seen[0].headers["authorization"] == "Bearer sd_live_k"


def test_two_sends_get_two_keys() -> None:
    transport, seen = scripted(
        httpx.Response(202, json=ACCEPTED), httpx.Response(202, json=ACCEPTED)
    )
    with _client(transport) as sd:
        sd.send("s@example.com", "a@example.com", "Hi", text="t")
        sd.send("s@example.com", "a@example.com", "Hi", text="t")

    assert seen[0].headers["idempotency-key"] != seen[1].headers["idempotency-key"]


def test_an_error_carries_the_apis_code_and_fields() -> None:
    body = {"error": {"code": "invalid_fields", "message": "bad", "fields": {"to[0]": "nope"}}}
    transport, _ = scripted(httpx.Response(422, json=body))
    with _client(transport) as sd, pytest.raises(ApiError) as caught:
        sd.send("s@example.com", ["x"], "Hi", text="t")

    assert (caught.value.status, caught.value.code) == (422, "invalid_fields")
    assert caught.value.fields == {"to[0]": "nope"}


def test_a_refusal_at_a_cap_carries_the_cap_and_its_value() -> None:
    body = {
        "error": {
            "code": "too_many_lists",
            "message": "the limit of 100 contact lists is reached",
            "limit": {"name": "lists", "value": 100},
        }
    }
    transport, _ = scripted(httpx.Response(409, json=body))
    with _client(transport) as sd, pytest.raises(ApiError) as caught:
        sd.create_list("news")

    assert (caught.value.status, caught.value.code) == (409, "too_many_lists")
    assert caught.value.limit == ("lists", 100)


def test_making_a_key_is_not_repeated_after_a_503() -> None:
    transport, seen = scripted(
        httpx.Response(503, json={"error": {"code": "unavailable", "message": "down"}}),
    )
    with _client(transport) as sd, pytest.raises(ApiError):
        sd.create_key("x")

    assert len(seen) == 1


def test_retries_stop_after_max_retries() -> None:
    busy = httpx.Response(
        429, headers={"Retry-After": "0"}, json={"error": {"code": "r", "message": "m"}}
    )
    transport, seen = scripted(busy, busy, busy)
    sd = Client("http://api.test", "k", transport=transport, max_retries=2, max_wait=0)
    with sd, pytest.raises(ApiError) as caught:
        sd.batches()

    assert caught.value.status == 429 and len(seen) == 3


@pytest.mark.parametrize(
    ("status", "header", "attempt", "repeatable", "wait"),
    [
        (429, "7", 1, True, 7.0),
        (503, "120", 1, True, 30.0),  # capped at max_wait
        (503, None, 2, True, 1.0),  # no Retry-After: backoff 0.5 * 2^(attempt-1)
        (None, None, 1, True, 0.5),  # a connection failure
        (None, None, 1, False, None),
        (503, "1", 1, False, None),
        (429, "1", 1, False, 1.0),
        (500, None, 1, True, None),
        (429, "1", 4, True, None),  # past max_retries
    ],
)
def test_wait_before_retry(
    status: int | None, header: str | None, attempt: int, repeatable: bool, wait: float | None
) -> None:
    response = (
        None
        if status is None
        else httpx.Response(status, headers={"Retry-After": header} if header else {})
    )
    request = Request("GET", "/", safe_to_repeat=repeatable)
    assert wait_before_retry(request, attempt, response, max_retries=3, max_wait=30) == wait


async def test_the_async_client_pages_through_logs() -> None:
    pages = [
        {"data": [{"email": "a@example.com"}], "next_cursor": "c1"},
        {"data": [{"email": "b@example.com"}], "next_cursor": None},
    ]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=pages[len(seen) - 1])

    async with AsyncClient("http://api.test", "k", transport=httpx.MockTransport(handler)) as sd:
        emails = [e["email"] async for e in sd.iter_logs("b1", state="failed")]

    assert emails == ["a@example.com", "b@example.com"]
    assert seen[1].url.params["cursor"] == "c1"
    assert seen[0].url.params["state"] == "failed"


def test_path_segments_are_quoted() -> None:
    transport, seen = scripted(httpx.Response(204))
    with _client(transport) as sd:
        sd.unsuppress("a+b/c@example.com")

    assert seen[0].url.raw_path == b"/v1/suppressions/a%2Bb%2Fc@example.com"
