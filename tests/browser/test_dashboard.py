"""The dashboard in a real browser: GitHub login, sending a batch and watching it deliver, API
keys and suppressions, each through the pages a user clicks (full-page screenshots of every
page land in tests/artifacts/screenshots/)."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx
import pytest
from playwright.async_api import Dialog, Page, expect

from tests.browser.conftest import Stack, api_with_dashboard, log_in, screenshot
from tests.integration.harness import served

# The first test may install Chromium with apt-get (deploy/local/chromium.sh): allow for it.
pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def _tag() -> str:
    return uuid.uuid4().hex[:8]


async def _accept_dialog(dialog: Dialog) -> None:
    await dialog.accept()


async def test_github_login_lands_on_the_overview(
    page: Page, stack: Stack, github_login: str
) -> None:
    """A logged-out visitor is sent to /login and comes back greeted after GitHub's approval."""
    await page.goto(stack.api + "/")
    await expect(page).to_have_url(re.compile(r"/login$"))
    await expect(page.get_by_role("heading", name="Log in to Safedelivr")).to_be_visible()
    await screenshot(page, "login")

    await page.get_by_role("link", name="Log in with GitHub").click()

    await expect(page).to_have_url(stack.api + "/")
    await expect(page.get_by_role("heading", level=1)).to_have_text(f"Hello, {github_login}")
    await expect(page.get_by_role("img", name=re.compile("Recipients per day"))).to_be_visible()
    await screenshot(page, "overview")


async def test_sent_batch_reaches_delivered_on_its_page(page: Page, stack: Stack) -> None:
    """The send form accepts a batch, redirects to it, and the recipient shows delivered."""
    await log_in(page, stack, "/send")
    tag = _tag()
    await screenshot(page, "send")

    await page.get_by_label("From").fill("Shop <shop@example.com>")
    await page.get_by_label("To", exact=True).fill(f"ann.{tag}@example.com\nnot-an-address")
    await page.get_by_label("Subject").fill(f"Browser test {tag}")
    await page.get_by_label("Text body").fill("Hello from the dashboard")
    await page.get_by_role("button", name="Send batch").click()

    await expect(page).to_have_url(re.compile(r"/batches/[0-9a-f-]{36}\?sent=1"))
    await expect(page.get_by_role("status")).to_contain_text("1 recipient queued")
    await expect(page.get_by_role("status")).to_contain_text("1 rejected")
    row = page.locator(f'tbody.log[data-email="ann.{tag}@example.com"]')
    for _ in range(60):
        if await row.locator('[data-col="event"]').inner_text() == "delivered":
            break
        await asyncio.sleep(0.5)
        await page.reload()
    await expect(row.locator('[data-col="state"]')).to_have_text("success")
    await expect(row.locator('[data-col="event"]')).to_have_text("delivered")
    await row.get_by_text("Timeline of").click()
    await expect(row.locator(".timeline")).to_contain_text("Delivered")
    await screenshot(page, "batch")

    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Batches").click()
    await expect(page.get_by_role("link", name=f"Browser test {tag}")).to_be_visible()
    await screenshot(page, "batches")
    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Overview").click()
    await expect(page.get_by_role("link", name=f"Browser test {tag}")).to_be_visible()
    await screenshot(page, "overview-with-mail")


async def test_bounced_recipient_fails_with_its_reason_and_is_suppressed(
    page: Page, stack: Stack
) -> None:
    """A hard bounce ends the recipient failed with the reason, and lists it as suppressed."""
    await log_in(page, stack, "/send")
    tag = _tag()
    bounce = f"bounce.{tag}@example.com"
    recipients = [f"ann.{tag}@example.com", bounce, f"sgdrop.{tag}@example.com"]
    await page.get_by_label("From").fill("Shop <shop@example.com>")
    await page.get_by_label("To", exact=True).fill(", ".join(recipients))
    await page.get_by_label("Subject").fill(f"Mixed outcomes {tag}")
    await page.get_by_label("HTML body").fill("<p>Hello {{name}}</p>")
    await page.get_by_label("Send as bulk").check()
    await page.get_by_role("button", name="Send batch").click()
    await expect(page.get_by_role("status")).to_contain_text("3 recipients queued")

    queued = page.locator('.filters a[href$="state=queued"] .count')
    for _ in range(90):
        if await queued.inner_text() == "0":
            break
        await asyncio.sleep(0.5)
        await page.reload()
    row = page.locator(f'tbody.log[data-email="{bounce}"]')
    await expect(row.locator('[data-col="state"]')).to_have_text("failed")
    await expect(row.locator('[data-col="event"]')).to_have_text("bounced")
    await expect(row.locator(".reason")).to_be_visible()
    for details in await page.locator("details[data-log]").all():
        await details.locator("summary").click()
    await screenshot(page, "batch-mixed-outcomes")

    await (
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Suppressions").click()
    )
    await expect(page.locator(f'tr[data-email="{bounce}"]')).to_contain_text("SendGrid event")


async def test_the_timeline_shows_a_recipients_path_across_providers(
    page: Page, stack: Stack
) -> None:
    """SendGrid times out and sends nothing: the timeline says so, then that it was confirmed
    not sent (its query API), then Mailgun's attempt and delivery."""
    await log_in(page, stack, "/send")
    tag = _tag()
    ann = f"ann.{tag}@example.com"
    await page.get_by_label("From").fill("Shop <shop@example.com>")
    await page.get_by_label("To", exact=True).fill(ann)
    await page.get_by_label("Subject").fill(f"Across providers {tag}")
    await page.get_by_label("Text body").fill("Hello")
    # Until cleared, not for one call: a send an earlier test left in flight on this shared
    # deployment could take a one-call fault before ann's call does.
    sandbox = httpx.AsyncClient(base_url=stack.sandbox)
    timeout_ms = int(stack.settings.providers.timeout * 1000) + 1500
    fault = {"provider": "sendgrid", "status": 503, "latency_ms": timeout_ms}
    assert (await sandbox.post("/_control/faults", json=fault)).status_code == 201
    row = page.locator(f'tbody.log[data-email="{ann}"]')
    try:
        await page.get_by_role("button", name="Send batch").click()
        await expect(page.get_by_role("status")).to_contain_text("1 recipient queued")
        for _ in range(120):
            if await row.locator('[data-col="event"]').inner_text() == "delivered":
                break
            await asyncio.sleep(0.5)
            await page.reload()
    finally:
        await sandbox.delete("/_control/faults", params={"provider": "sendgrid"})
        await sandbox.aclose()
    await expect(row.locator('[data-col="state"]')).to_have_text("success")
    await row.get_by_text("Timeline of").click()
    steps = row.locator(".timeline li")
    await expect(steps.filter(has_text="Attempt 1: confirmed not sent")).to_contain_text(
        "via SendGrid"
    )
    await expect(steps.filter(has_text="Attempt 2: accepted")).to_contain_text("via Mailgun")
    await expect(steps.filter(has_text="Delivered")).to_contain_text("via Mailgun")
    texts = await steps.all_inner_texts()
    order = [
        next(i for i, t in enumerate(texts) if needle in t)
        for needle in ("Attempt 1: confirmed not sent", "Attempt 2: accepted", "Delivered")
    ]
    assert order == sorted(order), texts
    await screenshot(page, "timeline-across-providers")


async def test_invalid_send_shows_errors_beside_fields(page: Page, stack: Stack) -> None:
    """A send without a subject and with a bad sender is refused with inline field errors."""
    await log_in(page, stack, "/send")
    await page.get_by_label("From").fill("not an address")
    await page.get_by_label("To", exact=True).fill("ann@example.com")
    await page.get_by_label("Text body").fill("Hello")
    await page.get_by_role("button", name="Send batch").click()

    await expect(page.get_by_role("alert")).to_contain_text("The batch was not sent")
    await expect(page.get_by_label("Subject")).to_have_attribute("aria-invalid", "true")
    await expect(page.locator("#subject-errors")).to_contain_text("Subject")
    await expect(page.get_by_label("From")).to_have_attribute("aria-invalid", "true")
    await expect(page.get_by_label("To", exact=True)).to_have_value("ann@example.com")
    await screenshot(page, "send-errors")


async def test_new_key_is_shown_once_and_revoking_it_stops_it(page: Page, stack: Stack) -> None:
    """A key created on /keys is shown once, works on /v1, and gets 401 once revoked."""
    await log_in(page, stack, "/keys")
    name = f"browser {_tag()}"
    await page.get_by_label("Name").fill(name)
    await page.get_by_role("button", name="Create key").click()

    key = await page.get_by_label("Your new API key").input_value()
    assert key.startswith("sd_live_")
    await expect(page.get_by_text("only time the key is shown")).to_be_visible()
    await screenshot(page, "key-created")
    async with httpx.AsyncClient(base_url=stack.api) as api:
        auth = {"Authorization": f"Bearer {key}"}
        assert (await api.get("/v1/batches", headers=auth)).status_code == 200

        await page.get_by_role("link", name="Done — back to API keys").click()
        row = page.locator("tr", has_text=name)
        await expect(row).to_contain_text("active")
        assert key not in await page.content()
        await screenshot(page, "keys")
        page.once("dialog", _accept_dialog)
        await row.get_by_role("button", name=re.compile("^Revoke")).click()

        await expect(page.get_by_role("status")).to_contain_text("revoked")
        await expect(page.locator("tr", has_text=name)).to_contain_text("revoked")
        assert (await api.get("/v1/batches", headers=auth)).status_code == 401
    await screenshot(page, "keys-revoked")


async def test_suppression_can_be_added_and_removed(page: Page, stack: Stack) -> None:
    """An address added on /suppressions is listed, and removing it takes it off the list."""
    await log_in(page, stack, "/suppressions")
    email = f"nobody.{_tag()}@example.com"
    await page.get_by_label("Email").fill(email)
    await page.get_by_label("Reason").fill("asked by phone")
    await page.get_by_role("button", name="Suppress").click()

    row = page.locator(f'tr[data-email="{email}"]')
    await expect(row).to_contain_text("asked by phone")
    await expect(row).to_contain_text("Dashboard")
    await screenshot(page, "suppressions")
    page.once("dialog", _accept_dialog)
    await row.get_by_role("button", name=re.compile("^Remove")).click()

    await expect(page.get_by_role("status")).to_contain_text("removed")
    await expect(page.locator(f'tr[data-email="{email}"]')).to_have_count(0)


async def test_a_domain_is_added_shown_with_its_record_and_verified(
    page: Page, stack: Stack
) -> None:
    """/domains adds a domain with the TXT record to publish; Verify says what is missing
    until the record is there, then marks the domain verified."""
    await log_in(page, stack, "/domains")
    name = f"shop-{_tag()}.example.net"
    await page.get_by_label("Domain", exact=True).fill(name)
    await page.get_by_role("button", name="Add domain").click()
    row = page.locator(f'tr[data-domain="{name}"]')
    await expect(page.get_by_role("status").first).to_contain_text(f"{name} was added")
    await expect(row).to_contain_text("Not verified")
    record_name = await row.locator("dd code").nth(0).inner_text()
    record_value = await row.locator("dd code").nth(1).inner_text()
    assert record_name == f"_safedelivr.{name}"

    await row.get_by_role("button", name=re.compile("^Verify")).click()
    await expect(page.get_by_role("alert")).to_contain_text("no TXT record")
    async with httpx.AsyncClient(base_url=stack.sandbox) as sandbox:
        published = await sandbox.post(
            "/_control/dns", json={"name": record_name, "value": record_value}
        )
        assert published.status_code == 200
    await (
        page.locator(f'tr[data-domain="{name}"]')
        .get_by_role("button", name=re.compile("^Verify"))
        .click()
    )

    await expect(page.get_by_role("status").first).to_contain_text(f"{name} is verified")
    await expect(page.locator(f'tr[data-domain="{name}"]')).to_contain_text("Verified")
    await screenshot(page, "domains")


async def test_logout_ends_the_session(page: Page, stack: Stack) -> None:
    """Log out returns to the login page, and the dashboard asks to log in again."""
    await log_in(page, stack, "/batches")
    await page.get_by_role("button", name="Log out").click()

    await expect(page).to_have_url(re.compile(r"/login$"))
    await page.goto(stack.api + "/keys")
    await expect(page).to_have_url(re.compile(r"/login\?next=%2Fkeys$"))


async def test_unknown_batch_shows_a_not_found_page(page: Page, stack: Stack) -> None:
    """A batch id that is not the user's gets a 404 page inside the dashboard, not JSON."""
    await log_in(page, stack, "/")
    response = await page.goto(f"{stack.api}/batches/{uuid.uuid1()}")

    assert response is not None and response.status == 404
    await expect(page.get_by_role("heading", level=1)).to_have_text("Not found")
    await expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    await screenshot(page, "not-found")


async def test_form_post_without_the_csrf_token_is_refused(page: Page, stack: Stack) -> None:
    """A logged-in browser's POST that lacks the session's CSRF token changes nothing (403)."""
    await log_in(page, stack, "/suppressions")
    email = f"csrf.{_tag()}@example.com"

    resp = await page.request.post(
        stack.api + "/suppressions", form={"email": email, "reason": "forged"}
    )

    assert resp.status == 403
    await page.reload()
    await expect(page.locator(f'tr[data-email="{email}"]')).to_have_count(0)


async def test_cassandra_outage_shows_the_503_page(page: Page, stack: Stack) -> None:
    """With Cassandra unreachable, a page answers 503 with an explanation, not a stack trace."""
    await log_in(page, stack, "/")
    second = api_with_dashboard(stack.settings)
    async with served(second) as url:
        # The session cookie is for 127.0.0.1 (any port): this API instance sees the same
        # logged-in browser, but its Cassandra connection is gone.
        await second.state.resources.db.close()
        response = await page.goto(url + "/batches")

        assert response is not None and response.status == 503
        assert response.headers["retry-after"] == "5"
        await expect(page.get_by_role("heading", level=1)).to_have_text("Temporarily unavailable")
        assert "Traceback" not in await page.content()
        await screenshot(page, "unavailable")
