"""The Operations page in a real browser, as an operator (an account in SAFEDELIVR_OPERATORS):
providers with health and circuit, pausing one (applied and audited), a dead letter
replayed from the page, and the dead letters page paged, filtered by queue and replayed from;
anyone else gets a 404."""

from __future__ import annotations

import dataclasses
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from playwright.async_api import Dialog, Page, expect

from shared.infra.db import Database
from shared.infra.topology import dispatch_key
from shared.ops.deadletters import DeadLetterStore, letter_of
from tests.browser.conftest import OPERATORS, Stack, log_in, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


async def _accept(dialog: Dialog) -> None:
    await dialog.accept()


@pytest.mark.parametrize("github_login", [OPERATORS[0]])
async def test_an_operator_pauses_a_provider_and_sees_it_audited(
    page: Page, stack: Stack, github_login: str
) -> None:
    await log_in(page, stack, "/operations")
    row = page.locator('tr[data-provider="sg"]')
    await expect(row).to_contain_text("SendGrid")
    await expect(row).to_contain_text("closed")
    page.once("dialog", _accept)
    await row.get_by_role("button", name=re.compile("^Pause")).click()

    await expect(page.get_by_role("status")).to_contain_text("Settings changed")
    await expect(row.get_by_role("button", name=re.compile("^Resume"))).to_be_visible()
    await expect(page.locator("ul.changes")).to_contain_text("providers.sg.paused")
    await screenshot(page, "operations")
    await row.get_by_role("button", name=re.compile("^Resume")).click()
    await expect(row.get_by_role("button", name=re.compile("^Pause"))).to_be_visible()


@pytest.mark.parametrize("github_login", [OPERATORS[0]])
async def test_an_operator_turns_on_domain_capacity_and_alert_mail(
    page: Page, stack: Stack, github_login: str
) -> None:
    await log_in(page, stack, "/operations")
    await page.get_by_label("Capacity per sending domain").select_option("true")
    await page.get_by_label("Initial recipients a day (new domain)").fill("5000")
    await page.get_by_label("Mail alerts to (operators, comma-separated)").fill(
        "oncall@example.org"
    )
    await page.get_by_label("Alert mail from").fill("Alerts <alerts@example.org>")
    await page.get_by_role("button", name="Save settings").click()

    await expect(page.get_by_role("status")).to_contain_text("Settings changed")
    changes = page.locator("ul.changes")
    for name in ("capacity.enabled", "capacity.initial", "alerts.email_to", "alerts.email_from"):
        await expect(changes).to_contain_text(name)
    await expect(page.get_by_label("Initial recipients a day (new domain)")).to_have_value("5000")
    # The browser tests share one deployment: leave its settings as they were.
    await page.get_by_label("Capacity per sending domain").select_option("false")
    await page.get_by_label("Mail alerts to (operators, comma-separated)").fill("")
    await page.get_by_label("Alert mail from").fill("")
    await page.get_by_role("button", name="Save settings").click()
    await expect(page.get_by_label("Capacity per sending domain")).to_have_value("false")


@pytest.mark.parametrize("github_login", [OPERATORS[1]])
async def test_an_operator_replays_a_dead_letter_once(
    page: Page, stack: Stack, github_login: str
) -> None:
    """The stack's keyspace is its own: the letter is archived there, as its consumers do."""
    db = await Database.connect(
        stack.settings.cassandra, keyspace=stack.settings.cassandra.keyspace
    )
    try:
        letter = letter_of(dispatch_key("sg", uuid.uuid1()), None, {}, b"{}", datetime.now(UTC))
        await DeadLetterStore(db).archive(letter)
    finally:
        await db.close()
    await log_in(page, stack, "/operations")
    row = page.locator(f'tr[data-letter="{letter.id}"]')
    await row.get_by_role("button", name="Replay").click()

    await expect(page.get_by_role("status")).to_contain_text("published again")
    await expect(page.locator(f'tr[data-letter="{letter.id}"]')).to_contain_text("replayed")
    await expect(
        page.locator(f'tr[data-letter="{letter.id}"]').get_by_role("button", name="Replay")
    ).to_have_count(0)


async def test_the_operations_page_does_not_exist_for_other_users(page: Page, stack: Stack) -> None:
    await log_in(page, stack, "/")
    response = await page.goto(f"{stack.api}/operations")
    letters = await page.goto(f"{stack.api}/operations/dead-letters")

    assert response is not None and response.status == 404
    assert letters is not None and letters.status == 404
    await expect(page.get_by_role("link", name="Operations")).to_have_count(0)


@pytest.mark.parametrize("github_login", [OPERATORS[1]])
async def test_saving_the_settings_form_audits_only_what_changed(
    page: Page, stack: Stack, github_login: str
) -> None:
    await log_in(page, stack, "/operations")
    await page.get_by_label("Probe an open circuit after (s)").fill("45")
    await page.get_by_role("button", name="Save settings").click()

    await expect(page.get_by_role("status")).to_contain_text("Settings changed")
    latest = page.locator("ul.changes li").first
    await expect(latest).to_contain_text("providers.health.cool_down")
    await expect(page.locator("ul.changes")).not_to_contain_text("providers.health.probe_share")
    await page.get_by_label("Probe an open circuit after (s)").fill("30")
    await page.get_by_role("button", name="Save settings").click()
    await expect(page.get_by_label("Probe an open circuit after (s)")).to_have_value("30")


@pytest.mark.parametrize("github_login", [OPERATORS[2]])
async def test_an_operator_pages_and_replays_dead_letters(
    page: Page, stack: Stack, github_login: str
) -> None:
    """The dead letters page goes from the newest letter to older ones, narrows to one
    queue from a letter's row, and replays one there, coming back to the same filter."""
    queue = f"q.dash-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    # A millisecond apart, newest first: letters of one millisecond order by their digests,
    # which would leave where letters[0] falls (first page or second) to chance.
    letters = [
        dataclasses.replace(
            letter_of(
                dispatch_key("sg", uuid.uuid1()), None, {}, b"{}", now - timedelta(milliseconds=n)
            ),
            queue=queue if n % 10 == 0 else "q.other",
        )
        for n in range(30)
    ]
    db = await Database.connect(
        stack.settings.cassandra, keyspace=stack.settings.cassandra.keyspace
    )
    try:
        for x in letters:
            await DeadLetterStore(db).archive(x)
    finally:
        await db.close()
    await log_in(page, stack, "/operations")
    await page.get_by_role("link", name=re.compile("^Every dead letter")).click()
    await expect(page.locator("tr[data-letter]")).to_have_count(25)
    await page.get_by_role("link", name="Older →").click()
    await expect(page.locator("tr[data-letter]").first).to_be_visible()
    await page.get_by_role("link", name="← Newest").click()

    await page.locator(f'tr[data-letter="{letters[0].id}"]').get_by_role("link", name=queue).click()
    await expect(page.locator("tr[data-letter]")).to_have_count(3)
    await screenshot(page, "dead-letters")
    row = page.locator(f'tr[data-letter="{letters[10].id}"]')
    await row.get_by_role("button", name=re.compile("^Replay")).click()

    await expect(page.get_by_role("status").first).to_contain_text("published again")
    await expect(page.locator("#queue-filter")).to_contain_text(queue)
    await expect(row.locator('[data-col="state"]')).to_have_text("replayed")
    await expect(page.locator("tr[data-letter]")).to_have_count(3)
