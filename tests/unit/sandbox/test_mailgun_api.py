"""The Mailgun stand-in over HTTP: answers, and the signed webhook events that follow."""

from __future__ import annotations

import base64
import re
from typing import Any

import httpx
import orjson
import pytest

from tests.unit.sandbox.conftest import FORM, MAILGUN_AUTH, Harness, encoded, mailgun_form

DOMAIN = "mg.example.com"
SEND = f"/mailgun/v3/{DOMAIN}/messages"


async def _send(
    sandbox: Harness,
    form: list[tuple[str, str]],
    *,
    headers: dict[str, str] = MAILGUN_AUTH,
    url: str = SEND,
) -> httpx.Response:
    return await sandbox.client.post(url, content=encoded(form), headers={**FORM, **headers})


async def test_accepted_message_gets_queued_id(sandbox: Harness) -> None:
    """A valid form is answered 200 with Mailgun's id format and message."""
    response = await _send(sandbox, mailgun_form("a@x.com"))

    assert response.status_code == 200
    document = response.json()
    assert document["message"] == "Queued. Thank you."
    assert re.fullmatch(rf"<\d{{14}}\.\d+\.[0-9A-F]{{16}}@{re.escape(DOMAIN)}>", document["id"])


@pytest.mark.parametrize(
    "authorization",
    [None, "Basic " + base64.b64encode(b"api:invalid").decode(), "Basic bm9wZQ==", "Bearer key"],
    ids=["missing", "invalid key", "no colon", "not basic"],
)
async def test_bad_credentials_are_401_forbidden(
    sandbox: Harness, authorization: str | None
) -> None:
    """Anything but basic auth ``api:<key>`` with a usable key is 401 Forbidden."""
    headers = {"Authorization": authorization} if authorization else {}

    response = await _send(sandbox, mailgun_form("a@x.com"), headers=headers)

    assert (response.status_code, response.text) == (401, "Forbidden")


async def test_unknown_domain_is_404(sandbox: Harness) -> None:
    """Domains named ``unknown.*`` do not exist."""
    response = await _send(
        sandbox, mailgun_form("a@x.com"), url="/mailgun/v3/unknown.example.com/messages"
    )

    assert response.status_code == 404
    assert response.json() == {"message": "Domain not found"}


INVALID = [
    ("no from", [("to", "a@x.com"), ("text", "x")], "'from' parameter is missing"),
    ("no to", [("from", "s@x.com"), ("text", "x")], "'to' parameter is missing"),
    ("bad to", [("from", "s@x.com"), ("to", "nope"), ("text", "x")], "'to' parameter is not"),
    ("no body", [("from", "s@x.com"), ("to", "a@x.com")], "Need at least one of 'text'"),
    (
        "too many",
        [("from", "s@x.com"), ("to", ",".join(f"r{i}@x.com" for i in range(1001))), ("text", "x")],
        "Too many recipients",
    ),
    (
        "variables not JSON",
        [*mailgun_form("a@x.com"), ("recipient-variables", "{nope")],
        "not a valid JSON",
    ),
    (
        "variables not a map",
        [*mailgun_form("a@x.com"), ("recipient-variables", "[1]")],
        "JSON object keyed by recipient",
    ),
    (
        "variables for a stranger",
        [*mailgun_form("a@x.com"), ("recipient-variables", '{"b@x.com": {"id": 1}}')],
        "not a 'to' recipient",
    ),
]


@pytest.mark.parametrize(("case", "form", "message"), INVALID, ids=[c[0] for c in INVALID])
async def test_invalid_forms_are_400_with_message(
    sandbox: Harness, case: str, form: list[tuple[str, str]], message: str
) -> None:
    """Each rule Mailgun enforces gives a 400 ``{"message"}`` naming the parameter."""
    response = await _send(sandbox, form)

    assert response.status_code == 400
    assert message in response.json()["message"]


async def test_repeated_and_comma_separated_to_are_all_recipients(sandbox: Harness) -> None:
    """``to`` may repeat and hold comma-separated, named addresses."""
    form = mailgun_form('"Doe, Jane" <jane@x.com>, b@x.com', "c@x.com")

    response = await _send(sandbox, form)

    assert response.status_code == 200
    counts = sandbox.state.ledger.snapshot()["mailgun"]["by_recipient"]
    assert counts == {"jane@x.com": 1, "b@x.com": 1, "c@x.com": 1}


async def test_multipart_with_attachment_is_accepted(sandbox: Harness) -> None:
    """A multipart form with an attachment is accepted and its file is recorded by size."""
    response = await sandbox.client.post(
        SEND,
        data=dict(mailgun_form("a@x.com")),
        files={"attachment": ("a.txt", b"hello", "text/plain")},
        headers=MAILGUN_AUTH,
    )

    assert response.status_code == 200
    recent = sandbox.state.ledger.snapshot()["mailgun"]["recent"][-1]
    assert recent["request"]["files"] == [
        {"field": "attachment", "filename": "a.txt", "size": 5, "content_type": "text/plain"}
    ]
    assert recent["attachments"] == [
        {
            "filename": "a.txt",
            "content_type": "text/plain",
            "disposition": "attachment",
            "content_id": None,
            "size": 5,
        }
    ]


async def test_events_carry_expanded_user_variables(sandbox: Harness) -> None:
    """accepted and delivered arrive signed, with per-recipient expanded user-variables."""
    variables = {"a@x.com": {"log_id": "l-a"}, "b@x.com": {"log_id": "l-b"}}
    form = mailgun_form(
        "a@x.com",
        "B@x.com",
        extra=[
            ("v:batch_id", "b-1"),
            ("v:log_id", "%recipient.log_id%"),
            ("o:tag", "news"),
            ("recipient-variables", orjson.dumps(variables).decode()),
        ],
    )

    response = await _send(sandbox, form)
    await sandbox.settle()

    message_id = response.json()["id"].strip("<>")
    for recipient, log_id in (("a@x.com", "l-a"), ("b@x.com", "l-b")):
        events = sandbox.receiver.mailgun_for(recipient)
        assert [e["event"] for e in events] == ["accepted", "delivered"]
        for event in events:
            assert event["user-variables"] == {"batch_id": "b-1", "log_id": log_id}
            assert event["message"]["headers"]["message-id"] == message_id
            assert event["tags"] == ["news"]
            assert isinstance(event["timestamp"], float)
    ids = [e["id"] for e in sandbox.receiver.mailgun]
    assert len(set(ids)) == len(ids) == 4
    assert sandbox.receiver.bad_signatures == 0


async def test_outcomes_follow_the_local_part(sandbox: Harness) -> None:
    """bounce, defer, drop, complaint, unsub and open addresses get Mailgun's events."""
    to = ["bounce@x.com", "defer@x.com", "drop@x.com", "complaint@x.com", "unsub@x.com"]

    await _send(sandbox, mailgun_form(*to, "open@x.com"))
    await sandbox.settle()

    def last(recipient: str) -> dict[str, Any]:
        return sandbox.receiver.mailgun_for(recipient)[-1]

    bounce = last("bounce@x.com")
    assert (bounce["event"], bounce["severity"], bounce["reason"]) == (
        "failed",
        "permanent",
        "bounce",
    )
    assert bounce["delivery-status"]["code"] == 550
    defer = last("defer@x.com")
    assert (defer["event"], defer["severity"]) == ("failed", "temporary")
    drop = last("drop@x.com")
    assert (drop["severity"], drop["reason"]) == ("permanent", "suppress-bounce")
    assert [e["event"] for e in sandbox.receiver.mailgun_for("complaint@x.com")] == [
        "accepted",
        "delivered",
        "complained",
    ]
    assert last("unsub@x.com")["event"] == "unsubscribed"
    assert last("open@x.com")["event"] == "opened"
