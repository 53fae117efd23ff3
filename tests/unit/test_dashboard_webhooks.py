"""The Webhooks pages (``services.api.dashboard.webhook_pages``): their view model, and their
HTML as rendered: every form carries the CSRF token, a message's replay button is on its
newest line only, a refused URL is told beside its field, and a secret is shown whole only on
the page that makes it."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any

from services.api.dashboard import create_templates
from services.api.dashboard.webhook_pages import (
    LOG_SHOWN,
    chosen_events,
    delivery_rows,
    done_notice,
    endpoint_row,
)
from services.api.sessions import SessionUser
from shared.outbound.hook_queue import Delivery
from shared.outbound.hook_store import Endpoint
from shared.outbound.outbound_retry import Health
from shared.outbound.user_hooks import EVENT_TYPES

AT = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
USER = SessionUser(uuid.uuid4(), "ann", None, None, None, "CSRF-TOKEN-1", "s")
SECRET = "whsec_" + "A" * 44


def endpoint(**kw: Any) -> Endpoint:
    values: dict[str, Any] = {
        "user_id": USER.user_id,
        "endpoint_id": uuid.uuid4(),
        "url": "https://hooks.example.com/in",
        "events": frozenset({"recipient.delivered"}),
        "secret": SECRET,
        "created_at": AT,
        **kw,
    }
    return Endpoint(**values)


def line(msg_id: str, attempt: int, status: int | None, error: str | None = None) -> Delivery:
    return Delivery(AT, msg_id, "recipient.delivered", attempt, status, error, 1234)


def rendered(name: str, **context: Any) -> str:
    base: dict[str, Any] = {"user": USER, "operator": False, "active": "webhooks"}
    base |= {"notice": None, "title": "Webhooks", "errors": {}, "event_types": EVENT_TYPES}
    return create_templates().env.get_template(name).render({**base, **context})


def detail(e: Endpoint, log: list[Delivery], **context: Any) -> str:
    values = {"url": e.url, "events": e.events}
    return rendered(
        "webhook.html",
        e=endpoint_row(e),
        log=delivery_rows(log),
        shown=LOG_SHOWN,
        values=values,
        problem=None,
        replay_key="k",
        **context,
    )


def test_an_endpoint_is_badged_enabled_failing_or_disabled_with_its_reason() -> None:
    failing = endpoint(health=Health(AT, 3))
    disabled = endpoint(enabled=False, disabled_at=AT, disabled_reason="failing for a day")

    rows = [endpoint_row(e) for e in (endpoint(), failing, disabled)]

    assert [(r.state, r.tone) for r in rows] == [
        ("Enabled", "ok"),
        ("Failing", "warn"),
        ("Disabled", "bad"),
    ]
    assert (rows[1].failures, rows[2].reason) == (3, "failing for a day")
    assert rows[0].secret_hint == SECRET[:10] + "…"


def test_an_endpoint_without_a_filter_receives_every_event() -> None:
    assert endpoint_row(endpoint(events=frozenset())).events == "every event"
    assert endpoint_row(endpoint(events=frozenset({"b.x", "a.x"}))).events == "a.x, b.x"


def test_ticked_types_are_read_in_the_catalogues_order_and_unknown_ones_ignored() -> None:
    form = {"event:recipient.opened": "on", "event:recipient.sent": "on", "event:nope": "on"}

    assert chosen_events(form) == ["recipient.sent", "recipient.opened"]
    assert chosen_events({}) == []


def test_only_a_messages_newest_line_offers_its_replay() -> None:
    rows = delivery_rows([line("m2", 1, 200), line("m1", 2, 200), line("m1", 1, None, "timeout")])

    assert [(r.msg_id, r.replay) for r in rows] == [("m2", True), ("m1", True), ("m1", False)]
    assert [(r.status, r.tone) for r in rows] == [
        ("200", "ok"),
        ("200", "ok"),
        ("no answer", "bad"),
    ]
    assert rows[0].duration == "1,234 ms"


def test_a_notice_is_told_only_for_a_known_outcome() -> None:
    assert done_notice({"done": "replayed"}) == "The message is queued to be delivered once more."
    assert done_notice({"done": "<b>x</b>"}) is None
    assert done_notice({}) is None


def test_every_form_of_an_endpoints_page_carries_the_csrf_token() -> None:
    page = detail(endpoint(), [line("m2", 1, 500, "HTTP 500"), line("m1", 1, 200)])

    forms = re.findall(r"<form .*?</form>", page, re.S)
    assert len(forms) == 7  # log out, disable, rotate, delete, save, two replays
    assert all('name="csrf_token" value="CSRF-TOKEN-1"' in f for f in forms)
    assert page.count('name="msg_id"') == 2
    assert SECRET not in page
    assert "HTTP 500" in page


def test_a_disabled_endpoint_offers_enable_and_tells_why() -> None:
    page = detail(endpoint(enabled=False, disabled_at=AT, disabled_reason="failing for a day"), [])

    assert 'value="enable"' in page and 'value="disable"' not in page
    assert "failing for a day" in page
    assert "Nothing delivered yet." in page


def test_a_refused_url_is_told_beside_its_field_with_what_was_typed() -> None:
    errors = {"url": ["the URL must be https"]}
    values = {"url": "ftp://x", "events": frozenset({"recipient.opened"})}

    page = rendered("webhooks.html", rows=[], values=values, errors=errors)

    assert 'aria-invalid="true"' in page and 'id="url-errors"' in page
    assert "the URL must be https" in page
    assert 'value="ftp://x"' in page
    assert re.search(r'name="event:recipient.opened" checked', page)
    assert not re.search(r'name="event:recipient.sent" checked', page)


def test_a_rotated_secret_is_shown_whole_with_when_the_previous_stops_signing() -> None:
    e = endpoint()
    page = rendered(
        "webhook_secret.html",
        e=endpoint_row(e),
        secret=SECRET,
        rotated=True,
        previous_until="2026-11-27 10:00:00 UTC",
    )

    assert f'value="{SECRET}"' in page
    assert "until 2026-11-27 10:00:00 UTC" in page
    assert f'href="/webhooks/{e.endpoint_id}"' in page
