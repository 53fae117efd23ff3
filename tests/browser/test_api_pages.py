"""The dashboard pages for what the API does besides sending, in a real browser: webhooks
(added, rotated, a delivery replayed), preferences (a cooldown applied to the next send),
lists (a CSV file imported with its progress shown), a scheduled batch cancelled, a campaign
draft created and a template version previewed and published, each page driven as a user
clicks it (full-page screenshots land in tests/artifacts/screenshots/)."""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Dialog, Page, expect

from tests.browser.conftest import Stack, log_in, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


async def _accept(dialog: Dialog) -> None:
    await dialog.accept()


async def _send(page: Page, stack: Stack, to: str, subject: str) -> None:
    await page.goto(stack.api + "/send")
    await page.get_by_label("From").fill("Shop <shop@example.com>")
    await page.get_by_label("To", exact=True).fill(to)
    await page.get_by_label("Subject").fill(subject)
    await page.get_by_label("Text body").fill("Hello from the dashboard")
    await page.get_by_role("button", name="Send batch").click()
    await expect(page.get_by_role("status")).to_contain_text("1 recipient queued")


async def _through_the_api(
    page: Page, stack: Stack, key_name: str, path: str, body: dict[str, object]
) -> httpx.Response:
    """Log in, make a key named ``key_name`` on the Keys page and POST ``body`` to ``path``
    of the API with it (what a page lists was made the way a client makes it)."""
    await log_in(page, stack, "/keys")
    await page.get_by_label("Name", exact=True).fill(key_name)
    await page.get_by_role("button", name="Create key").click()
    key = await page.get_by_role("textbox", name="Your new API key").input_value()
    async with httpx.AsyncClient(base_url=stack.api) as api:
        return await api.post(path, json=body, headers={"Authorization": f"Bearer {key}"})


async def test_a_webhook_is_created_rotated_and_a_delivery_replayed(
    page: Page, stack: Stack
) -> None:
    """An endpoint added on the page gets the batch's delivered event (in its log, status
    200), a rotation shows a new secret once, and Replay delivers the message again."""
    tag = uuid.uuid4().hex[:8]
    path = f"/hooks-{tag}"
    await log_in(page, stack, "/webhooks")
    await page.get_by_label("Endpoint URL").fill(f"{stack.sandbox}/_receiver{path}")
    await page.get_by_label("recipient.delivered").check()
    await page.get_by_role("button", name="Add endpoint").click()
    first = await page.get_by_role("textbox", name="Signing secret").input_value()
    assert first.startswith("whsec_")
    await screenshot(page, "webhook-created")
    await page.get_by_role("link", name="Done — to the endpoint").click()
    endpoint_url = page.url

    await _send(page, stack, f"ann.{tag}@example.com", f"Hooked {tag}")
    await page.goto(endpoint_url)
    line = page.locator("tr[data-msg]")
    for _ in range(60):
        if await line.count():
            break
        await asyncio.sleep(0.5)
        await page.reload()
    await expect(line.first.locator('[data-col="status"]')).to_contain_text("200")
    await expect(line.first).to_contain_text("recipient.delivered")
    await screenshot(page, "webhook")

    page.once("dialog", _accept)
    await page.get_by_role("button", name="Rotate secret").click()
    second = await page.get_by_role("textbox", name="Signing secret").input_value()
    assert second.startswith("whsec_") and second != first
    await expect(page.get_by_role("status").first).to_contain_text("previous secret signs")
    await page.get_by_role("link", name="Done — to the endpoint").click()

    await page.get_by_role("button", name=re.compile("^Replay")).first.click()
    await expect(page.get_by_role("status").first).to_contain_text("queued to be delivered")
    async with httpx.AsyncClient(base_url=stack.sandbox) as control:
        for _ in range(60):
            got = (await control.get("/_control/received", params={"path": path})).json()
            if len(got) >= 2:
                break
            await asyncio.sleep(0.5)
    ids = {r["headers"]["webhook-id"] for r in got}
    assert len(got) == 2 and len(ids) == 1


async def test_preferences_saved_apply_to_the_next_send(page: Page, stack: Stack) -> None:
    """A cooldown saved on the Preferences page keeps the next batch from mailing an address
    the previous one just did, and the form shows what was saved."""
    tag = uuid.uuid4().hex[:8]
    await log_in(page, stack, "/preferences")
    await page.get_by_label("Least seconds between two mails to one address").fill("3600")
    await page.get_by_label("Track clicks").check()
    await page.get_by_role("button", name="Save preferences").click()
    await expect(page.get_by_role("status")).to_contain_text("Preferences saved")
    await expect(page.get_by_label("Track clicks")).to_be_checked()
    await expect(page.get_by_label("Track opens")).not_to_be_checked()
    await screenshot(page, "preferences")

    await _send(page, stack, f"ann.{tag}@example.com", f"First {tag}")
    await page.goto(stack.api + "/send")
    await page.get_by_label("From").fill("Shop <shop@example.com>")
    await page.get_by_label("To", exact=True).fill(f"ann.{tag}@example.com, bob.{tag}@example.com")
    await page.get_by_label("Subject").fill(f"Second {tag}")
    await page.get_by_label("Text body").fill("Again")
    await page.get_by_role("button", name="Send batch").click()

    await expect(page.get_by_role("status")).to_contain_text(
        "1 recipient queued; 1 skipped (mailed within your cooldown)"
    )


async def test_a_csv_import_shows_progress_and_its_contacts(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    """A list made on the page takes a CSV file chosen in the file picker: the upload goes by
    fetch, the <progress> fills as the import is followed, and the contacts are listed."""
    csv = tmp_path / "readers.csv"
    rows = [f"reader{i:03}@example.com,Reader {i}" for i in range(120)]
    csv.write_text("email,name\n" + "\n".join(rows) + "\n")
    await log_in(page, stack, "/lists")
    await page.get_by_label("Name").fill("Readers")
    await page.get_by_role("button", name="Create list").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Readers")

    await page.get_by_label("CSV file", exact=True).set_input_files(csv)
    await page.get_by_role("button", name="Import").click()

    status = page.locator("#import-status")
    await expect(status).to_contain_text("Import done: 120 rows read: 120 added", timeout=60_000)
    assert await page.locator("#import-progress").evaluate(
        "p => !p.hidden && p.max === 120 && p.value === 120"
    )
    await screenshot(page, "list-imported")
    await status.get_by_role("link", name="Show the contacts").click()
    await expect(page.locator("tr[data-contact]")).to_have_count(50)
    # Pages follow the list's storage order, not the file's.
    await expect(page.locator("tr[data-contact]").first).to_contain_text(re.compile(r"Reader \d+"))
    await page.get_by_role("link", name="Next page →").click()
    await expect(page.locator("tr[data-contact]")).to_have_count(50)
    await screenshot(page, "list")


async def test_a_scheduled_batch_is_cancelled_from_its_page(page: Page, stack: Stack) -> None:
    """A batch scheduled through the API with a key made on the Keys page is cancelled by
    its page's button, and stays cancelled."""
    tag = uuid.uuid4().hex[:8]
    made = await _through_the_api(
        page,
        stack,
        f"scheduler {tag}",
        "/v1/batches",
        {
            "from": "shop@example.com",
            "to": [f"ann.{tag}@example.com"],
            "subject": f"Tomorrow {tag}",
            "text": "Later",
            "send_at": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
        },
    )
    assert made.status_code == 202, made.text
    await page.goto(f"{stack.api}/batches/{made.json()['batch_id']}")
    await expect(page.locator("#batch-summary")).to_contain_text("scheduled")

    page.once("dialog", _accept)
    await page.get_by_role("button", name="Cancel batch").click()

    await expect(page.get_by_role("status").first).to_contain_text("The batch was cancelled")
    await expect(page.locator("#batch-summary")).to_contain_text("cancelled")
    await expect(page.get_by_role("button", name="Cancel batch")).to_have_count(0)
    await screenshot(page, "batch-cancelled")


async def test_a_campaign_draft_is_created_from_the_form(page: Page, stack: Stack) -> None:
    """With a template (made through the API) and a list (made on the page), the Campaigns
    form creates a draft, listed with its template and list by name."""
    tag = uuid.uuid4().hex[:8]
    made = await _through_the_api(
        page,
        stack,
        f"templates {tag}",
        "/v1/templates",
        {"name": f"Winter {tag}", "subject": "Hi {{ name }}", "text": "Hello"},
    )
    assert made.status_code == 201, made.text
    await page.goto(stack.api + "/lists")
    await page.get_by_label("Name").fill(f"Readers {tag}")
    await page.get_by_role("button", name="Create list").click()

    await page.goto(stack.api + "/campaigns")
    await page.get_by_label("Name").fill(f"Winter sale {tag}")
    await page.get_by_label("From").fill("News <news@example.com>")
    await page.get_by_label("Template").select_option(label=f"Winter {tag}")
    await page.get_by_label("Contact list").select_option(label=f"Readers {tag}")
    await page.get_by_role("button", name="Create draft").click()

    await expect(page.get_by_role("status").first).to_contain_text(
        f"“Winter sale {tag}” is created as a draft"
    )
    row = page.locator("tr[data-campaign]", has_text=f"Winter sale {tag}")
    await expect(row).to_contain_text(f"Winter {tag} → Readers {tag}")
    await screenshot(page, "campaign-created")


async def test_a_template_version_is_previewed_and_published(page: Page, stack: Stack) -> None:
    """A version added on the Templates page is previewed with its sample data, then
    published: it is the live one."""
    tag = uuid.uuid4().hex[:8]
    made = await _through_the_api(
        page,
        stack,
        f"templates {tag}",
        "/v1/templates",
        {"name": f"Welcome {tag}", "subject": "Hi", "text": "Hello"},
    )
    assert made.status_code == 201, made.text
    await page.goto(stack.api + "/templates")
    panel = page.locator(f'section[data-template="{made.json()["id"]}"]')
    await panel.get_by_text("Add a version").click()
    await panel.get_by_label("Subject").fill("Welcome, {{ first_name }}")
    await panel.get_by_label("HTML").fill("<p>Hello {{ first_name }}</p>")
    await panel.get_by_label("Sample data (JSON)").fill('{"first_name": "Ann"}')
    await panel.get_by_role("button", name="Add version").click()
    await expect(page.get_by_role("status").first).to_contain_text("Version 2 was added")

    await panel.get_by_role("link", name="Preview version 2").click()
    await expect(page.locator("#preview-subject")).to_have_text("Welcome, Ann")
    frame = page.frame_locator("iframe.preview")
    await expect(frame.locator("p")).to_have_text("Hello Ann")
    await screenshot(page, "template-preview")
    await page.go_back()
    await panel.get_by_role("button", name="Publish version 2").click()

    await expect(page.get_by_role("status").first).to_contain_text("Version 2 is published.")
    await expect(panel.locator('tr[data-version="2"]')).to_have_attribute("data-state", "live")
