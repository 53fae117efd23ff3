"""The sandbox's provider query APIs over HTTP: SendGrid's Email Activity
(``GET /sendgrid/v3/messages``) and Mailgun's Events (``GET /mailgun/v3/<domain>/events``):
credentials, unknown ids and domains, malformed parameters and page tokens, and paging."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from sandbox.activity import Indexed, MessageIndex
from sandbox.query import sendgrid_entries
from tests.unit.sandbox.conftest import (
    FORM,
    MAILGUN_AUTH,
    SENDGRID_AUTH,
    Harness,
    encoded,
    mailgun_form,
    running,
    sandbox_settings,
    sendgrid_mail,
)

ACTIVITY = "/sendgrid/v3/messages"
DOMAIN = "mg.example.com"


def _events_url(domain: str = DOMAIN) -> str:
    return f"/mailgun/v3/{domain}/events"


def _address(prefix: str = "ann") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}@x.com"


@pytest.fixture
async def sandbox() -> AsyncIterator[Harness]:
    """A sandbox whose query APIs show accepted mail at once (no indexing lag)."""
    async with running(sandbox_settings(query_delay=0.0)) as harness:
        yield harness


async def _sendgrid(sandbox: Harness, body: dict[str, Any]) -> str:
    response = await sandbox.client.post("/sendgrid/v3/mail/send", json=body, headers=SENDGRID_AUTH)
    assert response.status_code == 202
    return response.headers["X-Message-Id"]


async def _mailgun(sandbox: Harness, *to: str, domain: str = DOMAIN) -> str:
    response = await sandbox.client.post(
        f"/mailgun/v3/{domain}/messages",
        content=encoded(mailgun_form(*to)),
        headers={**FORM, **MAILGUN_AUTH},
    )
    assert response.status_code == 200
    message_id: str = response.json()["id"]
    return message_id


async def _activity(
    sandbox: Harness, headers: dict[str, str] = SENDGRID_AUTH, **params: str
) -> httpx.Response:
    return await sandbox.client.get(ACTIVITY, params=params, headers=headers)


async def _events(
    sandbox: Harness, url: str | None = None, headers: dict[str, str] = MAILGUN_AUTH, **params: str
) -> httpx.Response:
    return await sandbox.client.get(url or _events_url(), params=params, headers=headers)


def _error(response: httpx.Response) -> tuple[int, str, str | None]:
    [error] = response.json()["errors"]
    return response.status_code, error["message"], error["field"]


def _recipients(response: httpx.Response, key: str = "to_email") -> list[str]:
    assert response.status_code == 200, response.text
    return [m[key] for m in response.json()["messages"]]


def _local(url: str) -> str:
    """A paging URL of the answer, as a path the in-process client can follow."""
    return httpx.URL(url).path


# -- SendGrid Email Activity ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        (None, "authorization required"),
        ("Basic YXBpOmtleQ==", "authorization required"),
        ("Bearer ", "authorization required"),
        ("Bearer invalid", "The provided authorization grant is invalid, expired, or revoked"),
    ],
    ids=["missing", "basic", "empty key", "revoked key"],
)
async def test_activity_without_a_usable_bearer_key_is_401(
    sandbox: Harness, authorization: str | None, message: str
) -> None:
    """Only a non-empty bearer key other than ``invalid`` may read the activity feed."""
    headers = {"Authorization": authorization} if authorization is not None else {}

    response = await _activity(sandbox, headers=headers)

    assert _error(response) == (401, message, None)


async def test_an_account_without_the_add_on_is_refused_with_400() -> None:
    """Without Email Activity History the feed answers 400, but bad credentials still 401."""
    async with running(sandbox_settings(sendgrid_email_activity=False)) as sandbox:
        refused = await _activity(sandbox)
        unauthenticated = await _activity(sandbox, headers={})

    assert _error(refused) == (400, "authorization required", None)
    assert unauthenticated.status_code == 401


@pytest.mark.parametrize("limit", ["0", "1001", "-1", "ten", "", "1.5", " 5"])
async def test_a_limit_outside_1_to_1000_is_400_on_the_limit_field(
    sandbox: Harness, limit: str
) -> None:
    """``limit`` must be a plain integer from 1 to 1000."""
    response = await _activity(sandbox, limit=limit)

    assert _error(response) == (400, "limit must be between 1 and 1000", "limit")


async def test_a_limit_of_unicode_digits_is_400_not_a_crash(sandbox: Harness) -> None:
    """A superscript digit is no limit SendGrid accepts: 400 on ``limit``."""
    response = await _activity(sandbox, limit="²")

    assert _error(response)[0::2] == (400, "limit")


async def test_limit_keeps_the_newest_messages_first(sandbox: Harness) -> None:
    """``limit=N`` lists the N most recently accepted recipients, newest first."""
    first, second, third = _address(), _address(), _address()
    for address in (first, second, third):
        await _sendgrid(sandbox, sendgrid_mail(address))

    assert _recipients(await _activity(sandbox, limit="2")) == [third, second]
    assert _recipients(await _activity(sandbox, limit="1000")) == [third, second, first]


async def test_without_a_limit_ten_messages_are_listed(sandbox: Harness) -> None:
    """The default page is ten messages."""
    await _sendgrid(sandbox, sendgrid_mail(*(_address() for _ in range(12))))

    assert len(_recipients(await _activity(sandbox))) == 10


@pytest.mark.parametrize(
    "query",
    [
        'nope="x"',
        'to_email="a@x.com',
        'unique_args="x"',
        "to_email['k']=\"a@x.com\"",
        'to_email="a@x.com" OR subject="b"',
        'last_event_time BETWEEN TIMESTAMP "2024-01-01T00:00:00Z"',
        "to_email = a@x.com",
        'subject="' + "x" * 4000 + '"',
    ],
    ids=[
        "unknown field",
        "unterminated",
        "map without key",
        "key on a string",
        "or",
        "half a range",
        "unquoted",
        "too long",
    ],
)
async def test_a_query_we_cannot_parse_is_400_on_the_query_field(
    sandbox: Harness, query: str
) -> None:
    """Anything outside the supported grammar is refused, never read as "match all"."""
    response = await _activity(sandbox, query=query)

    status, message, field = _error(response)
    assert (status, field) == (400, "query")
    assert message.startswith(("invalid syntax", "operator = is incompatible"))


async def test_an_unknown_message_id_finds_nothing(sandbox: Harness) -> None:
    """A msg_id no request was given is an empty answer, not an error."""
    await _sendgrid(sandbox, sendgrid_mail(_address()))

    response = await _activity(sandbox, query=f'msg_id="{uuid.uuid4().hex}"')

    assert _recipients(response) == []


async def test_the_x_message_id_finds_every_recipient_of_its_request(sandbox: Harness) -> None:
    """Each personalization has its own msg_id under the request's X-Message-Id."""
    a, b, other = _address(), _address(), _address()
    body = sendgrid_mail(a)
    body["personalizations"].append({"to": [{"email": b}]})
    message_id = await _sendgrid(sandbox, body)
    await _sendgrid(sandbox, sendgrid_mail(other))

    response = await _activity(sandbox, query=f'msg_id="{message_id}"')

    assert sorted(_recipients(response)) == sorted([a, b])
    assert all(m.startswith(f"{message_id}.") for m in _recipients(response, "msg_id"))


async def test_to_email_matches_whatever_the_case(sandbox: Harness) -> None:
    """Addresses are indexed lower-cased and compared without case."""
    address = _address("Mixed")
    await _sendgrid(sandbox, sendgrid_mail(address))
    await _sendgrid(sandbox, sendgrid_mail(_address()))

    response = await _activity(sandbox, query=f'to_email="{address.upper()}"')

    assert _recipients(response) == [address.lower()]


async def test_custom_args_of_a_personalization_override_the_top_level_ones(
    sandbox: Harness,
) -> None:
    """``unique_args['k']`` sees the personalization's value where both set ``k``."""
    own, inherited = _address(), _address()
    body = sendgrid_mail(own, custom_args={"log_id": "top", "batch": "b-1"})
    body["personalizations"][0]["custom_args"] = {"log_id": "mine"}
    body["personalizations"].append({"to": [{"email": inherited}]})
    await _sendgrid(sandbox, body)

    mine = await _activity(sandbox, query="unique_args['log_id']=\"mine\"")
    top = await _activity(sandbox, query="unique_args['log_id']=\"top\"")
    both = await _activity(sandbox, query='unique_args[\'batch\']="b-1" AND subject="Hello"')

    assert _recipients(mine) == [own]
    assert _recipients(top) == [inherited]
    assert sorted(_recipients(both)) == sorted([own, inherited])


async def test_an_escaped_quote_in_a_value_matches_the_quote(sandbox: Harness) -> None:
    """``\\"`` inside a quoted value stands for ``"``."""
    address = _address()
    await _sendgrid(sandbox, sendgrid_mail(address, subject='Say "hi"'))

    response = await _activity(sandbox, query=r'subject="Say \"hi\""')

    assert _recipients(response) == [address]


async def test_a_time_range_finds_only_mail_accepted_within_it(sandbox: Harness) -> None:
    """``last_event_time BETWEEN`` bounds the acceptance time (ISO UTC, inclusive)."""
    address = _address()
    await _sendgrid(sandbox, sendgrid_mail(address))
    around = 'last_event_time BETWEEN TIMESTAMP "2000-01-01T00:00:00Z" AND TIMESTAMP "2999-01-01"'
    before = (
        'last_event_time BETWEEN TIMESTAMP "2000-01-01T00:00:00Z" AND TIMESTAMP '
        '"2000-01-02T00:00:00Z"'
    )

    assert _recipients(await _activity(sandbox, query=around)) == [address]
    assert _recipients(await _activity(sandbox, query=before)) == []


async def test_mail_is_not_listed_before_the_query_delay() -> None:
    """As at SendGrid, just-accepted mail is not yet in the feed."""
    async with running(sandbox_settings(query_delay=30.0)) as sandbox:
        await _sendgrid(sandbox, sendgrid_mail(_address()))

        response = await _activity(sandbox)

    assert _recipients(response) == []


def test_every_to_cc_and_bcc_recipient_is_one_entry_with_its_subject() -> None:
    """Entries are per recipient; a personalization's subject wins over the top-level one."""
    payload = {
        "from": {"email": "s@x.com"},
        "subject": "Top",
        "personalizations": [
            {"to": [{"email": "A@x.com"}], "cc": [{"email": "c@x.com"}]},
            {"to": [{"email": "b@x.com"}], "bcc": [{"email": "d@x.com"}], "subject": "Own"},
        ],
    }

    entries = list(sendgrid_entries(payload, "MID", 255.0))

    assert [(e.recipient, e.subject) for e in entries] == [
        ("a@x.com", "Top"),
        ("c@x.com", "Top"),
        ("b@x.com", "Own"),
        ("d@x.com", "Own"),
    ]
    assert {e.message_id for e in entries} == {"MID.filter0001.FF.0", "MID.filter0001.FF.1"}
    assert {e.sender for e in entries} == {"s@x.com"}


# -- Mailgun Events -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [None, "Basic " + base64.b64encode(b"api:invalid").decode(), "Basic %%%", "Bearer key"],
    ids=["missing", "invalid key", "not base64", "not basic"],
)
async def test_events_without_usable_credentials_are_401_forbidden(
    sandbox: Harness, authorization: str | None
) -> None:
    """The Events API takes the same basic auth as sending."""
    headers = {"Authorization": authorization} if authorization is not None else {}

    response = await _events(sandbox, headers=headers)

    assert (response.status_code, response.text) == (401, "Forbidden")


async def test_events_of_an_unknown_domain_are_404(sandbox: Harness) -> None:
    """A domain named ``unknown.*`` has no events (and no page token helps)."""
    plain = await _events(sandbox, url=_events_url("unknown.example.com"))
    paged = await _events(sandbox, url=_events_url("unknown.example.com") + "/abc")

    assert (plain.status_code, plain.json()) == (404, {"message": "Domain not found"})
    assert paged.status_code == 404


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"begin": "yesterday", "ascending": "yes"}, "cannot parse 'yesterday' as epoch seconds"),
        ({"end": "soon"}, "cannot parse 'soon' as epoch seconds"),
        ({"ascending": "maybe"}, "ascending must be yes or no"),
        ({"begin": "100"}, "ascending is required when end is not given"),
        ({"begin": "100", "end": "100"}, "Inconsistent range"),
        ({"begin": "200", "end": "100", "ascending": "yes"}, "Inconsistent range"),
        ({"begin": "100", "end": "200", "ascending": "no"}, "Inconsistent range"),
        ({"limit": "0"}, "limit must be between 1 and 300"),
        ({"limit": "301"}, "limit must be between 1 and 300"),
        ({"limit": "many"}, "limit must be between 1 and 300"),
    ],
)
async def test_malformed_event_filters_are_400_with_mailguns_message(
    sandbox: Harness, params: dict[str, str], message: str
) -> None:
    """Each filter Mailgun would refuse is refused with its message."""
    response = await sandbox.client.get(_events_url(), params=params, headers=MAILGUN_AUTH)

    assert response.status_code == 400
    assert response.json()["message"].startswith(message)


async def test_an_events_limit_of_unicode_digits_is_400_not_a_crash(sandbox: Harness) -> None:
    """A superscript digit is not a limit: 400."""
    response = await _events(sandbox, limit="²")

    assert response.status_code == 400


async def test_a_begin_that_is_not_a_number_is_refused(sandbox: Harness) -> None:
    """``begin=nan`` is no epoch time: 400, rather than page links that crash when followed."""
    await _mailgun(sandbox, _address())

    response = await _events(sandbox, begin="nan", ascending="yes")

    assert response.status_code == 400


@pytest.mark.parametrize(
    "token",
    [
        "!!!",
        base64.urlsafe_b64encode(b"not json").decode(),
        base64.urlsafe_b64encode(orjson.dumps({"b": 0})).decode(),
        base64.urlsafe_b64encode(orjson.dumps([1, 2, 3])).decode(),
    ],
    ids=["not base64", "not json", "missing keys", "not an object"],
)
async def test_a_forged_page_token_is_400(sandbox: Harness, token: str) -> None:
    """A page token the sandbox did not make is refused as invalid."""
    response = await _events(sandbox, url=f"{_events_url()}/{token}")

    assert (response.status_code, response.json()) == (400, {"message": "invalid page token"})


async def test_a_page_token_with_fields_of_the_wrong_type_is_400(sandbox: Harness) -> None:
    """A well-formed token carrying a string where a time belongs is invalid too."""
    await _mailgun(sandbox, _address())
    fields = {"b": "x", "e": None, "a": True, "l": 10, "ev": None, "r": None, "o": 0}
    token = base64.urlsafe_b64encode(orjson.dumps(fields)).decode().rstrip("=")

    response = await _events(sandbox, url=f"{_events_url()}/{token}")

    assert response.status_code == 400


async def test_following_next_walks_every_event_once_in_order(sandbox: Harness) -> None:
    """Ascending pages of two cover five recipients exactly once, then come back empty."""
    addresses = [_address() for _ in range(5)]
    for address in addresses:
        await _mailgun(sandbox, address)

    seen: list[str] = []
    sizes: list[int] = []
    page = await _events(sandbox, ascending="yes", limit="2")
    while True:
        items = page.json()["items"]
        sizes.append(len(items))
        seen += [item["recipient"] for item in items]
        if not items:
            break
        page = await _events(sandbox, url=_local(page.json()["paging"]["next"]))

    assert sizes == [2, 2, 1, 0]
    assert seen == addresses


async def test_previous_and_first_lead_back_to_the_first_page(sandbox: Harness) -> None:
    """From the second page, ``previous`` and ``first`` both show the first page again."""
    for _ in range(4):
        await _mailgun(sandbox, _address())
    first = await _events(sandbox, ascending="yes", limit="2")
    second = await _events(sandbox, url=_local(first.json()["paging"]["next"]))

    paging = second.json()["paging"]
    previous = await _events(sandbox, url=_local(paging["previous"]))
    again = await _events(sandbox, url=_local(paging["first"]))

    assert previous.json()["items"] == first.json()["items"] == again.json()["items"]
    assert previous.json()["items"] != second.json()["items"]


async def test_the_last_next_link_shows_mail_accepted_later(sandbox: Harness) -> None:
    """An empty page's ``next`` keeps its place, so polling it finds newer events."""
    await _mailgun(sandbox, _address())
    first = await _events(sandbox, ascending="yes", limit="5")
    tail = _local(first.json()["paging"]["next"])
    assert (await _events(sandbox, url=tail)).json()["items"] == []
    late = _address()
    await _mailgun(sandbox, late)

    polled = await _events(sandbox, url=tail)

    assert [item["recipient"] for item in polled.json()["items"]] == [late]


async def test_without_a_range_the_newest_events_come_first(sandbox: Harness) -> None:
    """The default order is descending from now."""
    first, second = _address(), _address()
    await _mailgun(sandbox, first)
    await _mailgun(sandbox, second)

    response = await _events(sandbox)

    assert [item["recipient"] for item in response.json()["items"]] == [second, first]


async def test_a_range_in_the_past_has_no_events(sandbox: Harness) -> None:
    """``begin``/``end`` bound the acceptance time."""
    await _mailgun(sandbox, _address())
    now = time.time()

    past = await _events(sandbox, begin=str(now - 3600), end=str(now - 60), ascending="yes")
    around = await _events(sandbox, begin=str(now + 60), end=str(now - 60))

    assert past.json()["items"] == []
    assert len(around.json()["items"]) == 1


async def test_recipient_and_event_filters(sandbox: Harness) -> None:
    """``recipient`` matches without case; any event but ``accepted`` has no items."""
    wanted, other = _address("Wanted"), _address()
    message_id = await _mailgun(sandbox, wanted, other)

    by_recipient = await _events(sandbox, recipient=wanted.upper())
    delivered = await _events(sandbox, event="delivered")

    [item] = by_recipient.json()["items"]
    assert item["recipient"] == wanted.lower()
    assert item["message"]["headers"]["message-id"] == message_id.strip("<>")
    assert item["recipient-domain"] == "x.com"
    assert delivered.json()["items"] == []


async def test_paging_links_work_for_a_domain_that_starts_with_events(sandbox: Harness) -> None:
    """The ``next`` link of ``events.example.com`` leads to its second page."""
    domain = "events.example.com"
    await _mailgun(sandbox, _address(), _address(), domain=domain)
    first = await _events(sandbox, url=_events_url(domain), ascending="yes", limit="1")

    second = await _events(sandbox, url=_local(first.json()["paging"]["next"]))

    assert second.status_code == 200
    assert len(second.json()["items"]) == 1


async def test_events_are_scoped_to_their_sending_domain(sandbox: Harness) -> None:
    """Mail sent through one domain is not among another domain's events."""
    await _mailgun(sandbox, _address(), domain="one.example.com")

    response = await _events(sandbox, url=_events_url("two.example.com"))

    assert response.json()["items"] == []


@pytest.mark.parametrize("field", ["tags", "message-id", "from", "severity", "user-variables"])
async def test_a_filter_the_sandbox_does_not_apply_is_400_not_every_event(
    sandbox: Harness, field: str
) -> None:
    """Mailgun would apply these filters; the sandbox refuses them rather than ignore them."""
    await _mailgun(sandbox, _address())

    response = await sandbox.client.get(_events_url(), params={field: "x"}, headers=MAILGUN_AUTH)

    assert (response.status_code, response.json()) == (
        400,
        {"message": f"the sandbox does not filter on {field!r}"},
    )


async def test_a_recipients_events_page_past_other_recipients_mail(sandbox: Harness) -> None:
    """A ``recipient`` query pages through that address's events only, oldest first."""
    wanted = _address("wanted")
    for _ in range(3):
        await _mailgun(sandbox, _address())
        await _mailgun(sandbox, wanted, _address())
    now = time.time()

    seen: list[dict[str, Any]] = []
    page = await _events(
        sandbox, recipient=wanted, begin=str(now - 60), end=str(now + 60), limit="2"
    )
    while page.json()["items"]:
        seen += page.json()["items"]
        page = await _events(sandbox, url=_local(page.json()["paging"]["next"]))

    assert [item["recipient"] for item in seen] == [wanted] * 3
    assert [item["timestamp"] for item in seen] == sorted(item["timestamp"] for item in seen)


async def test_without_ascending_a_range_runs_from_begin_to_end(sandbox: Harness) -> None:
    """As Mailgun documents, the direction of a range with both ends is deduced from them."""
    first, second = _address(), _address()
    await _mailgun(sandbox, first)
    await _mailgun(sandbox, second)
    now = time.time()

    forward = await _events(sandbox, begin=str(now - 60), end=str(now + 60))
    backward = await _events(sandbox, begin=str(now + 60), end=str(now - 60))

    assert [item["recipient"] for item in forward.json()["items"]] == [first, second]
    assert [item["recipient"] for item in backward.json()["items"]] == [second, first]


def test_the_index_forgets_its_oldest_entries_for_recipient_queries_too() -> None:
    """Past its capacity the oldest entry leaves both the whole list and its recipient's."""
    index = MessageIndex(delay=0.0, capacity=2)
    entries = [
        Indexed("mailgun", f"m{n}", address, float(n), {}, "s", "f", DOMAIN)
        for n, address in enumerate(["a@x.com", "b@x.com", "a@x.com"])
    ]

    index.add(entries)

    assert index.visible("mailgun", 10.0) == entries[1:]
    assert index.visible("mailgun", 10.0, "a@x.com") == entries[2:]
    assert index.visible("mailgun", 10.0, "b@x.com") == entries[1:2]
    assert index.visible("sendgrid", 10.0, "a@x.com") == []
