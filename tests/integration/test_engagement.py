"""Engagement and compliance on real services: tracked links redirect only to their own URL,
a tampered token is a 404, opens and clicks count once per recipient and in total, one-click
unsubscribe (RFC 8058) suppresses for the sender (scoped to the list the mail named) so the
next batch skips the address, a provider's unsubscribe ends in the same suppression, and the
cooldown reports the recipients it leaves out. The tests share one stack, each as a user of its
own."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from services.tracking.app import PIXEL
from services.tracking.app import create_app as create_tracking
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.integration.harness import eventually, served
from tests.integration.stack import (
    MG_KEY,
    Stack,
    as_new_user,
    emails,
    fast_settings,
    full_stack,
)

HTML = (
    '<html><body><p>Hi -name-, see <a href="https://shop.example/sale?a=1&amp;b=2">the sale</a>'
    ' and <a href="https://shop.example/blog">our blog</a>; your own '
    '<a href="https://shop.example/u/-name-">page</a> and '
    '<a href="https://pages.example/p/-name-">profile</a>.</p></body></html>'
)
#: Personal links to this host are tracked (the operator allows it).
ALLOWED = "pages.example"
#: The List-Unsubscribe mailto, and the password of the Inbound Parse URL that forwards it.
MAILTO = "unsubscribe@in.example"
PARSE_PASSWORD = "parse-password"


@pytest.fixture(scope="module")
async def module_stack(module_settings: Settings, db: Database) -> AsyncIterator[Stack]:
    """One stack for the module (starting one costs seconds), with its tracking server."""
    inbound = {"inbound_basic_user": "parse", "inbound_basic_password": SecretStr(PARSE_PASSWORD)}
    async with full_stack(fast_settings(module_settings), db, webhooks=inbound) as s:
        tracking = s.settings.tracking.model_copy(
            update={"redirect_hosts": ALLOWED, "unsubscribe_mailto": MAILTO}
        )
        s.settings = s.settings.model_copy(update={"tracking": tracking})
        async with served(create_tracking(s.settings)) as url:
            tracking = tracking.model_copy(update={"public_url": url})
            s.settings = s.settings.model_copy(update={"tracking": tracking})
            yield s


@pytest.fixture
async def stack(module_stack: Stack) -> Stack:
    """The module's stack, as a user of the test's own: tests share no data (their users'
    suppressions, preferences, cooldowns and counts are their own)."""
    return await as_new_user(module_stack)


async def _send_and_receive(
    stack: Stack, to: list[Any], **extra: Any
) -> tuple[str, dict[str, dict[str, Any]]]:
    async with stack.consuming():
        batch_id = await stack.submit(to, html=HTML, **extra)
        addresses = [t["email"] if isinstance(t, dict) else t for t in to]
        received = {email: await stack.received(email) for email in addresses}
    return batch_id, received


def _hrefs(html: str) -> list[str]:
    return re.findall(r'href="([^"]+)"', html)


def _header(message: dict[str, Any], name: str) -> str | None:
    return next((v for k, v in message["headers"].items() if k.lower() == name.lower()), None)


def _one_click(message: dict[str, Any]) -> str:
    """The one-click URL of the copy's List-Unsubscribe (the first; a mailto: follows)."""
    found = re.match(r"<(https?://[^>]+)>", _header(message, "List-Unsubscribe") or "")
    assert found is not None
    return found.group(1)


async def test_a_tracked_link_redirects_only_to_its_own_url(stack: Stack) -> None:
    (ann,) = emails(1)
    subs = [{"email": ann, "substitutions": {"-name-": "ann"}}]
    _, received = await _send_and_receive(stack, subs, tracking={"clicks": True})
    sale, blog, own, profile = _hrefs(received[ann]["html"])

    assert sale.startswith(stack.settings.tracking.public_url + "/c/")
    assert blog.startswith(stack.settings.tracking.public_url + "/c/") and blog != sale
    assert own == "https://shop.example/u/ann"  # a personal link stays as it is...
    assert profile.startswith(stack.settings.tracking.public_url + "/c/")  # ...unless allowed
    async with httpx.AsyncClient(follow_redirects=False) as reader:
        first = await reader.get(sale)
        second = await reader.get(blog)
        third = await reader.get(profile)
    assert (first.status_code, first.headers["location"]) == (
        302,
        "https://shop.example/sale?a=1&b=2",
    )
    assert (second.status_code, second.headers["location"]) == (302, "https://shop.example/blog")
    assert (third.status_code, third.headers["location"]) == (302, "https://pages.example/p/ann")


async def test_a_tampered_token_is_a_404_page_never_a_redirect(stack: Stack) -> None:
    (ann,) = emails(1)
    _, received = await _send_and_receive(stack, [ann], tracking={"clicks": True})
    link = _hrefs(received[ann]["html"])[0]
    base, token = link.rsplit("/", 1)
    kid, payload, mac = token.split(".")
    forged = [
        f"{base}/{kid}.{payload}.{mac[:-2]}{'AA' if mac[-2:] != 'AA' else 'BB'}",
        f"{base}/{kid}.{payload[:-3]}xyz.{mac}",
        f"{base}/nokey.{payload}.{mac}",
        f"{base}/{kid}.{payload}",
    ]
    async with httpx.AsyncClient(follow_redirects=False) as reader:
        for url in forged:
            resp = await reader.get(url)
            assert resp.status_code == 404, url
            assert "location" not in resp.headers
            assert "text/html" in resp.headers["content-type"]
        outside = await reader.get(f"{base}/https%3A%2F%2Fevil.example")
    assert outside.status_code == 404 and "location" not in outside.headers


async def test_opens_and_clicks_count_once_per_recipient_and_in_total(stack: Stack) -> None:
    ann, bob = emails(2)
    batch_id, received = await _send_and_receive(
        stack, [ann, bob], tracking={"opens": True, "clicks": True}
    )
    pixel = re.search(r'<img src="([^"]+/o/[^"]+)"', received[ann]["html"])
    assert pixel is not None
    async with httpx.AsyncClient(follow_redirects=False) as reader:
        for _ in range(3):
            resp = await reader.get(pixel.group(1))
            assert resp.content == PIXEL and resp.headers["content-type"] == "image/gif"
        await reader.get(_hrefs(received[ann]["html"])[0])
        await reader.get(_hrefs(received[ann]["html"])[1])
        await reader.get(
            _hrefs(received[bob]["html"])[0],
            headers={"User-Agent": "Mozilla/5.0 (compatible; BingPreview/1.0b) SafeLinks"},
        )

    async def counted() -> dict[str, int] | None:
        delta = await stack.batch_stats(batch_id)  # the test's own user: only this batch
        settled = delta["clicks_total"] >= 3 and delta["opens_total"] >= 3 and delta["success"] >= 2
        return delta if settled else None

    delta = await eventually(counted, timeout=20)
    assert delta["opened"] == 1 and delta["opens_total"] == 3
    assert delta["clicked"] == 2 and delta["clicks_total"] == 3
    assert delta["machine_clicks"] == 1 and delta["machine_opens"] == 0
    assert delta["success"] == 2  # engagement never changes an outcome (both delivered)


async def test_one_click_unsubscribe_suppresses_and_the_next_batch_skips_the_address(
    stack: Stack,
) -> None:
    ann, bob = emails(2)
    _, received = await _send_and_receive(stack, [ann, bob], list="news")
    message = received[ann]
    assert _header(message, "List-Unsubscribe-Post") == "List-Unsubscribe=One-Click"
    url = re.match(r"<([^>]+)>", _header(message, "List-Unsubscribe") or "")
    assert url is not None and url.group(1).startswith(stack.settings.tracking.public_url)

    async with httpx.AsyncClient(follow_redirects=False) as mail_client:
        resp = await mail_client.post(
            url.group(1),
            content="List-Unsubscribe=One-Click",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    assert resp.status_code == 200, resp.text

    listed = await stack.api.get("/v1/suppressions", params={"list": "news"}, headers=stack.auth)
    assert [s["email"] for s in listed.json()["data"]] == [ann.lower()]
    again = await stack.post([ann, bob], list="news")
    assert again.status_code == 202, again.text
    assert again.json()["accepted"] == 1 and again.json()["suppressed"] == [ann]
    assert again.json()["skipped"][0]["email"] == ann
    assert "one-click unsubscribe" in again.json()["skipped"][0]["reason"]
    # Only that list: other mail (a receipt naming no list) still reaches the address.
    other = await stack.post([ann])
    assert other.status_code == 202 and other.json()["accepted"] == 1


async def test_a_bulk_lane_batch_carries_one_click_unsubscribe_that_suppresses(
    stack: Stack,
) -> None:
    """The bulk lane brings both headers by default (Gmail and Yahoo require them of bulk
    senders), and their one-click POST suppresses the address for all of the user's mail."""
    ann, bob = emails(2)
    _, received = await _send_and_receive(stack, [ann, bob], priority="bulk")
    for message in received.values():
        assert _header(message, "List-Unsubscribe-Post") == "List-Unsubscribe=One-Click"
    url = re.match(r"<([^>]+)>", _header(received[ann], "List-Unsubscribe") or "")
    assert url is not None and url.group(1).startswith(stack.settings.tracking.public_url)

    async with httpx.AsyncClient(follow_redirects=False) as mail_client:
        resp = await mail_client.post(
            url.group(1),
            content="List-Unsubscribe=One-Click",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    assert resp.status_code == 200, resp.text

    async def suppressed() -> list[str] | None:
        # The API's cache of the list drops it when it hears the tracking server's broadcast.
        again = await stack.post([ann, bob])
        return list(again.json()["suppressed"]) or None

    assert await eventually(suppressed, timeout=15, interval=0.1) == [ann]


async def test_a_bulk_lane_batch_pinned_to_mailgun_carries_both_headers(stack: Stack) -> None:
    (ann,) = emails(1)
    _, received = await _send_and_receive(stack, [ann], priority="bulk", provider="mailgun")
    message = received[ann]
    assert message["provider"] == "mailgun"
    assert _header(message, "List-Unsubscribe-Post") == "List-Unsubscribe=One-Click"
    assert _one_click(message).startswith(f"{stack.settings.tracking.public_url}/u/")


async def test_a_shared_bulk_batch_goes_without_the_header_and_says_why(stack: Stack) -> None:
    ann, bob = emails(2)
    resp = await stack.post([ann, bob], priority="bulk", shared=True)
    assert resp.status_code == 202, resp.text
    assert ["shared messages cannot carry it" in w for w in resp.json()["warnings"]] == [True]

    async with stack.consuming():
        message = await stack.received(ann)
    assert _header(message, "List-Unsubscribe") is None


async def test_the_unsubscribe_page_asks_before_it_suppresses(stack: Stack) -> None:
    (ann,) = emails(1)
    _, received = await _send_and_receive(stack, [ann], unsubscribe=True)
    url = _one_click(received[ann])

    async with httpx.AsyncClient(follow_redirects=False) as browser:
        page = await browser.get(url)
        assert page.status_code == 200
        assert ann.lower() in page.text and '<form method="post">' in page.text
        assert (await stack.post([ann])).json()["accepted"] == 1  # nothing suppressed yet
        done = await browser.post(url)
    assert done.status_code == 200 and "no more" in done.text

    async def refused() -> httpx.Response | None:
        resp = await stack.post([ann])
        return resp if resp.status_code == 422 else None

    # The tracking server wrote the suppression: the API's cache, which held the list since
    # the post above, drops it when it hears the broadcast (or past its TTL).
    resp = await eventually(refused, timeout=15, interval=0.1)
    # Its only recipient unsubscribed from all of this mail.
    assert "unsubscribe page" in resp.json()["error"]["fields"][f"to.{ann}"]


async def test_a_provider_unsubscribe_ends_in_the_same_suppression(stack: Stack) -> None:
    ann, bob = emails(2)
    async with stack.consuming():
        batch_id = await stack.submit([ann, bob], list="offers")
        await stack.final(batch_id, 2)
    resp = await stack.sendgrid_event(batch_id, ann, "unsubscribe")
    assert resp.status_code == 200, resp.text

    async def listed() -> list[str] | None:
        page = await stack.api.get(
            "/v1/suppressions", params={"list": "offers"}, headers=stack.auth
        )
        found = [s["email"] for s in page.json()["data"]]
        return found or None

    assert await eventually(listed, timeout=10) == [ann.lower()]

    async def suppressed() -> list[str] | None:
        # The API's cache of the list, loaded by the first batch, drops it when it hears the
        # webhook service's broadcast, which may come after the row is readable.
        again = await stack.post([ann, bob], list="offers")
        return list(again.json()["suppressed"]) or None

    assert await eventually(suppressed, timeout=15, interval=0.1) == [ann]


async def test_mailgun_copies_carry_the_same_headers_and_links(stack: Stack) -> None:
    (ann,) = emails(1)
    _, received = await _send_and_receive(
        stack, [ann], provider="mailgun", list="news", tracking={"clicks": True}
    )
    message = received[ann]
    assert message["provider"] == "mailgun"
    assert _header(message, "List-Unsubscribe-Post") == "List-Unsubscribe=One-Click"
    assert (_header(message, "List-Unsubscribe") or "").startswith(
        f"<{stack.settings.tracking.public_url}/u/"
    )
    async with httpx.AsyncClient(follow_redirects=False) as reader:
        resp = await reader.get(_hrefs(message["html"])[1])
    assert resp.headers["location"] == "https://shop.example/blog"


async def test_tracking_follows_the_users_preferences(stack: Stack) -> None:
    (ann,) = emails(1)
    resp = await stack.api.patch(
        "/v1/preferences", json={"tracking": {"opens": True}}, headers=stack.auth
    )
    assert resp.status_code == 200 and resp.json()["tracking"] == {"opens": True, "clicks": False}
    _, received = await _send_and_receive(stack, [ann])
    assert "/o/" in received[ann]["html"]  # the pixel, by default now
    assert "https://shop.example/blog" in received[ann]["html"]  # links not tracked


async def test_tracking_a_shared_message_is_refused(stack: Stack) -> None:
    ann, bob = emails(2)
    resp = await stack.post([ann, bob], shared=True, tracking={"opens": True})
    assert resp.status_code == 422
    assert "one copy per recipient" in resp.json()["error"]["fields"]["shared"]


async def test_cooldown_reports_recipients_mailed_too_recently(stack: Stack) -> None:
    ann, bob, cid = emails(3)
    resp = await stack.api.patch(
        "/v1/preferences", json={"cooldown": {"seconds": 3600}}, headers=stack.auth
    )
    assert resp.json()["cooldown"] == {"seconds": 3600, "per_category": False}
    assert (await stack.post([ann, bob])).json()["accepted"] == 2

    again = await stack.post([bob, cid])
    assert again.status_code == 202, again.text
    assert again.json()["accepted"] == 1
    assert again.json()["suppressed"] == [bob]
    assert again.json()["skipped"] == [{"email": bob, "reason": "cooldown"}]
    only = await stack.post([ann], key=f"retry-{ann}")
    assert only.status_code == 422 and only.json()["error"]["code"] == "no_recipients"
    assert "cooldown" in only.json()["error"]["fields"][f"to.{ann}"]


async def test_a_retried_request_is_not_held_back_by_its_own_cooldown(stack: Stack) -> None:
    (ann,) = emails(1)
    await stack.api.patch(
        "/v1/preferences", json={"cooldown": {"seconds": 600}}, headers=stack.auth
    )
    first = await stack.post([ann], key=f"k-{ann}")
    repeat = await stack.post([ann], key=f"k-{ann}")
    assert first.status_code == repeat.status_code == 202
    assert repeat.json() == first.json()


async def test_cooldown_per_category_lets_other_categories_through(stack: Stack) -> None:
    (ann,) = emails(1)
    await stack.api.patch(
        "/v1/preferences",
        json={"cooldown": {"seconds": 600, "per_category": True}},
        headers=stack.auth,
    )
    assert (await stack.post([ann], categories=["news"])).json()["accepted"] == 1
    receipt = await stack.post([ann], categories=["receipt"])
    assert receipt.json()["accepted"] == 1 and receipt.json()["skipped"] == []
    news = await stack.post([ann], categories=["News"])
    assert news.status_code == 422  # the same category (compared case-insensitively)


async def test_an_unsubscribe_link_of_an_unknown_batch_is_a_404(stack: Stack) -> None:
    (ann,) = emails(1)
    _, received = await _send_and_receive(stack, [ann], unsubscribe=True)
    url = _one_click(received[ann])
    base, token = url.rsplit("/", 1)
    async with httpx.AsyncClient() as client:
        resp = await client.post(f"{base}/{urllib.parse.quote(token[:-4])}")
    assert resp.status_code == 404


def _mailto_subject(message: dict[str, Any]) -> str:
    """The Subject a mail client gives a mail to the copy's List-Unsubscribe mailto."""
    found = re.search(
        r"<mailto:([^?>]+)\?subject=([^>]+)>", _header(message, "List-Unsubscribe") or ""
    )
    assert found is not None and found.group(1) == MAILTO
    return urllib.parse.unquote(found.group(2))


def _mailgun_route_post(subject: str, recipient: str = MAILTO) -> dict[str, str]:
    """A Mailgun route's forward() of a mail, signed like its webhooks."""
    stamp, token = str(int(time.time())), secrets.token_hex(25)
    signature = hmac.new(MG_KEY.encode(), (stamp + token).encode(), hashlib.sha256).hexdigest()
    return {
        "recipient": recipient,
        "sender": "reader@example.net",
        "from": "Reader <reader@example.net>",
        "subject": subject,
        "body-plain": "",
        "timestamp": stamp,
        "token": token,
        "signature": signature,
    }


async def _suppressed_now(stack: Stack, to: list[str], **extra: Any) -> list[str]:
    async def check() -> list[str] | None:
        # The API's cache of the list drops it when it hears the webhooks' broadcast.
        again = await stack.post(to, **extra)
        return list(again.json()["suppressed"]) or None

    found: list[str] = await eventually(check, timeout=15, interval=0.1)
    return found


async def test_a_mailto_unsubscribe_through_a_mailgun_route_suppresses(stack: Stack) -> None:
    ann, bob = emails(2)
    _, received = await _send_and_receive(stack, [ann, bob], list="news")
    async with httpx.AsyncClient(base_url=stack.hooks_url) as mailgun:
        resp = await mailgun.post(
            "/webhooks/inbound/mailgun", data=_mailgun_route_post(_mailto_subject(received[ann]))
        )
    assert resp.status_code == 200 and resp.json() == {"unsubscribed": True}, resp.text

    assert await _suppressed_now(stack, [ann, bob], list="news") == [ann]


async def test_a_mailto_unsubscribe_through_sendgrid_inbound_parse_suppresses(
    stack: Stack,
) -> None:
    ann, bob = emails(2)
    _, received = await _send_and_receive(stack, [ann, bob], unsubscribe=True)
    fields = {
        "to": MAILTO,
        "from": "Bob <bob@example.net>",
        "subject": _mailto_subject(received[bob]),
        "envelope": f'{{"to": ["{MAILTO}"], "from": "bob@example.net"}}',
        "headers": "Received: by mx.example\n",
    }
    auth = httpx.BasicAuth("parse", PARSE_PASSWORD)
    async with httpx.AsyncClient(base_url=stack.hooks_url, auth=auth) as sendgrid:
        # Inbound Parse posts multipart (files= makes httpx send it so).
        resp = await sendgrid.post(
            "/webhooks/inbound/sendgrid",
            data=fields,
            files={"attachment1": ("a.txt", b"hello", "text/plain")},
        )
    assert resp.status_code == 200 and resp.json() == {"unsubscribed": True}, resp.text

    assert await _suppressed_now(stack, [ann, bob]) == [bob]


async def test_inbound_routes_refuse_what_is_not_a_proven_unsubscribe(stack: Stack) -> None:
    (ann,) = emails(1)
    _, received = await _send_and_receive(stack, [ann], unsubscribe=True)
    subject = _mailto_subject(received[ann])
    forged = {**_mailgun_route_post(subject), "signature": "0" * 64}
    basic = "Basic " + base64.b64encode(f"parse:{PARSE_PASSWORD}".encode()).decode()
    async with httpx.AsyncClient(base_url=stack.hooks_url) as client:
        bad_signature = await client.post("/webhooks/inbound/mailgun", data=forged)
        not_one = await client.post(
            "/webhooks/inbound/mailgun", data=_mailgun_route_post("Re: your order")
        )
        no_auth = await client.post(
            "/webhooks/inbound/sendgrid", data={"subject": subject}, files={"f": b"x"}
        )
        too_big = await client.post(
            "/webhooks/inbound/sendgrid",
            content=b"a" * (2 * 1024 * 1024),
            headers={"Authorization": basic, "Content-Type": "multipart/form-data; boundary=B"},
        )
        not_a_form = await client.post(
            "/webhooks/inbound/sendgrid",
            json={"subject": subject},
            headers={"Authorization": basic},
        )
    assert bad_signature.status_code == 401
    assert not_one.status_code == 406 and not_one.json()["unsubscribed"] is False
    assert no_auth.status_code == 401
    assert too_big.status_code == 413
    assert not_a_form.status_code == 415
    assert (await stack.post([ann])).json()["accepted"] == 1  # nothing suppressed
