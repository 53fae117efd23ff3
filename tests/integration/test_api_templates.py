"""``/v1/templates`` through the real API app, Cassandra and RabbitMQ: versions are numbered
and immutable, publishing moves the live version or starts a canary beside it (refused for a
version that does not render with its sample), preview renders, another user's template
does not exist, and a canary's audited verdict is read with the template."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from services.api.session_store import SESSION_COOKIE, SessionStore
from shared.accounts import accounts
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.templates.canary import Counts
from shared.templates.canary_store import CanaryStore, Outcome, Rollout
from tests.conftest import unique


@pytest.fixture(scope="module")
def settings(module_settings: Settings) -> Settings:
    """One stack for the module (``tests/integration/conftest.py``)."""
    return module_settings


@pytest.fixture
def api(module_api: httpx.AsyncClient) -> httpx.AsyncClient:
    return module_api


WELCOME = {
    "name": "welcome",
    "subject": "Welcome, {{ first_name }}",
    "html": "<p>Hello <b>{{ first_name }}</b></p>",
    "sample": {"first_name": "Ann"},
}


async def new_key(db: Database, *scopes: str) -> dict[str, str]:
    user = await accounts.ensure_user(db, unique("tpl"))
    key = await accounts.create_key(db, user, "k", scopes=scopes or ("send", "read"))
    return {"Authorization": f"Bearer {key}"}


async def created(api: httpx.AsyncClient, auth: dict[str, str], **changes: object) -> str:
    resp = await api.post("/v1/templates", json={**WELCOME, **changes}, headers=auth)
    assert resp.status_code == 201, resp.text
    template_id: str = resp.json()["id"]
    return template_id


async def new_version(
    api: httpx.AsyncClient, auth: dict[str, str], template_id: str, **fields: object
) -> int:
    body = {"subject": "v", "text": "plain", **fields}
    resp = await api.post(f"/v1/templates/{template_id}/versions", json=body, headers=auth)
    assert resp.status_code == 201, resp.text
    number: int = resp.json()["version"]
    return number


async def publish(
    api: httpx.AsyncClient, auth: dict[str, str], template_id: str, **body: object
) -> httpx.Response:
    return await api.post(f"/v1/templates/{template_id}/publish", json=body, headers=auth)


async def test_a_new_template_is_version_1_and_not_yet_live(
    api: httpx.AsyncClient, db: Database
) -> None:
    """Creating answers 201 with version 1; nothing is live until it is published."""
    auth = await new_key(db)

    resp = await api.post("/v1/templates", json=WELCOME, headers=auth)

    assert resp.status_code == 201
    answer = resp.json()
    assert (answer["name"], answer["version"], answer["live_version"]) == ("welcome", 1, None)
    assert answer["canary"] is None
    shown = (await api.get(f"/v1/templates/{answer['id']}", headers=auth)).json()
    assert [(v["version"], v["subject"], v["live"]) for v in shown["versions"]] == [
        (1, "Welcome, {{ first_name }}", False)
    ]


async def test_new_versions_are_numbered_in_turn_and_listed_newest_first(
    api: httpx.AsyncClient, db: Database
) -> None:
    """Each new version takes the next number; the template lists them newest first."""
    auth = await new_key(db)
    template_id = await created(api, auth)

    numbers = [await new_version(api, auth, template_id, subject=f"s{i}") for i in range(2)]

    assert numbers == [2, 3]
    shown = (await api.get(f"/v1/templates/{template_id}", headers=auth)).json()
    assert [(v["version"], v["subject"]) for v in shown["versions"]] == [
        (3, "s1"),
        (2, "s0"),
        (1, "Welcome, {{ first_name }}"),
    ]


async def test_publishing_makes_a_version_live_and_an_older_one_rolls_back(
    api: httpx.AsyncClient, db: Database
) -> None:
    """Publishing version 2 makes it live; publishing version 1 again rolls back to it."""
    auth = await new_key(db)
    template_id = await created(api, auth)
    second = await new_version(
        api, auth, template_id, text="second {{ first_name }}", sample={"first_name": "Bo"}
    )

    forward = await publish(api, auth, template_id, version=second)
    back = await publish(api, auth, template_id, version=1)

    assert (forward.status_code, forward.json()["live_version"]) == (200, 2)
    assert (back.status_code, back.json()["live_version"]) == (200, 1)
    shown = (await api.get(f"/v1/templates/{template_id}", headers=auth)).json()
    assert shown["live_version"] == 1
    assert {v["version"]: v["live"] for v in shown["versions"]} == {2: False, 1: True}


async def test_a_canary_runs_beside_the_live_version_until_a_version_is_published(
    api: httpx.AsyncClient, db: Database
) -> None:
    """A canary keeps the live version and names its own with its share and start; publishing
    without a share ends it."""
    auth = await new_key(db)
    template_id = await created(api, auth)
    second = await new_version(api, auth, template_id)
    await publish(api, auth, template_id, version=1)

    canary = await publish(api, auth, template_id, version=second, canary_percent=10)
    during = (await api.get(f"/v1/templates/{template_id}", headers=auth)).json()
    promoted = await publish(api, auth, template_id, version=second)

    assert canary.status_code == 200
    assert canary.json()["live_version"] == 1
    assert canary.json()["canary"]["version"] == 2
    assert canary.json()["canary"]["percent"] == 10
    assert canary.json()["canary"]["since"]
    assert {v["version"]: (v["live"], v["canary"]) for v in during["versions"]} == {
        2: (False, True),
        1: (True, False),
    }
    listed = (await api.get("/v1/templates", headers=auth)).json()["data"]
    assert (promoted.json()["live_version"], promoted.json()["canary"]) == (2, None)
    assert [(t["id"], t["live_version"], t["canary"]) for t in listed] == [(template_id, 2, None)]


async def test_a_canary_needs_a_live_version_to_compare_with(
    api: httpx.AsyncClient, db: Database
) -> None:
    """A canary of a template with nothing live is refused, and nothing changes."""
    auth = await new_key(db)
    template_id = await created(api, auth)

    resp = await publish(api, auth, template_id, version=1, canary_percent=5)

    assert (resp.status_code, resp.json()["error"]["code"]) == (422, "cannot_publish")
    shown = (await api.get(f"/v1/templates/{template_id}", headers=auth)).json()
    assert (shown["live_version"], shown["canary"]) == (None, None)


async def test_a_version_that_does_not_render_with_its_sample_cannot_be_published(
    api: httpx.AsyncClient, db: Database
) -> None:
    """A 422 names each part that does not render, with its error and line; the live
    version stays."""
    auth = await new_key(db)
    template_id = await created(api, auth)
    await publish(api, auth, template_id, version=1)
    broken = await new_version(
        api, auth, template_id, subject="Hi {{ nickname }}", html="<p>\n{% if %}</p>", text=None
    )

    resp = await publish(api, auth, template_id, version=broken)

    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["code"] == "template_does_not_render"
    assert "nickname" in error["fields"]["subject"]
    assert "line 2" in error["fields"]["html"]
    assert f"version {broken}" in error["message"]
    shown = (await api.get(f"/v1/templates/{template_id}", headers=auth)).json()
    assert shown["live_version"] == 1


async def test_publishing_a_version_the_template_lacks_is_a_422_naming_version(
    api: httpx.AsyncClient, db: Database
) -> None:
    """An unknown version number is a field error of the body, not a missing template."""
    auth = await new_key(db)
    template_id = await created(api, auth)

    resp = await publish(api, auth, template_id, version=7)

    assert resp.status_code == 422
    assert "no version 7" in resp.json()["error"]["fields"]["version"]


async def test_a_preview_renders_the_live_version_with_the_data(
    api: httpx.AsyncClient, db: Database
) -> None:
    """The live version, html autoescaped, the text derived from the html."""
    auth = await new_key(db)
    template_id = await created(api, auth)
    await publish(api, auth, template_id, version=1)

    resp = await api.post(
        f"/v1/templates/{template_id}/preview",
        json={"data": {"first_name": "Bo & <Co>"}},
        headers=auth,
    )

    assert resp.status_code == 200
    assert resp.json() == {
        "version": 1,
        "subject": "Welcome, Bo & <Co>",
        "html": "<p>Hello <b>Bo &amp; &lt;Co&gt;</b></p>",
        "text": "Hello Bo & <Co>",
    }


async def test_a_preview_of_a_named_version_defaults_to_its_sample(
    api: httpx.AsyncClient, db: Database
) -> None:
    """A version named in the body renders even if not live, with its sample by default."""
    auth = await new_key(db)
    template_id = await created(api, auth)
    second = await new_version(
        api, auth, template_id, subject="Again {{ who }}", sample={"who": "Cy"}
    )

    resp = await api.post(
        f"/v1/templates/{template_id}/preview", json={"version": second}, headers=auth
    )

    assert resp.status_code == 200
    assert (resp.json()["subject"], resp.json()["text"]) == ("Again Cy", "plain")


async def test_a_preview_that_does_not_render_is_a_422_naming_the_error(
    api: httpx.AsyncClient, db: Database
) -> None:
    """Data lacking a name the template uses is a 422 naming it, per part."""
    auth = await new_key(db)
    template_id = await created(api, auth)
    await publish(api, auth, template_id, version=1)

    resp = await api.post(
        f"/v1/templates/{template_id}/preview", json={"data": {"nobody": 1}}, headers=auth
    )

    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "template_does_not_render"
    assert "first_name" in resp.json()["error"]["fields"]["subject"]


async def test_a_preview_with_nothing_live_and_no_version_is_a_422(
    api: httpx.AsyncClient, db: Database
) -> None:
    """With nothing live, a preview must name its version."""
    auth = await new_key(db)
    template_id = await created(api, auth)

    resp = await api.post(f"/v1/templates/{template_id}/preview", json={}, headers=auth)

    assert (resp.status_code, resp.json()["error"]["code"]) == (422, "no_live_version")


async def test_another_users_template_does_not_exist_for_me(
    api: httpx.AsyncClient, db: Database
) -> None:
    """Reading, versioning, publishing or previewing someone else's template is a 404, and
    my list does not show it."""
    theirs = await created(api, await new_key(db))
    mine = await new_key(db)

    answers = [
        await api.get(f"/v1/templates/{theirs}", headers=mine),
        await api.post(
            f"/v1/templates/{theirs}/versions", json={"subject": "s", "text": "t"}, headers=mine
        ),
        await publish(api, mine, theirs, version=1),
        await api.post(f"/v1/templates/{theirs}/preview", json={"version": 1}, headers=mine),
    ]

    assert [r.status_code for r in answers] == [404, 404, 404, 404]
    assert (await api.get("/v1/templates", headers=mine)).json() == {"data": []}


@pytest.mark.parametrize(
    "raw_id",
    [
        "nope",
        "9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f",
        "6c1f0a2e-cb0b-11f0-8000-0242ac120002",
        "00000000-0000-0000-0000-000000000000",
    ],
)
async def test_an_id_that_is_no_template_of_mine_is_a_404(
    api: httpx.AsyncClient, db: Database, raw_id: str
) -> None:
    """Malformed ids, ids of another kind and unknown ids alike."""
    auth = await new_key(db)

    resp = await api.get(f"/v1/templates/{raw_id}", headers=auth)
    published = await publish(api, auth, raw_id, version=1)

    assert (resp.status_code, resp.json()["error"]["code"]) == (404, "not_found")
    assert published.status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "n", "subject": "s"}, "body"),
        ({"name": "", "subject": "s", "text": "t"}, "name"),
        ({"name": "n" * 201, "subject": "s", "text": "t"}, "name"),
        ({"name": "n", "subject": "s", "html": "x" * 500_001}, "html"),
        ({"name": "n", "subject": "s", "text": "t", "sample": [1]}, "sample"),
        ({"name": "n", "subject": 1, "text": "t"}, "subject"),
        ({"name": "n", "subject": "s", "text": "t", "extra": 1}, "extra"),
        (["not", "an", "object"], "body"),
    ],
)
async def test_a_malformed_template_is_a_422_naming_the_field(
    api: httpx.AsyncClient, db: Database, body: object, field: str
) -> None:
    """Missing parts, sizes past the limits, wrong types and extra fields are named."""
    auth = await new_key(db)

    resp = await api.post("/v1/templates", json=body, headers=auth)

    assert resp.status_code == 422
    assert field in resp.json()["error"]["fields"]


async def test_a_sample_nested_past_what_can_be_stored_is_a_422(
    api: httpx.AsyncClient, db: Database
) -> None:
    """A sample that JSON parses but cannot store is refused, not a 500."""
    auth = await new_key(db)
    deep = "[" * 300 + "]" * 300
    raw = f'{{"name": "n", "subject": "s", "text": "t", "sample": {{"a": {deep}}}}}'

    resp = await api.post(
        "/v1/templates", content=raw, headers={**auth, "Content-Type": "application/json"}
    )

    assert resp.status_code == 422
    assert "nested" in resp.json()["error"]["fields"]["sample"]


@pytest.mark.parametrize(
    "body",
    [
        {"version": 0},
        {"version": 2**31},
        {"version": "1"},
        {"version": True},
        {"version": 1, "canary_percent": 0},
        {"version": 1, "canary_percent": 100},
        {"version": 1, "canary_percent": "5"},
        {},
    ],
)
async def test_a_malformed_publish_is_a_422(
    api: httpx.AsyncClient, db: Database, body: dict[str, object]
) -> None:
    """Version numbers out of range or mistyped, and shares outside (0, 100), are 422."""
    auth = await new_key(db)
    template_id = await created(api, auth)

    resp = await publish(api, auth, template_id, **body)

    assert resp.status_code == 422


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{% for i in range(10**9) %}x{% endfor %}",
        "{{ first_name.upper.__globals__ }}",
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
        "{% for i in range(9999) %}{% for j in range(9999) %}{% endfor %}{% endfor %}",
        "{{ first_name | center(10**10) }}",
    ],
)
async def test_a_hostile_template_is_refused_at_publish_not_run(
    api: httpx.AsyncClient, db: Database, source: str
) -> None:
    """What the sandbox refuses is a 422 naming it, never a 500."""
    auth = await new_key(db)
    template_id = await created(api, auth, text=source)

    resp = await publish(api, auth, template_id, version=1)

    assert (resp.status_code, resp.json()["error"]["code"]) == (422, "template_does_not_render")
    assert "text" in resp.json()["error"]["fields"]


async def test_preview_data_that_jinja_cannot_take_is_a_422(
    api: httpx.AsyncClient, db: Database
) -> None:
    """Data keys are passed as names to the template; one that clashes is a render error."""
    auth = await new_key(db)
    template_id = await created(api, auth)

    resp = await api.post(
        f"/v1/templates/{template_id}/preview",
        json={"version": 1, "data": {"self": 1, "first_name": "A"}},
        headers=auth,
    )

    assert resp.status_code == 422
    assert "self" in resp.json()["error"]["message"]


async def test_changing_templates_needs_the_send_scope_and_reading_the_read_scope(
    api: httpx.AsyncClient, db: Database
) -> None:
    """A read-only key lists templates but cannot make or publish them."""
    reader = await new_key(db, "read")
    template_id = await created(api, await new_key(db))

    made = await api.post("/v1/templates", json=WELCOME, headers=reader)
    listed = await api.get("/v1/templates", headers=reader)
    published = await publish(api, reader, template_id, version=1)

    assert (made.status_code, listed.status_code, published.status_code) == (403, 200, 403)


async def test_the_dashboard_lists_my_templates_and_their_versions(
    api: httpx.AsyncClient, db: Database
) -> None:
    """The read-only page shows each template with its versions and which is live and in
    canary; another user's templates are not there."""
    user = await accounts.ensure_user(db, unique("tpl_dash"))
    auth = {"Authorization": f"Bearer {await accounts.create_key(db, user, 'k')}"}
    template_id = await created(api, auth, name="Spring <sale>")
    second = await new_version(api, auth, template_id, subject="Second subject")
    await publish(api, auth, template_id, version=1)
    await publish(api, auth, template_id, version=second, canary_percent=25)
    others = await created(api, await new_key(db), name="not-mine")
    session_id, _ = await SessionStore(db).create(user)
    api.cookies.set(SESSION_COOKIE, session_id, domain="api.test")

    page = await api.get("/templates")
    home = await api.get("/")

    assert page.status_code == 200
    assert "Spring &lt;sale&gt;" in page.text
    assert f'data-template="{template_id}"' in page.text
    assert 'data-version="2" data-state="canary"' in page.text
    assert 'data-version="1" data-state="live"' in page.text
    assert "25%" in page.text and "Second subject" in page.text
    assert others not in page.text
    assert 'href="/templates"' in home.text


async def rolled_back(
    api: httpx.AsyncClient, db: Database, settings: Settings, auth: dict[str, str], user: uuid.UUID
) -> str:
    """A template whose version 2 ran as a canary and was rolled back (the verdict written
    as the judge writes it)."""
    template_id = await created(api, auth)
    await new_version(api, auth, template_id)
    await publish(api, auth, template_id, version=1)
    since = datetime.now(UTC) - timedelta(hours=1)
    await CanaryStore(db, settings.amqp.exchange).judged(
        Rollout(uuid.UUID(template_id), since, user, 2, 1),
        Outcome(
            at=since + timedelta(minutes=30),
            canary_version=2,
            live_version=1,
            decision="rollback",
            reason="hard bounces 6.0% against 0.5% live",
            canary=Counts(sent=100, hard_bounces=6),
            live=Counts(sent=900, provider_failures=1, hard_bounces=4),
        ),
    )
    return template_id


async def test_a_template_tells_its_rolled_back_canary_with_the_reason_and_counts(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    user = await accounts.ensure_user(db, unique("tpl_roll"))
    auth = {"Authorization": f"Bearer {await accounts.create_key(db, user, 'k')}"}
    template_id = await rolled_back(api, db, settings, auth, user)

    resp = await api.get(f"/v1/templates/{template_id}", headers=auth)

    assert resp.status_code == 200
    (verdict,) = resp.json()["rollouts"]
    assert verdict["decision"] == "rollback"
    assert (verdict["canary_version"], verdict["live_version"]) == (2, 1)
    assert verdict["reason"] == "hard bounces 6.0% against 0.5% live"
    assert verdict["counts"] == {
        "canary": {"sent": 100, "provider_failures": 0, "hard_bounces": 6, "complaints": 0},
        "live": {"sent": 900, "provider_failures": 1, "hard_bounces": 4, "complaints": 0},
    }


async def test_the_dashboard_marks_a_rolled_back_canary_with_its_reason(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    user = await accounts.ensure_user(db, unique("tpl_roll_dash"))
    auth = {"Authorization": f"Bearer {await accounts.create_key(db, user, 'k')}"}
    template_id = await rolled_back(api, db, settings, auth, user)
    session_id, _ = await SessionStore(db).create(user)
    api.cookies.set(SESSION_COOKIE, session_id, domain="api.test")

    page = await api.get("/templates")

    assert page.status_code == 200
    section = page.text.split(f'data-template="{template_id}"', 1)[1].split("</section>", 1)[0]
    assert 'data-rollout="2" data-decision="rollback"' in section
    assert "Rolled back" in section
    assert "hard bounces 6.0% against 0.5% live" in section
    assert "100 sent: 0 provider failures, 6 hard bounces" in section
