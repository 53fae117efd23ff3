"""The sandbox's ``/_control`` endpoints (sandbox/control.py) given bad or edge
parameters: non-JSON fault bodies, unknown providers, and malformed ``recent`` and ``wait``."""

from __future__ import annotations

import uuid

import pytest

from tests.unit.sandbox.conftest import SENDGRID_AUTH, Harness, sendgrid_mail


async def _send(sandbox: Harness, count: int) -> list[str]:
    """``count`` accepted SendGrid requests, one fresh recipient each, oldest first."""
    addresses = [f"r-{uuid.uuid4().hex[:8]}@x.com" for _ in range(count)]
    for address in addresses:
        response = await sandbox.client.post(
            "/sendgrid/v3/mail/send", json=sendgrid_mail(address), headers=SENDGRID_AUTH
        )
        assert response.status_code == 202
    return addresses


async def _recent(sandbox: Harness, recent: str) -> list[str]:
    response = await sandbox.client.get("/_control/sends", params={"recent": recent})
    assert response.status_code == 200, response.text
    return [
        r["request"]["personalizations"][0]["to"][0]["email"]
        for r in response.json()["sendgrid"]["recent"]
    ]


async def test_a_fault_body_that_is_not_json_is_400(sandbox: Harness) -> None:
    """Nothing is installed from a body that does not parse."""
    response = await sandbox.client.post("/_control/faults", content=b"{provider: sendgrid")

    assert (response.status_code, response.json()) == (400, {"error": "the body must be JSON"})
    assert (await sandbox.client.get("/_control/faults")).json() == []


async def test_clearing_an_unknown_provider_is_400_and_clears_nothing(sandbox: Harness) -> None:
    """A typo in ``?provider=`` does not fall back to clearing every fault."""
    await sandbox.client.post("/_control/faults", json={"provider": "sendgrid", "status": 500})

    response = await sandbox.client.delete("/_control/faults", params={"provider": "sendgird"})

    assert response.status_code == 400
    assert "provider must be one of" in response.json()["error"]
    assert len((await sandbox.client.get("/_control/faults")).json()) == 1


async def test_clearing_one_provider_keeps_the_others_fault(sandbox: Harness) -> None:
    """``DELETE ?provider=mailgun`` reports one cleared; SendGrid's fault stays active."""
    for provider in ("sendgrid", "mailgun"):
        await sandbox.client.post("/_control/faults", json={"provider": provider, "status": 500})

    cleared = await sandbox.client.delete("/_control/faults", params={"provider": "mailgun"})
    again = await sandbox.client.delete("/_control/faults", params={"provider": "mailgun"})

    assert (cleared.json(), again.json()) == ({"cleared": 1}, {"cleared": 0})
    active = (await sandbox.client.get("/_control/faults")).json()
    assert [f["provider"] for f in active] == ["sendgrid"]


@pytest.mark.parametrize("recent", ["-1", "abc", "1.5", ""])
async def test_recent_must_be_a_non_negative_integer(sandbox: Harness, recent: str) -> None:
    """Anything else is 400 rather than a guess."""
    response = await sandbox.client.get("/_control/sends", params={"recent": recent})

    assert (response.status_code, response.json()) == (
        400,
        {"error": "recent must be a non-negative integer"},
    )


async def test_recent_keeps_the_newest_requests(sandbox: Harness) -> None:
    """``recent=N`` shows the last N requests, oldest first; ``recent=0`` none."""
    addresses = await _send(sandbox, 3)

    assert await _recent(sandbox, "2") == addresses[1:]
    assert await _recent(sandbox, "3") == addresses
    assert await _recent(sandbox, "0") == []


async def test_asking_for_more_recent_requests_than_exist_shows_them_all(
    sandbox: Harness,
) -> None:
    """``recent=4`` with three requests kept shows all three."""
    addresses = await _send(sandbox, 3)

    assert await _recent(sandbox, "4") == addresses


async def test_recent_of_unicode_digits_is_400(sandbox: Harness) -> None:
    """A superscript digit is not a count."""
    response = await sandbox.client.get("/_control/sends", params={"recent": "²"})

    assert response.status_code == 400


@pytest.mark.parametrize("wait", ["soon", "nan", "inf", "-inf", ""])
async def test_wait_must_be_a_finite_number_of_seconds(sandbox: Harness, wait: str) -> None:
    """``?wait=`` that is not a finite number is refused, never waited on."""
    response = await sandbox.client.get("/_control/webhooks", params={"wait": wait})

    assert (response.status_code, response.json()) == (
        400,
        {"error": "wait must be a number of seconds"},
    )


async def test_a_negative_wait_answers_at_once(sandbox: Harness) -> None:
    """A negative wait is no wait: the counters come straight back (waiting an hour would
    fail by the per-test timeout)."""
    response = await sandbox.client.get("/_control/webhooks", params={"wait": "-3600"})

    assert response.status_code == 200
    assert set(response.json()) >= {"sendgrid", "mailgun"}
