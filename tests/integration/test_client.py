"""The typed client and the sender commands against a served API (real Cassandra and
RabbitMQ, uvicorn on a local port)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from safedelivr_client import ApiError, AsyncClient, Client

from services import cli
from shared.accounts import accounts
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.conftest import app_for
from tests.integration.harness import eventually, served

#: The sender commands configure logging as their process would.
pytestmark = pytest.mark.usefixtures("restored_logging")


@dataclass
class Served:
    url: str
    key: str


@pytest.fixture(scope="module")
async def url(module_settings: Settings) -> AsyncIterator[str]:
    """One API served for the module (tests never share data: each makes its own user)."""
    async with app_for(module_settings) as app, served(app, lifespan=False) as base:
        yield base


@pytest.fixture
async def api(url: str, db: Database) -> Served:
    key = await accounts.create_key(db, await accounts.ensure_user(db, unique("cl")), "c")
    return Served(url, key)


async def test_send_then_read_the_batch_and_its_logs(api: Served) -> None:
    async with AsyncClient(api.url, api.key) as sd:
        accepted = await sd.send(
            "Shop <shop@example.com>",
            ["ann@example.com", {"email": "bob@example.com", "name": "Bob"}, "nope"],
            "Hi",
            text="Hello",
        )
        view = await sd.batch(accepted["batch_id"])
        emails = {e["email"] async for e in sd.iter_logs(accepted["batch_id"])}
        listed = [b["batch_id"] async for b in sd.iter_batches()]

    assert accepted["accepted"] == 2
    assert accepted["rejected"][0]["email"] == "nope"
    assert view["recipients"] == 2
    assert emails == {"ann@example.com", "bob@example.com"}
    assert listed == [accepted["batch_id"]]


async def test_the_same_idempotency_key_gets_the_same_batch(api: Served) -> None:
    async with AsyncClient(api.url, api.key) as sd:
        first = await sd.send(
            "s@example.com", "a@example.com", "Hi", text="t", idempotency_key="k1"
        )
        again = await sd.send(
            "s@example.com", "a@example.com", "Hi", text="t", idempotency_key="k1"
        )

    assert again == first


async def test_an_invalid_batch_raises_with_the_fields(api: Served) -> None:
    async with AsyncClient(api.url, api.key) as sd:
        with pytest.raises(ApiError) as caught:
            await sd.send("not an address", "a@example.com", "Hi", text="t")

    assert caught.value.status == 422
    assert "from" in caught.value.fields


async def test_suppressions_and_keys_round_trip(api: Served) -> None:
    def run() -> tuple[list[str], list[str], str]:
        with Client(api.url, api.key) as sd:
            sd.suppress("Gone@Example.com", reason="left")
            listed = [s["email"] for s in sd.suppressions()["data"]]
            sd.unsuppress("gone@example.com")
            after = [s["email"] for s in sd.suppressions()["data"]]
            made = sd.create_key("second")
            return listed, after, made["key"]

    listed, after, made = await asyncio.to_thread(run)

    assert listed == ["gone@example.com"]
    assert after == []
    assert made.startswith("sd_live_")


async def test_a_csv_file_is_imported_into_a_list_with_either_client(api: Served) -> None:
    """The async client sends bytes, the sync one a str; both follow the import to its end."""
    async with AsyncClient(api.url, api.key) as sd:
        made = await sd.create_list("Clients")
        started = await sd.import_contacts(made["id"], b"email,name\nann@example.com,Ann\n")

        async def ended() -> dict[str, Any] | None:
            job = await sd.list_import(made["id"], started["import_id"])
            return job if job["state"] in ("done", "failed") else None

        job = await eventually(ended)

    def run() -> tuple[dict[str, Any], list[str], int]:
        with Client(api.url, api.key) as sd:
            again = sd.import_contacts(made["id"], "email\nbob@example.com\nnope\n")
            while (done := sd.list_import(made["id"], again["import_id"]))["state"] in (
                "queued",
                "running",
            ):
                time.sleep(0.1)
            sd.remove_list_contact(made["id"], "ann@example.com")
            emails = [c["email"] for c in sd.list_contacts(made["id"])["data"]]
            return done, emails, sd.get_list(made["id"])["contacts"]

    done, emails, count = await asyncio.to_thread(run)

    assert job["state"] == "done" and job["progress"]["added"] == 1
    assert done["progress"] == done["progress"] | {"added": 1, "invalid": 1}
    assert (emails, count) == (["bob@example.com"], 1)


async def test_the_send_command_reads_the_html_from_a_file(api: Served, tmp_path: Path) -> None:
    html = tmp_path / "mail.html"
    html.write_text("<p>Hello from a file</p>")
    argv = [
        "send",
        "--api-url",
        api.url,
        "--key",
        api.key,
        "--from",
        "shop@example.com",
        "--to",
        "ann@example.com",
        "--to",
        "bob@example.com",
        "--subject",
        "Hi",
        "--html",
        f"@{html}",
        "--json",
    ]

    code = await asyncio.to_thread(cli.main, argv)

    assert code == 0
    async with AsyncClient(api.url, api.key) as sd:
        [batch] = [b async for b in sd.iter_batches()]
    assert batch["recipients"] == 2


async def test_the_batches_logs_and_stats_commands_print_what_the_api_says(
    api: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    async with AsyncClient(api.url, api.key) as sd:
        accepted = await sd.send("s@example.com", "ann@example.com", "Hi", text="t")
    connection = ["--api-url", api.url, "--key", api.key]

    for argv in (["batches", *connection], ["logs", accepted["batch_id"], *connection]):
        assert await asyncio.to_thread(cli.main, argv) == 0
    assert await asyncio.to_thread(cli.main, ["stats", *connection, "--json"]) == 0

    out = capsys.readouterr().out
    assert accepted["batch_id"] in out
    assert "ann@example.com" in out
    days = json.loads(out[out.index("[") :])
    assert len(days) == 7 and days[-1]["queued"] >= 1


async def test_a_template_is_made_versioned_published_and_previewed_by_either_client(
    api: Served,
) -> None:
    """The sync client makes and publishes; the async one canaries and previews."""

    def run() -> tuple[str, dict[str, object]]:
        with Client(api.url, api.key) as sd:
            made = sd.create_template("hello", "Hi {{ n }}", text="t", sample={"n": "A"})
            sd.add_template_version(made["id"], "Hello {{ n }}", html="<p>{{ n }}</p>")
            published = sd.publish_template(made["id"], 1)
            return made["id"], published

    template_id, published = await asyncio.to_thread(run)
    async with AsyncClient(api.url, api.key) as sd:
        with pytest.raises(ApiError) as refused:  # version 2's sample lacks n
            await sd.publish_template(template_id, 2, canary_percent=10)
        second = await sd.add_template_version(
            template_id, "Hello {{ n }}", html="<p>{{ n }}</p>", sample={"n": "B"}
        )
        canary = await sd.publish_template(template_id, second["version"], canary_percent=10)
        preview = await sd.preview_template(template_id, {"n": "Cy"}, version=second["version"])
        listed = await sd.templates()
        shown = await sd.template(template_id)

    assert published["live_version"] == 1
    assert (refused.value.status, refused.value.code) == (422, "template_does_not_render")
    assert canary["canary"]["version"] == second["version"] == 3
    assert (preview["subject"], preview["html"], preview["text"]) == ("Hello Cy", "<p>Cy</p>", "Cy")
    assert [t["id"] for t in listed] == [template_id]
    assert [v["version"] for v in shown["versions"]] == [3, 2, 1]
