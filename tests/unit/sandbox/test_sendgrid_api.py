"""The SendGrid stand-in over HTTP: answers, and the signed Event Webhook posts that follow."""

from __future__ import annotations

import re

import orjson
from sendgrid.helpers.eventwebhook import EventWebhook

from tests.unit.sandbox.conftest import (
    SENDGRID_AUTH,
    Harness,
    running,
    sandbox_settings,
    sendgrid_mail,
)

SEND = "/sendgrid/v3/mail/send"


async def test_accepted_mail_gets_202_and_message_id(sandbox: Harness) -> None:
    """A valid request is answered 202 with an empty body and a 22-character X-Message-Id."""
    response = await sandbox.client.post(SEND, json=sendgrid_mail("a@x.com"), headers=SENDGRID_AUTH)

    assert response.status_code == 202
    assert response.content == b""
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", response.headers["X-Message-Id"])


async def test_missing_authorization_is_401(sandbox: Harness) -> None:
    """Without a bearer key SendGrid answers 401 authorization required."""
    response = await sandbox.client.post(SEND, json=sendgrid_mail("a@x.com"))

    assert response.status_code == 401
    assert response.json()["errors"][0]["message"] == "authorization required"


async def test_invalid_key_is_401(sandbox: Harness) -> None:
    """The key ``invalid`` is refused with SendGrid's revoked-grant message."""
    response = await sandbox.client.post(
        SEND, json=sendgrid_mail("a@x.com"), headers={"Authorization": "Bearer invalid"}
    )

    assert response.status_code == 401
    assert response.json() == {
        "errors": [
            {
                "message": "The provided authorization grant is invalid, expired, or revoked",
                "field": None,
                "help": None,
            }
        ]
    }


async def test_invalid_body_lists_errors_with_fields(sandbox: Harness) -> None:
    """A body breaking rules is answered 400 with each error's field."""
    body = sendgrid_mail("not-an-address", categories=["c"] * 11)

    response = await sandbox.client.post(SEND, json=body, headers=SENDGRID_AUTH)

    assert response.status_code == 400
    fields = {e["field"] for e in response.json()["errors"]}
    assert fields == {"personalizations.0.to.0.email", "categories"}
    assert sandbox.state.ledger.snapshot()["sendgrid"]["requests"] == 0


async def test_malformed_json_is_400(sandbox: Harness) -> None:
    """A body that is not JSON is a 400 with SendGrid's error document."""
    response = await sandbox.client.post(SEND, content=b"{nope", headers=SENDGRID_AUTH)

    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] is None


async def test_body_over_30_mb_is_413(sandbox: Harness) -> None:
    """A body larger than 30 MB is refused with 413 content too large."""
    response = await sandbox.client.post(
        SEND, content=b" " * (30 * 1024 * 1024 + 1), headers=SENDGRID_AUTH
    )

    assert response.status_code == 413
    assert response.json()["errors"][0]["message"] == "content too large"


async def test_events_arrive_signed_with_correlation_fields(sandbox: Harness) -> None:
    """processed and delivered arrive signed, carrying the message id, category and args."""
    body = sendgrid_mail(
        "a@x.com",
        categories=["news"],
        custom_args={"batch_id": "b-1", "scope": "top"},
    )
    body["personalizations"][0]["custom_args"] = {"scope": "mine", "log_id": "l-1", "email": "x"}

    response = await sandbox.client.post(SEND, json=body, headers=SENDGRID_AUTH)
    await sandbox.settle()

    message_id = response.headers["X-Message-Id"]
    events = sandbox.receiver.sendgrid
    assert [e["event"] for e in events] == ["processed", "delivered"]
    for event in events:
        assert event["email"] == "a@x.com"
        assert event["sg_message_id"].startswith(message_id + ".filter")
        assert event["smtp-id"].startswith(f"<{message_id}@")
        assert event["category"] == "news"
        assert (event["batch_id"], event["log_id"], event["scope"]) == ("b-1", "l-1", "mine")
        assert isinstance(event["timestamp"], int)
    assert len({e["sg_event_id"] for e in events}) == 2
    assert sandbox.receiver.bad_signatures == 0


async def test_signature_verifies_with_official_helper(sandbox: Harness) -> None:
    """The official sendgrid EventWebhook helper accepts the signature and published key."""
    await sandbox.client.post(SEND, json=sendgrid_mail("a@x.com"), headers=SENDGRID_AUTH)
    await sandbox.settle()

    key = (await sandbox.client.get("/_control/sendgrid/public-key")).json()["public_key"]
    headers, body = sandbox.receiver.raw_sendgrid[0]
    verifier = EventWebhook(key)
    assert verifier.verify_signature(
        body.decode(),
        headers["x-twilio-email-event-webhook-signature"],
        headers["x-twilio-email-event-webhook-timestamp"],
    )
    assert not verifier.verify_signature(
        body.decode() + " ",
        headers["x-twilio-email-event-webhook-signature"],
        headers["x-twilio-email-event-webhook-timestamp"],
    )


async def test_outcomes_follow_the_local_part(sandbox: Harness) -> None:
    """bounce, defer, complaint, drop, unsub and open addresses get their event sequences."""
    to = ["bounce@x.com", "defer1@x.com", "complaint@x.com", "drop@x.com", "unsub@x.com"]
    body = sendgrid_mail(*to, "open@x.com", "ok@x.com")

    await sandbox.client.post(SEND, json=body, headers=SENDGRID_AUTH)
    await sandbox.settle()

    got = sandbox.receiver.events_for
    assert got("bounce@x.com") == ["processed", "bounce"]
    assert got("defer1@x.com") == ["processed", "deferred"]
    assert got("complaint@x.com") == ["processed", "delivered", "spamreport"]
    assert got("drop@x.com") == ["processed", "dropped"]
    assert got("unsub@x.com") == ["processed", "delivered", "unsubscribe"]
    assert got("open@x.com") == ["processed", "delivered", "open"]
    assert got("ok@x.com") == ["processed", "delivered"]
    by_event = {(e["email"], e["event"]): e for e in sandbox.receiver.sendgrid}
    bounce = by_event["bounce@x.com", "bounce"]
    assert (bounce["type"], bounce["status"]) == ("bounce", "5.1.1")
    assert bounce["reason"].startswith("550")
    deferred = by_event["defer1@x.com", "deferred"]
    assert deferred["response"].startswith("451") and deferred["attempt"] == "1"
    assert by_event["drop@x.com", "dropped"]["reason"] == "Bounced Address"


async def test_cc_and_bcc_recipients_get_events(sandbox: Harness) -> None:
    """Every recipient of a personalization, cc and bcc included, gets its events."""
    body = sendgrid_mail("a@x.com")
    body["personalizations"][0]["cc"] = [{"email": "c@x.com"}]
    body["personalizations"][0]["bcc"] = [{"email": "b@x.com"}]

    await sandbox.client.post(SEND, json=body, headers=SENDGRID_AUTH)
    await sandbox.settle()

    assert {e["email"] for e in sandbox.receiver.sendgrid} == {"a@x.com", "c@x.com", "b@x.com"}


async def test_events_are_posted_in_bounded_batches(sandbox: Harness) -> None:
    """1,000 recipients' 2,000 events arrive in POSTs of at most 500 events."""
    body = sendgrid_mail(personalizations=[{"to": [{"email": f"r{i}@x.com"} for i in range(1000)]}])

    response = await sandbox.client.post(SEND, json=body, headers=SENDGRID_AUTH)
    await sandbox.settle()

    assert response.status_code == 202
    sizes = [len(orjson.loads(raw)) for _, raw in sandbox.receiver.raw_sendgrid]
    assert sum(sizes) == 2000
    assert max(sizes) <= 500
    assert sandbox.state.dispatcher.counters["sendgrid"].events == 2000


async def test_events_wait_for_the_webhook_delay() -> None:
    """The answer does not wait for the events; they follow after ``webhook_delay``."""
    async with running(sandbox_settings(webhook_delay=0.3)) as sandbox:
        await sandbox.client.post(SEND, json=sendgrid_mail("a@x.com"), headers=SENDGRID_AUTH)

        assert sandbox.receiver.sendgrid == []
        await sandbox.settle()
        assert len(sandbox.receiver.sendgrid) == 2


async def test_accepted_recipients_are_counted(sandbox: Harness) -> None:
    """The control API counts how often each address was accepted."""
    for _ in range(2):
        await sandbox.client.post(SEND, json=sendgrid_mail("A@x.com"), headers=SENDGRID_AUTH)
    await sandbox.client.post(SEND, json=sendgrid_mail("b@x.com"), headers=SENDGRID_AUTH)

    sends = (await sandbox.client.get("/_control/sends")).json()["sendgrid"]

    assert sends["requests"] == 3
    assert sends["by_recipient"] == {"a@x.com": 2, "b@x.com": 1}
    assert sends["recent"][-1]["request"]["personalizations"][0]["to"] == [{"email": "b@x.com"}]


async def test_signed_webhook_settings_show_the_public_key(sandbox: Harness) -> None:
    """SendGrid's signed-webhook settings API returns the verification key."""
    response = await sandbox.client.get(
        "/sendgrid/v3/user/webhooks/event/settings/signed", headers=SENDGRID_AUTH
    )

    assert response.json()["public_key"] == sandbox.state.sendgrid_public_key
