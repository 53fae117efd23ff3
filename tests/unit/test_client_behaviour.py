"""The typed client (``clients/python``) against the API's documented wire behaviour, in both
its sync and async forms: the requests each method makes, the Idempotency-Key kept across
every retry, 429/503 retried after a bounded Retry-After, other errors raised at once as
``ApiError`` from the ``{"error": {"code", "message", "fields"?}}`` envelope, pagination by
``next_cursor``, connection failures and timeouts. The API is an ``httpx.MockTransport``
handler answering as ``services/api`` does; waits are recorded instead of slept."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safedelivr_client import ApiError, AsyncClient, Client, _clients
from safedelivr_client._core import Request, retry_after, wait_before_retry

BASE = "http://api.test"
KEY = "sd_live_behaviour"
ACCEPTED = {"batch_id": "b-1", "accepted": 2, "suppressed": [], "rejected": []}

Answer = httpx.Response | Exception


def envelope(status: int, code: str, message: str = "m", **kw: Any) -> httpx.Response:
    """An error answer as ``shared.infra.http.error_response`` renders it."""
    error: dict[str, Any] = {"code": code, "message": message}
    if "fields" in kw:
        error["fields"] = kw.pop("fields")
    return httpx.Response(status, json={"error": error}, **kw)


def busy(status: int = 503, after: str | None = "0") -> httpx.Response:
    code = "rate_limited" if status == 429 else "unavailable"
    headers = {"Retry-After": after} if after is not None else {}
    return envelope(status, code, "retry shortly", headers=headers)


class FakeApi:
    """The API at the transport: answers from ``script`` in order (then ``rest``), and
    remembers every request it was sent."""

    def __init__(self, script: Sequence[Answer] = (), rest: Answer | None = None) -> None:
        self.script = list(script)
        self.rest = rest
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        answer = self.script.pop(0) if self.script else self.rest
        assert answer is not None, f"unexpected request {request.method} {request.url}"
        if isinstance(answer, Exception):
            raise answer
        return answer

    def keys(self) -> list[str | None]:
        return [r.headers.get("idempotency-key") for r in self.seen]


@pytest.fixture(autouse=True)
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every wait either client makes between retries, in order (nothing really sleeps)."""
    slept: list[float] = []

    async def asleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(_clients, "time", SimpleNamespace(sleep=slept.append))
    monkeypatch.setattr(_clients, "asyncio", SimpleNamespace(sleep=asleep))
    return slept


@pytest.fixture(params=["sync", "async"])
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _options(kw: dict[str, Any]) -> dict[str, Any]:
    return {k: kw.pop(k) for k in ("max_retries", "max_wait", "timeout") if k in kw}


async def call(variant: str, api: FakeApi, method: str, *args: Any, **kw: Any) -> Any:
    """``method`` of a fresh client of ``variant`` over ``api`` (client options in ``kw``)."""
    options = _options(kw)
    transport = httpx.MockTransport(api)
    if variant == "sync":
        with Client(BASE, KEY, transport=transport, **options) as sd:
            return getattr(sd, method)(*args, **kw)
    async with AsyncClient(BASE, KEY, transport=transport, **options) as sd:
        return await getattr(sd, method)(*args, **kw)


async def collect(variant: str, api: FakeApi, method: str, *args: Any, **kw: Any) -> list[Any]:
    """Everything an ``iter_*`` method yields."""
    options = _options(kw)
    transport = httpx.MockTransport(api)
    if variant == "sync":
        with Client(BASE, KEY, transport=transport, **options) as sd:
            return list(getattr(sd, method)(*args, **kw))
    async with AsyncClient(BASE, KEY, transport=transport, **options) as sd:
        return [item async for item in getattr(sd, method)(*args, **kw)]


def _send(variant: str, api: FakeApi, **kw: Any) -> Any:
    return call(variant, api, "send", "shop@example.com", ["a@example.com"], "Hi", text="t", **kw)


# -- idempotency -----------------------------------------------------------------------------


async def test_a_send_keeps_one_idempotency_key_through_every_kind_of_retry(variant: str) -> None:
    api = FakeApi(
        [
            busy(503),
            busy(429),
            httpx.ConnectError("connection refused"),
            httpx.ReadTimeout("no answer"),
            httpx.Response(202, json=ACCEPTED),
        ]
    )

    assert await _send(variant, api, max_retries=4) == ACCEPTED

    keys = api.keys()
    assert len(keys) == 5 and len(set(keys)) == 1 and keys[0]
    assert len({r.content for r in api.seen}) == 1  # the same body every time


async def test_a_callers_idempotency_key_is_sent_as_given_on_every_try(variant: str) -> None:
    api = FakeApi([busy(503), httpx.Response(202, json=ACCEPTED)])

    await _send(variant, api, idempotency_key="order-42")

    assert api.keys() == ["order-42", "order-42"]


@pytest.mark.parametrize("lost", [httpx.ConnectError, httpx.ReadTimeout])
async def test_making_a_key_is_never_repeated_after_a_lost_answer(
    variant: str, lost: type[httpx.TransportError]
) -> None:
    """A connection failure or timeout may have made the key: trying again could make two."""
    api = FakeApi([lost("answer lost")])

    with pytest.raises(lost):
        await call(variant, api, "create_key", "ci")

    assert len(api.seen) == 1
    assert api.seen[0].headers.get("idempotency-key") is None


async def test_making_a_key_is_retried_after_a_429_which_did_nothing(variant: str) -> None:
    made = {"key": "sd_live_new", "name": "ci", "note": "shown once"}
    api = FakeApi([busy(429, "3"), httpx.Response(201, json=made)])

    assert await call(variant, api, "create_key", "ci") == made
    assert len(api.seen) == 2


CAMPAIGN = {"id": "c-1", "state": "scheduled"}
NOT_REPEATED = [
    ("create_campaign", ("Autumn", "t-1", "l-1", "news@example.com")),
    ("schedule_campaign", ("c-1",)),
    ("resume_campaign", ("c-1",)),
]


@pytest.mark.parametrize(("method", "args"), NOT_REPEATED, ids=[m for m, _ in NOT_REPEATED])
@pytest.mark.parametrize("lost", ["connection", "503"])
async def test_creating_scheduling_or_resuming_a_campaign_is_not_repeated_after_a_lost_answer(
    variant: str, method: str, args: tuple[str, ...], lost: str
) -> None:
    """A second create makes a second draft; a second schedule or resume is a 409."""
    first: Answer = httpx.ConnectError("answer lost") if lost == "connection" else busy(503)
    api = FakeApi([first], rest=httpx.Response(200, json=CAMPAIGN))

    with pytest.raises((httpx.ConnectError, ApiError)):
        await call(variant, api, method, *args)

    assert len(api.seen) == 1


@pytest.mark.parametrize("method", ["pause_campaign", "cancel_campaign"])
async def test_pausing_or_cancelling_is_retried_the_api_answers_a_repeat_alike(
    variant: str, method: str
) -> None:
    api = FakeApi(
        [httpx.ConnectError("answer lost"), busy(503)], rest=httpx.Response(200, json=CAMPAIGN)
    )

    assert await call(variant, api, method, "c-1") == CAMPAIGN
    assert len(api.seen) == 3


async def test_a_new_key_asks_for_its_scopes_and_expiry_only_when_given(variant: str) -> None:
    made = {"key": "sd_live_new", "name": "ci", "scopes": ["send"], "note": "shown once"}
    api = FakeApi([httpx.Response(201, json=made), httpx.Response(201, json=made)])

    await call(variant, api, "create_key", "ci", scopes=["send"], expires_at="2027-01-01T00:00:00Z")
    await call(variant, api, "create_key", "plain")

    assert [json.loads(r.content) for r in api.seen] == [
        {"name": "ci", "scopes": ["send"], "expires_at": "2027-01-01T00:00:00Z"},
        {"name": "plain"},
    ]


# -- waiting before a retry ------------------------------------------------------------------


async def test_each_retry_waits_what_its_retry_after_said(variant: str, waits: list[float]) -> None:
    api = FakeApi([busy(429, "7"), busy(503, "2.5"), httpx.Response(200, json={"id": "b"})])

    assert await call(variant, api, "batch", "b") == {"id": "b"}
    assert waits == [7.0, 2.5]


async def test_a_long_retry_after_is_cut_to_max_wait(variant: str, waits: list[float]) -> None:
    api = FakeApi([busy(503, "3600"), httpx.Response(200, json={"id": "b"})])

    await call(variant, api, "batch", "b", max_wait=10)

    assert waits == [10.0]


@pytest.mark.parametrize(
    "header", [None, "soon", "Wed, 21 Oct 2015 07:28:00 GMT", "-5", "nan", "inf", ""]
)
async def test_without_a_usable_retry_after_the_wait_doubles(
    variant: str, waits: list[float], header: str | None
) -> None:
    api = FakeApi([busy(503, header)] * 3 + [httpx.Response(200, json={"id": "b"})])

    await call(variant, api, "batch", "b")

    assert waits == [0.5, 1.0, 2.0]


async def test_the_doubling_wait_stops_growing_at_max_wait(
    variant: str, waits: list[float]
) -> None:
    api = FakeApi([busy(503, None)] * 4 + [httpx.Response(200, json={"id": "b"})])

    await call(variant, api, "batch", "b", max_retries=4, max_wait=1.5)

    assert waits == [0.5, 1.0, 1.5, 1.5]


async def test_retries_are_bounded_and_the_last_answer_is_raised(
    variant: str, waits: list[float]
) -> None:
    api = FakeApi(rest=busy(503, "5"))

    with pytest.raises(ApiError) as caught:
        await call(variant, api, "batches", max_retries=2)

    assert len(api.seen) == 3 and waits == [5.0, 5.0]
    error = caught.value
    assert (error.status, error.code, error.retry_after) == (503, "unavailable", 5.0)


async def test_with_no_retries_allowed_a_503_is_raised_at_once(
    variant: str, waits: list[float]
) -> None:
    api = FakeApi([busy(503)])

    with pytest.raises(ApiError):
        await call(variant, api, "keys", max_retries=0)

    assert (len(api.seen), waits) == (1, [])


@settings(max_examples=200)
@given(
    header=st.one_of(
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
        st.floats(allow_nan=True, allow_infinity=True).map(str),
    ),
    status=st.sampled_from([429, 503]),
    attempt=st.integers(1, 3),
    max_wait=st.floats(0, 120),
)
def test_a_wait_is_never_negative_nor_longer_than_max_wait(
    header: str, status: int, attempt: int, max_wait: float
) -> None:
    """Whatever a Retry-After says, the wait stays within [0, max_wait]."""
    response = httpx.Response(status, headers={"Retry-After": header})
    wait = wait_before_retry(
        Request("GET", "/"), attempt, response, max_retries=3, max_wait=max_wait
    )

    assert wait is not None and 0 <= wait <= max_wait
    told = retry_after(response)
    assert told is None or told >= 0


# -- errors raised at once -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "malformed_json"),
        (401, "unauthorized"),
        (404, "not_found"),
        (409, "idempotency_conflict"),
        (413, "body_too_large"),
        (415, "unsupported_media_type"),
        (422, "invalid_fields"),
        (500, "internal_error"),
    ],
)
async def test_an_error_the_api_does_not_ask_to_retry_is_raised_at_once(
    variant: str, waits: list[float], status: int, code: str
) -> None:
    api = FakeApi([envelope(status, code, "what went wrong")])

    with pytest.raises(ApiError) as caught:
        await _send(variant, api)

    assert (len(api.seen), waits) == (1, [])
    error = caught.value
    assert (error.status, error.code, error.message, error.fields) == (
        status,
        code,
        "what went wrong",
        {},
    )
    assert str(error) == f"{status} {code}: what went wrong"


async def test_a_key_still_in_progress_is_raised_with_its_retry_after(variant: str) -> None:
    """409 ``idempotency_in_progress`` is left to the caller, with the API's wait on it."""
    api = FakeApi([envelope(409, "idempotency_in_progress", "retry", headers={"Retry-After": "3"})])

    with pytest.raises(ApiError) as caught:
        await _send(variant, api, idempotency_key="k")

    assert (caught.value.code, caught.value.retry_after, len(api.seen)) == (
        "idempotency_in_progress",
        3.0,
        1,
    )


async def test_field_errors_are_kept_by_field(variant: str) -> None:
    fields = {"to[1]": "not an email address", "subject": "required"}
    api = FakeApi(
        [envelope(422, "invalid_fields", "the request has invalid fields", fields=fields)]
    )

    with pytest.raises(ApiError) as caught:
        await _send(variant, api)

    assert caught.value.fields == fields


@pytest.mark.parametrize(
    ("status", "answer", "message"),
    [
        (502, {"text": "<html>Bad gateway</html>"}, "<html>Bad gateway</html>"),
        (404, {"json": {"detail": "Not Found"}}, '{"detail":"Not Found"}'),
        (400, {"json": {"error": "boom"}}, '{"error":"boom"}'),
        (400, {"json": {"error": {"code": "x"}}}, '{"error":{"code":"x"}}'),
        (500, {"text": "x" * 1000}, "x" * 200),
    ],
    ids=["html", "no-envelope", "error-not-object", "no-message", "long-body"],
)
async def test_an_answer_without_the_envelope_is_still_an_api_error(
    variant: str, status: int, answer: dict[str, Any], message: str
) -> None:
    """A proxy's page or a foreign body keeps its status; its text, cut short, is the message."""
    api = FakeApi([httpx.Response(status, **answer)])

    with pytest.raises(ApiError) as caught:
        await call(variant, api, "batch", "b")

    assert (caught.value.status, caught.value.code) == (status, "http_error")
    assert caught.value.message == message
    assert len(api.seen) == 1


# -- connection failures and timeouts ------------------------------------------------------


async def test_a_read_is_retried_through_connection_failures_and_timeouts(
    variant: str, waits: list[float]
) -> None:
    api = FakeApi(
        [
            httpx.ConnectError("refused"),
            httpx.ReadTimeout("slow"),
            httpx.PoolTimeout("pool"),
            httpx.Response(200, json={"data": [], "next_cursor": None}),
        ]
    )

    assert await call(variant, api, "batches") == {"data": [], "next_cursor": None}
    assert waits == [0.5, 1.0, 2.0]


async def test_a_timeout_that_persists_is_raised_after_the_last_retry(variant: str) -> None:
    api = FakeApi(rest=httpx.ReadTimeout("slow"))

    with pytest.raises(httpx.TimeoutException):
        await call(variant, api, "keys", max_retries=2)

    assert len(api.seen) == 3


async def test_the_configured_timeout_bounds_every_request(variant: str) -> None:
    api = FakeApi([busy(503), httpx.Response(200, json={"data": []})])

    await call(variant, api, "keys", timeout=2.5)

    expected = {"connect": 2.5, "read": 2.5, "write": 2.5, "pool": 2.5}
    assert [r.extensions["timeout"] for r in api.seen] == [expected, expected]


# -- pagination --------------------------------------------------------------------------------


def _pages(*pages: list[Any]) -> Iterator[httpx.Response]:
    for n, data in enumerate(pages):
        last = n == len(pages) - 1
        yield httpx.Response(200, json={"data": data, "next_cursor": None if last else f"c{n}"})


async def test_iterating_batches_follows_every_cursor_once(variant: str) -> None:
    api = FakeApi(list(_pages([{"batch_id": "1"}, {"batch_id": "2"}], [{"batch_id": "3"}], [])))

    items = await collect(variant, api, "iter_batches")

    assert [i["batch_id"] for i in items] == ["1", "2", "3"]
    assert [r.url.params.get("cursor") for r in api.seen] == [None, "c0", "c1"]
    assert {r.url.path for r in api.seen} == {"/v1/batches"}


async def test_a_page_retried_midway_yields_nothing_twice(variant: str) -> None:
    first, second = _pages([{"email": "a@example.com"}], [{"email": "b@example.com"}])
    api = FakeApi([first, busy(503), second])

    entries = await collect(variant, api, "iter_logs", "b 1", state="failed")

    assert [e["email"] for e in entries] == ["a@example.com", "b@example.com"]
    assert [r.url.params.get("cursor") for r in api.seen] == [None, "c0", "c0"]
    assert {r.url.params["state"] for r in api.seen} == {"failed"}
    assert {r.url.raw_path.split(b"?")[0] for r in api.seen} == {b"/v1/batches/b%201/logs"}


def test_an_error_on_a_later_page_comes_after_the_earlier_items() -> None:
    first, _ = _pages([{"batch_id": "1"}], [])
    api = FakeApi([first, envelope(400, "bad_cursor", "the cursor is not valid")])
    yielded: list[str] = []

    sd = Client(BASE, KEY, transport=httpx.MockTransport(api))
    with sd, pytest.raises(ApiError) as caught:
        for item in sd.iter_batches():
            yielded.append(item["batch_id"])

    assert yielded == ["1"]
    assert caught.value.code == "bad_cursor"


# -- the requests themselves ---------------------------------------------------------------

#: One call of every operation, the request the API expects for it, and the API's answer.
CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], str, bytes, Any, httpx.Response]] = [
    (
        "send",
        ("Shop <shop@example.com>", ({"email": "a@example.com", "name": "A"},), "Hi"),
        {"html": "<p>x</p>", "text": "x", "idempotency_key": "k1", "cc": ["c@example.com"]},
        "POST",
        b"/v1/batches",
        {
            "from": "Shop <shop@example.com>",
            "to": [{"email": "a@example.com", "name": "A"}],
            "subject": "Hi",
            "html": "<p>x</p>",
            "text": "x",
            "cc": ["c@example.com"],
        },
        httpx.Response(202, json=ACCEPTED),
    ),
    (
        "batches",
        (),
        {"limit": 5, "cursor": "abc"},
        "GET",
        b"/v1/batches?limit=5&cursor=abc",
        None,
        httpx.Response(200, json={"data": [], "next_cursor": None}),
    ),
    ("batch", ("b-1",), {}, "GET", b"/v1/batches/b-1", None, httpx.Response(200, json={"x": 1})),
    (
        "logs",
        ("b-1",),
        {"state": "failed", "limit": 10},
        "GET",
        b"/v1/batches/b-1/logs?state=failed&limit=10",
        None,
        httpx.Response(200, json={"data": [{"email": "a@example.com"}], "next_cursor": None}),
    ),
    (
        "suppressions",
        (),
        {"limit": 2},
        "GET",
        b"/v1/suppressions?limit=2",
        None,
        httpx.Response(200, json={"data": [], "next_cursor": None}),
    ),
    (
        "suppress",
        ("a@example.com", "bounce"),
        {},
        "POST",
        b"/v1/suppressions",
        {"email": "a@example.com", "reason": "bounce"},
        httpx.Response(201, json={"email": "a@example.com", "reason": "bounce"}),
    ),
    (
        "unsuppress",
        ("a@example.com",),
        {},
        "DELETE",
        b"/v1/suppressions/a@example.com",
        None,
        httpx.Response(204),
    ),
    (
        "stats",
        (),
        {"start": "2026-01-01", "end": "2026-01-31"},
        "GET",
        b"/v1/stats?from=2026-01-01&to=2026-01-31",
        None,
        httpx.Response(200, json={"data": [{"date": "2026-01-01", "queued": 1}]}),
    ),
    ("keys", (), {}, "GET", b"/v1/keys", None, httpx.Response(200, json={"data": [{"id": "k"}]})),
    (
        "create_key",
        ("ci",),
        {},
        "POST",
        b"/v1/keys",
        {"name": "ci"},
        httpx.Response(201, json={"key": "sd_live_x", "name": "ci", "note": "n"}),
    ),
    ("revoke_key", ("k/1",), {}, "DELETE", b"/v1/keys/k%2F1", None, httpx.Response(204)),
]

#: What each method returns of its answer: the whole body, its ``data``, or nothing.
_UNWRAPPED = {"stats", "keys"}
_NOTHING = {"unsuppress", "revoke_key"}


@pytest.mark.parametrize(
    ("method", "args", "kw", "verb", "target", "body", "answer"),
    CALLS,
    ids=[c[0] for c in CALLS],
)
async def test_both_clients_make_the_documented_request_and_return_the_same(
    method: str,
    args: tuple[Any, ...],
    kw: dict[str, Any],
    verb: str,
    target: bytes,
    body: Any,
    answer: httpx.Response,
) -> None:
    results, requests = [], []
    for variant in ("sync", "async"):
        api = FakeApi([httpx.Response(answer.status_code, content=answer.content)])
        results.append(await call(variant, api, method, *args, **kw))
        requests += api.seen

    for request in requests:
        assert (request.method, request.url.raw_path) == (verb, target)
        assert (json.loads(request.content) if request.content else None) == body
        assert request.headers["authorization"] == f"Bearer {KEY}"
        assert request.headers["user-agent"].startswith("safedelivr-client/")
    assert requests[0].headers.get("idempotency-key") == requests[1].headers.get("idempotency-key")
    expected: Any = None if method in _NOTHING else answer.json()
    if method in _UNWRAPPED:
        expected = expected["data"]
    assert results == [expected, expected]


async def test_a_plain_address_is_sent_as_one_string(variant: str) -> None:
    api = FakeApi([httpx.Response(202, json=ACCEPTED)])

    await call(variant, api, "send", "s@example.com", "a@example.com", "Hi", text="t")

    body = json.loads(api.seen[0].content)
    assert body["to"] == "a@example.com"
    assert "html" not in body


@pytest.mark.parametrize(("method", "segment"), [("batch", "."), ("logs", ".."), ("batch", "..")])
async def test_a_dot_segment_id_cannot_reach_another_endpoint(
    variant: str, method: str, segment: str
) -> None:
    """An id taken from untrusted input names a batch, or is refused; never another path."""
    api = FakeApi(rest=httpx.Response(200, json={"data": [], "next_cursor": None}))

    try:
        await call(variant, api, method, segment)
    except ValueError:
        assert api.seen == []
        return
    path = api.seen[0].url.raw_path
    assert path.startswith(b"/v1/batches/") and path != b"/v1/batches/"
