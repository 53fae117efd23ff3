"""Fault injection through ``/_control/faults``."""

from __future__ import annotations

import time

import pytest

from sandbox.faults import Fault, FaultBook, parse_fault
from tests.unit.sandbox.conftest import (
    FORM,
    MAILGUN_AUTH,
    SENDGRID_AUTH,
    Harness,
    encoded,
    mailgun_form,
    sendgrid_mail,
)

SENDGRID = "/sendgrid/v3/mail/send"
MAILGUN = "/mailgun/v3/mg.example.com/messages"


async def _sendgrid(sandbox: Harness) -> int:
    response = await sandbox.client.post(
        SENDGRID, json=sendgrid_mail("a@x.com"), headers=SENDGRID_AUTH
    )
    return response.status_code


async def test_fault_applies_to_n_calls_then_mail_flows(sandbox: Harness) -> None:
    """A fault with count 2 answers two calls with its status; the third is accepted."""
    fault = {"provider": "sendgrid", "status": 503, "count": 2}
    assert (await sandbox.client.post("/_control/faults", json=fault)).status_code == 201

    statuses = [await _sendgrid(sandbox) for _ in range(3)]

    assert statuses == [503, 503, 202]
    assert sandbox.state.ledger.accepted("sendgrid", "a@x.com") == 1


async def test_faulted_calls_accept_no_mail(sandbox: Harness) -> None:
    """A faulted call records nothing and posts no events."""
    await sandbox.client.post("/_control/faults", json={"provider": "sendgrid", "status": 500})

    await _sendgrid(sandbox)
    await sandbox.settle()

    assert sandbox.state.ledger.snapshot()["sendgrid"]["requests"] == 0
    assert sandbox.receiver.sendgrid == []


async def test_sendgrid_429_has_rate_limit_headers(sandbox: Harness) -> None:
    """A SendGrid 429 carries X-RateLimit-* headers and SendGrid's error body."""
    await sandbox.client.post(
        "/_control/faults", json={"provider": "sendgrid", "status": 429, "retry_after": 7}
    )

    response = await sandbox.client.post(
        SENDGRID, json=sendgrid_mail("a@x.com"), headers=SENDGRID_AUTH
    )

    assert response.status_code == 429
    assert response.headers["X-RateLimit-Remaining"] == "0"
    assert int(response.headers["X-RateLimit-Reset"]) >= int(time.time()) + 6
    assert response.json()["errors"][0]["message"] == "too many requests"


async def test_mailgun_429_has_retry_after(sandbox: Harness) -> None:
    """A Mailgun 429 carries Retry-After and a ``{"message"}`` body."""
    await sandbox.client.post("/_control/faults", json={"provider": "mailgun", "status": 429})

    response = await sandbox.client.post(
        MAILGUN, content=encoded(mailgun_form("a@x.com")), headers={**FORM, **MAILGUN_AUTH}
    )

    assert response.status_code == 429
    assert response.headers["Retry-After"] == "1"
    assert "message" in response.json()


async def test_fault_for_one_provider_spares_the_other(sandbox: Harness) -> None:
    """A Mailgun fault leaves SendGrid calls alone."""
    await sandbox.client.post("/_control/faults", json={"provider": "mailgun", "status": 500})

    assert await _sendgrid(sandbox) == 202


async def test_latency_only_fault_delays_then_accepts(sandbox: Harness) -> None:
    """A fault without status delays the call, which is then accepted."""
    await sandbox.client.post(
        "/_control/faults", json={"provider": "sendgrid", "status": None, "latency_ms": 150}
    )

    started = time.monotonic()
    status = await _sendgrid(sandbox)

    assert status == 202
    assert time.monotonic() - started >= 0.15


async def test_custom_body_is_returned(sandbox: Harness) -> None:
    """A fault's body replaces the default answer."""
    await sandbox.client.post(
        "/_control/faults", json={"provider": "sendgrid", "status": 502, "body": "upstream gone"}
    )

    response = await sandbox.client.post(
        SENDGRID, json=sendgrid_mail("a@x.com"), headers=SENDGRID_AUTH
    )

    assert (response.status_code, response.text) == (502, "upstream gone")


async def test_fault_without_count_lasts_until_cleared(sandbox: Harness) -> None:
    """A fault with count null persists until ``DELETE /_control/faults``."""
    await sandbox.client.post(
        "/_control/faults", json={"provider": "sendgrid", "status": 500, "count": None}
    )
    before = [await _sendgrid(sandbox) for _ in range(3)]

    cleared = await sandbox.client.delete("/_control/faults")

    assert before == [500, 500, 500]
    assert cleared.json() == {"cleared": 1}
    assert await _sendgrid(sandbox) == 202


async def test_active_faults_are_listed(sandbox: Harness) -> None:
    """``GET /_control/faults`` shows what remains of each fault."""
    await sandbox.client.post(
        "/_control/faults", json={"provider": "sendgrid", "status": 500, "count": 3}
    )
    await _sendgrid(sandbox)

    listed = (await sandbox.client.get("/_control/faults")).json()

    assert [(f["provider"], f["status"], f["count"]) for f in listed] == [("sendgrid", 500, 2)]


@pytest.mark.parametrize(
    "spec",
    [
        {"provider": "postmark", "status": 500},
        {"provider": "sendgrid", "status": 700},
        {"provider": "sendgrid", "status": 500, "count": 0},
        {"provider": "sendgrid", "status": 500, "latency_ms": -1},
        {"provider": "sendgrid", "status": None},
        [],
    ],
)
async def test_invalid_fault_specs_are_400(sandbox: Harness, spec: object) -> None:
    """A fault that names no known provider or has impossible values is refused."""
    response = await sandbox.client.post("/_control/faults", json=spec)

    assert response.status_code == 400
    assert response.json()["error"]


def test_fault_book_counts_down_and_forgets() -> None:
    """FaultBook.take counts calls against a fault and drops it when spent."""
    book = FaultBook()
    book.set(Fault("mailgun", 500, count=1))

    assert book.take("mailgun") is not None
    assert book.take("mailgun") is None
    assert book.active() == []


def test_parse_fault_defaults() -> None:
    """An omitted count means until cleared, and latency defaults to zero."""
    fault = parse_fault({"provider": "mailgun", "status": 503})

    assert fault == Fault("mailgun", 503, latency_ms=0, count=None)


def test_a_fault_with_a_share_applies_to_that_fraction_of_calls_evenly() -> None:
    """``share: 0.3`` fails 3 calls in every 10, spread out (a provider failing 30 %)."""
    book = FaultBook()
    fault = parse_fault({"provider": "sendgrid", "status": 500, "share": 0.3})
    assert isinstance(fault, Fault)
    book.set(fault)

    applied = [book.take("sendgrid") is not None for _ in range(100)]

    assert sum(applied) == 30
    assert all(sum(applied[i : i + 10]) == 3 for i in range(0, 100, 10))


@pytest.mark.parametrize("share", [0, -0.5, 1.5, "half", True])
def test_a_share_outside_0_to_1_is_refused(share: object) -> None:
    assert parse_fault({"provider": "sendgrid", "status": 500, "share": share}) == (
        "share must be a number above 0 and at most 1"
    )
