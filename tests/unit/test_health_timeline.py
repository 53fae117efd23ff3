"""Readiness checks and the health endpoints (``shared.infra.health``), and what the provider-event
timeline keeps of an event (``shared.ingest.timeline``'s pure parts): no services involved."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request

from shared.core.errors import DependencyUnavailable
from shared.core.webhook_events import ProviderEvent
from shared.infra import health
from shared.infra.health import Check, health_routes, run_checks
from shared.ingest.timeline import MAX_DETAIL, detail_of, orphan_body

TOKEN = SecretStr("metrics-token")


async def _ok() -> None:
    return None


async def _down() -> None:
    raise DependencyUnavailable("cassandra", "NoHostAvailable")


async def _hang() -> None:
    await asyncio.Event().wait()


# -- run_checks -------------------------------------------------------------------------------


async def test_each_check_is_reported_ok_or_with_the_reason_it_failed() -> None:
    results = await run_checks({"cassandra": _down, "rabbitmq": _ok})
    assert results == {
        "cassandra": "DependencyUnavailable: cassandra unavailable: NoHostAvailable",
        "rabbitmq": "ok",
    }


async def test_a_check_that_hangs_is_reported_as_timed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dependency that accepts the connection but never answers makes the check fail
    after the timeout, rather than hanging the probe."""
    monkeypatch.setattr(health, "CHECK_TIMEOUT", 0.05)

    results = await run_checks({"rabbitmq": _hang, "cassandra": _ok})

    assert results == {"rabbitmq": "TimeoutError: ", "cassandra": "ok"}


async def test_checks_run_concurrently() -> None:
    """Three checks run at once: each waits for the other two, which only checks started
    together can do (run one after the other, each would time out)."""
    together = asyncio.Barrier(3)

    async def meet() -> None:
        await together.wait()

    results = await run_checks({"a": meet, "b": meet, "c": meet})

    assert results == {"a": "ok", "b": "ok", "c": "ok"}


async def test_a_long_failure_reason_is_cut_to_300_characters() -> None:
    async def verbose() -> None:
        raise RuntimeError("x" * 5000)

    (reason,) = (await run_checks({"db": verbose})).values()
    assert len(reason) == 300
    assert reason.startswith("RuntimeError: xxx")


async def test_any_exception_of_a_check_means_not_ready() -> None:
    """Not only our own errors: a library error that slipped through still reads as a failed
    check, never as an error of the probe itself."""

    async def buggy() -> None:
        raise KeyError("release_version")

    assert await run_checks({"db": buggy}) == {"db": "KeyError: 'release_version'"}


# -- the endpoints ----------------------------------------------------------------------------


class _Deps:
    """Checks a test can switch between answering and failing, per request."""

    def __init__(self) -> None:
        self.checks: dict[str, Check] = {"cassandra": _ok, "rabbitmq": _ok}
        self.seen: list[str] = []

    def __call__(self, request: Request) -> Mapping[str, Check]:
        self.seen.append(request.url.path)
        return self.checks


@pytest.fixture
async def endpoints() -> AsyncIterator[tuple[httpx.AsyncClient, _Deps, CollectorRegistry]]:
    deps, registry = _Deps(), CollectorRegistry()
    app = Starlette(routes=health_routes("api", registry, deps))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client, deps, registry


async def test_readyz_is_200_when_every_dependency_answers(
    endpoints: tuple[httpx.AsyncClient, _Deps, CollectorRegistry],
) -> None:
    client, _, _ = endpoints
    resp = await client.get("/readyz")
    assert resp.status_code == 200
    assert resp.json() == {
        "status": "ready",
        "service": "api",
        "checks": {"cassandra": "ok", "rabbitmq": "ok"},
    }


async def test_readyz_is_503_naming_the_dependency_that_is_down_but_not_why(
    endpoints: tuple[httpx.AsyncClient, _Deps, CollectorRegistry],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reason (exception text can name hosts and users) goes to the log, not the page."""
    client, deps, _ = endpoints
    deps.checks["cassandra"] = _down
    resp = await client.get("/readyz")
    assert resp.status_code == 503
    body = resp.json()
    assert body["status"] == "unavailable"
    assert body["checks"] == {"cassandra": "unavailable", "rabbitmq": "ok"}
    assert "NoHostAvailable" not in resp.text
    assert "NoHostAvailable" in caplog.text


async def test_readyz_recovers_as_soon_as_the_dependency_does(
    endpoints: tuple[httpx.AsyncClient, _Deps, CollectorRegistry],
) -> None:
    """Nothing is cached between probes: each request runs the checks again."""
    client, deps, _ = endpoints
    deps.checks["rabbitmq"] = _down
    assert (await client.get("/readyz")).status_code == 503
    deps.checks["rabbitmq"] = _ok
    assert (await client.get("/readyz")).status_code == 200


async def test_healthz_answers_while_every_dependency_hangs(
    endpoints: tuple[httpx.AsyncClient, _Deps, CollectorRegistry],
) -> None:
    """Liveness is the process alone: a dependency outage must not get the process restarted."""
    client, deps, _ = endpoints
    deps.checks = {"cassandra": _hang, "rabbitmq": _hang}
    resp = await asyncio.wait_for(client.get("/healthz"), 1)
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok", "service": "api"}
    assert deps.seen == []


async def test_metrics_expose_the_services_own_registry(
    endpoints: tuple[httpx.AsyncClient, _Deps, CollectorRegistry],
) -> None:
    client, _, registry = endpoints
    Counter("safedelivr_probe_things", "Things.", registry=registry).inc(3)
    resp = await client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    assert "safedelivr_probe_things_total 3.0" in resp.text


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-token", "Basic bWV0cmljcy10b2tlbg==", "Bearer"]
)
async def test_metrics_behind_a_token_refuse_requests_without_it(
    authorization: str | None,
) -> None:
    """With a token configured, /metrics is 401 in the error envelope without that bearer."""
    app = Starlette(routes=health_routes("api", CollectorRegistry(), _Deps(), TOKEN))
    headers = {"Authorization": authorization} if authorization else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        resp = await c.get("/metrics", headers=headers)
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "unauthorized"
    assert resp.headers["www-authenticate"].startswith("Bearer")


async def test_metrics_behind_a_token_answer_the_bearer_while_probes_stay_open() -> None:
    """Prometheus with the token scrapes; load balancers probe /healthz and /readyz without."""
    registry = CollectorRegistry()
    Counter("safedelivr_probe_things", "Things.", registry=registry).inc()
    app = Starlette(routes=health_routes("api", registry, _Deps(), TOKEN))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        scraped = await c.get("/metrics", headers={"Authorization": "bearer metrics-token"})
        probes = [await c.get(path) for path in ("/healthz", "/readyz")]
    assert scraped.status_code == 200
    assert "safedelivr_probe_things_total 1.0" in scraped.text
    assert [p.status_code for p in probes] == [200, 200]


# -- the timeline's view of an event ----------------------------------------------------------


def _event(**fields: object) -> ProviderEvent:
    values: dict[str, object] = {
        "provider": "mg",
        "event_id": uuid.uuid4().hex,
        "kind": "bounced",
        "raw_event": "failed/permanent",
        "email": "ann@example.org",
        "occurred_at": datetime(2026, 3, 1, 12, tzinfo=UTC),
        "batch_id": uuid.uuid1(),
        "chunk": 0,
        "log_id": uuid.uuid1(),
        "attempt": "c.0",
        "message_id": "<20260301.1@mg.example.org>",
        "reason": "550 mailbox unavailable",
        "provider_side": False,
        "suppress": True,
        "url": "https://example.org/x",
    }
    values.update(fields)
    return ProviderEvent(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "550 mailbox unavailable"),
        ({"reason": None}, "https://example.org/x"),
        ({"reason": None, "url": None}, "<20260301.1@mg.example.org>"),
        ({"reason": None, "url": None, "message_id": None}, ""),
        ({"reason": "", "url": ""}, "<20260301.1@mg.example.org>"),
    ],
)
def test_the_detail_is_the_reason_else_the_link_else_the_message_id(
    fields: dict[str, object], expected: str
) -> None:
    assert detail_of(_event(**fields)) == expected


def test_a_detail_longer_than_the_limit_is_cut() -> None:
    detail = detail_of(_event(reason="é" * (MAX_DETAIL + 500)))
    assert detail == "é" * MAX_DETAIL


def test_an_orphan_keeps_the_event_and_the_ids_it_carried() -> None:
    ev = _event()
    body = orphan_body(ev)
    assert body == f"failed/permanent ann@example.org batch={ev.batch_id} log={ev.log_id}"


def test_an_orphan_without_ids_says_so() -> None:
    """An event echoing none of our ids (sent by another system on the same account)."""
    body = orphan_body(_event(batch_id=None, log_id=None))
    assert body == "failed/permanent ann@example.org batch=None log=None"
