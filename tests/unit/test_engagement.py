"""Each recipient's tracked copy (``shared.engagement.engagement``), the cooldown's rules
(``services.api.cooldown``), the preferences patch and how a request's engagement is settled."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from services.api.cooldown import cooling, scopes_of
from shared.accounts.preferences import Preferences, patched
from shared.core.keyring import KeyRing
from shared.core.models import Address, Chunk, Engagement, Message, Recipient
from shared.delivery import validation
from shared.engagement.engagement import (
    MAX_TRACKED_LINKS,
    ONE_CLICK,
    OPEN_KEY,
    Tracker,
    click_key,
    links_of,
    personalize,
)
from shared.engagement.engagement_tokens import read, redirect_target
from shared.providers import mailgun, sendgrid

RING = KeyRing((("k1", b"k" * 32),))
TRACKER = Tracker("https://t.example", RING, mailto="unsub@t.example")
HTML = (
    '<p><a href="https://shop.example/a">A</a> <a href="https://shop.example/-id-">mine</a> '
    '<a href="https://shop.example/b">B</a></p></body>'
)


def _chunk(engagement: Engagement | None, *, bulk: bool = True, html: str = HTML) -> Chunk:
    message = Message(
        sender=Address(email="shop@example.com"),
        subject="Hi",
        html=html,
        text="Hello",
        bulk=bulk,
        engagement=engagement,
    )
    recipients = tuple(
        Recipient(log_id=uuid.uuid4(), email=f"r{i}@example.com", substitutions={"-id-": str(i)})
        for i in range(2)
    )
    return Chunk(batch_id=uuid.uuid1(), index=3, message=message, recipients=recipients)


def test_every_trackable_link_points_at_the_tracker_with_each_recipients_own_token() -> None:
    sent = _chunk(Engagement(clicks=True))
    chunk = personalize(sent, TRACKER)

    html = chunk.message.html or ""
    assert f'href="{click_key(0)}"' in html and f'href="{click_key(2)}"' in html
    assert 'href="https://shop.example/-id-"' in html  # personal: left as it is
    links = links_of(sent.message)  # what the endpoint reads: the stored message
    for recipient in chunk.recipients:
        assert click_key(1) not in recipient.substitutions  # no token for the personal link
        for index, url in ((0, "https://shop.example/a"), (2, "https://shop.example/b")):
            value = recipient.substitutions[click_key(index)]
            claim = read(value.removeprefix("https://t.example/c/"), RING)
            assert claim is not None
            assert (claim.log_id, claim.chunk, claim.batch_id) == (
                recipient.log_id,
                3,
                chunk.batch_id,
            )
            assert redirect_target(claim, links) == url


def test_the_open_pixel_goes_before_the_end_of_the_body() -> None:
    chunk = personalize(_chunk(Engagement(opens=True)), TRACKER)

    html = chunk.message.html or ""
    assert html.endswith('style="display:none"></body>')
    assert f"https://t.example/o/{OPEN_KEY}" in html
    assert all(read(r.substitutions[OPEN_KEY], RING) for r in chunk.recipients)


def test_unsubscribe_headers_carry_the_recipients_own_token_and_the_list() -> None:
    chunk = personalize(_chunk(Engagement(unsubscribe=True, list="news")), TRACKER)

    assert chunk.message.headers == {"List-Unsubscribe-Post": ONE_CLICK}
    value = chunk.recipients[0].headers["List-Unsubscribe"]
    https, mailto = value.split(", ")
    token = https.removeprefix("<https://t.example/u/").removesuffix(">")
    claim = read(token, RING)
    assert claim is not None and claim.scope == "news" and claim.purpose == "unsubscribe"
    assert mailto.startswith("<mailto:unsub@t.example?subject=unsubscribe%20")


def test_our_unsubscribe_headers_replace_a_stored_senders_own() -> None:
    """A message stored before the headers were reserved goes out with ours, not theirs."""
    chunk = _chunk(Engagement(unsubscribe=True))
    theirs = {
        "list-unsubscribe": "<https://sender.example/u>",
        "LIST-UNSUBSCRIBE-POST": "List-Unsubscribe=One-Click",
        "X-Campaign": "spring",
    }
    own = chunk.message.model_copy(update={"headers": theirs})

    out = personalize(chunk.model_copy(update={"message": own}), TRACKER)

    assert out.message.headers == {"X-Campaign": "spring", "List-Unsubscribe-Post": ONE_CLICK}
    assert all(
        r.headers["List-Unsubscribe"].startswith("<https://t.example/u/") for r in out.recipients
    )


@pytest.mark.parametrize(
    ("engagement", "bulk", "tracker"),
    [
        (None, True, TRACKER),
        (Engagement(list="news"), True, TRACKER),
        (Engagement(opens=True), False, TRACKER),
        (Engagement(opens=True), True, None),
    ],
)
def test_mail_without_tracking_goes_as_it_is(
    engagement: Engagement | None, bulk: bool, tracker: Tracker | None
) -> None:
    chunk = _chunk(engagement, bulk=bulk)

    assert personalize(chunk, tracker) == chunk


def test_links_beyond_the_limit_stay_as_they_are() -> None:
    html = '<a href="https://s.example/">x</a>' * (MAX_TRACKED_LINKS + 2)

    sent = _chunk(Engagement(clicks=True), html=html)
    chunk = personalize(sent, TRACKER)

    assert (chunk.message.html or "").endswith('<a href="https://s.example/">x</a>' * 2)
    assert len(links_of(sent.message)) == MAX_TRACKED_LINKS


def test_a_personal_link_to_an_allowed_host_carries_each_recipients_own_url() -> None:
    tracker = dataclasses.replace(TRACKER, allowed_hosts=frozenset({"shop.example"}))
    sent = _chunk(Engagement(clicks=True))

    chunk = personalize(sent, tracker)

    assert f'href="{click_key(1)}"' in (chunk.message.html or "")
    allowed = frozenset({"shop.example"})
    for i, recipient in enumerate(chunk.recipients):
        value = recipient.substitutions[click_key(1)]
        claim = read(value.removeprefix("https://t.example/c/"), RING)
        assert claim is not None and claim.url == f"https://shop.example/{i}"
        assert redirect_target(claim, links_of(sent.message), allowed) == claim.url
        assert redirect_target(claim, links_of(sent.message)) is None  # host no longer allowed


def test_a_personal_link_too_long_for_a_token_goes_untracked() -> None:
    tracker = dataclasses.replace(TRACKER, allowed_hosts=frozenset({"shop.example"}))
    sent = _chunk(Engagement(clicks=True))
    long_id = {"-id-": "x" * 2000}
    recipients = (sent.recipients[0].model_copy(update={"substitutions": long_id}),)

    chunk = personalize(sent.model_copy(update={"recipients": recipients}), tracker)

    assert chunk.recipients[0].substitutions[click_key(1)] == "https://shop.example/" + "x" * 2000


def test_sendgrid_puts_the_recipients_headers_on_their_personalization() -> None:
    chunk = personalize(_chunk(Engagement(unsubscribe=True)), TRACKER)

    payload = sendgrid.build_payload(chunk)

    assert payload["headers"] == {"List-Unsubscribe-Post": ONE_CLICK}
    for personalization, recipient in zip(
        payload["personalizations"], chunk.recipients, strict=True
    ):
        assert personalization["headers"] == dict(recipient.headers)


def test_mailgun_carries_the_recipients_headers_as_recipient_variables() -> None:
    chunk = personalize(_chunk(Engagement(unsubscribe=True)), TRACKER)

    form = mailgun.build_form(chunk)

    assert ("h:List-Unsubscribe", "%recipient.h0%") in form
    variables = orjson.loads(dict(form)["recipient-variables"])
    for recipient in chunk.recipients:
        assert variables[recipient.email]["h0"] == recipient.headers["List-Unsubscribe"]


def test_the_cooldown_scope_is_the_mailbox_or_each_category() -> None:
    assert scopes_of(["News", "x"], per_category=False) == ("",)
    assert scopes_of(["News", "news", "x"], per_category=True) == ("news", "x")
    assert scopes_of([], per_category=True) == ("",)


def test_an_address_cools_for_the_cooldown_only() -> None:
    now = datetime(2026, 11, 26, tzinfo=UTC)

    assert cooling(now - timedelta(seconds=59), now, 60)
    assert not cooling(now - timedelta(seconds=60), now, 60)
    assert not cooling(now, now, 0)
    assert not cooling(None, now, 60)


def test_a_preferences_patch_changes_only_what_it_names() -> None:
    prefs = Preferences(track_opens=True, cooldown_seconds=30)

    out = patched(prefs, {"tracking": {"clicks": True}, "cooldown": {"per_category": True}})

    assert out == Preferences(
        track_opens=True, track_clicks=True, cooldown_seconds=30, cooldown_per_category=True
    )


def _request(body: dict[str, object]) -> validation.BatchRequest:
    base = {"from": "s@example.com", "to": ["a@example.com"], "subject": "s", "text": "t"}
    return validation.parse_batch_request({**base, **body}, max_recipients=10)


def test_a_request_settles_tracking_over_the_users_preferences() -> None:
    prefs = Preferences(track_opens=True, track_clicks=True)

    out = validation.with_engagement(_request({"tracking": {"clicks": False}}), prefs)

    assert out.message.engagement == Engagement(opens=True, clicks=False)


def test_a_list_brings_the_unsubscribe_header_unless_turned_off() -> None:
    on = validation.with_engagement(_request({"list": "news"}), Preferences())
    off = validation.with_engagement(
        _request({"list": "news", "unsubscribe": False}), Preferences()
    )

    assert on.message.engagement == Engagement(unsubscribe=True, list="news")
    assert off.message.engagement == Engagement(list="news")


def test_nothing_asked_and_nothing_preferred_leaves_the_message_alone() -> None:
    request = _request({})

    assert validation.with_engagement(request, Preferences()) == request


def test_tracking_asked_of_a_shared_message_is_refused_but_a_default_is_not() -> None:
    shared = _request({"shared": True, "to": ["a@example.com", "b@example.com"]})
    asked = _request(
        {"shared": True, "to": ["a@example.com", "b@example.com"], "unsubscribe": True}
    )

    assert validation.with_engagement(shared, Preferences(track_opens=True)) == shared
    with pytest.raises(validation.InvalidRequest) as refused:
        validation.with_engagement(asked, Preferences())
    assert "one copy per recipient" in refused.value.fields["shared"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tracking": True}, "tracking"),
        ({"tracking": {"opens": "yes"}}, "tracking.opens"),
        ({"tracking": {"views": True}}, "tracking.views"),
        ({"unsubscribe": 1}, "unsubscribe"),
        ({"list": "-news"}, "list"),
        ({"list": "a" * 65}, "list"),
        ({"list": "news\n"}, "list"),
    ],
)
def test_bad_engagement_fields_are_named(body: dict[str, object], field: str) -> None:
    with pytest.raises(validation.InvalidRequest) as bad:
        _request(body)

    assert field in bad.value.fields


def test_an_encoded_message_without_engagement_has_no_such_field() -> None:
    message = Message(sender=Address(email="s@example.com"), subject="s", text="t")

    assert b"engagement" not in message.encode()
    assert Message.decode(message.encode()) == message


def test_tokens_stop_where_sendgrid_would_refuse_the_substitutions() -> None:
    """A recipient's own substitutions near SendGrid's 10 kB leave room for few tokens:
    links beyond it stay as they are, and the whole stays under the limit."""
    html = "".join(f'<a href="https://s.example/{i}">x</a>' for i in range(MAX_TRACKED_LINKS))
    sent = _chunk(Engagement(opens=True, clicks=True), html=html)
    heavy = {"-bio-": "b" * 8_000}
    recipients = tuple(r.model_copy(update={"substitutions": heavy}) for r in sent.recipients)

    chunk = personalize(sent.model_copy(update={"recipients": recipients}), TRACKER)

    for recipient in chunk.recipients:
        size = sum(len(k) + len(v) for k, v in recipient.substitutions.items())
        assert size < 10_000
    tokens = [k for k in chunk.recipients[0].substitutions if k.startswith("{sd:c")]
    assert 0 < len(tokens) < MAX_TRACKED_LINKS
    assert f'href="https://s.example/{MAX_TRACKED_LINKS - 1}"' in (chunk.message.html or "")
    payload = sendgrid.build_payload(chunk)
    assert len(orjson.dumps(payload["personalizations"][0]["substitutions"])) < 10_000


def test_a_shared_message_naming_a_list_still_honours_that_lists_unsubscribes() -> None:
    shared = _request({"shared": True, "to": ["a@example.com", "b@example.com"], "list": "news"})

    out = validation.with_engagement(shared, Preferences(unsubscribe=True))

    assert out.message.engagement == Engagement(list="news")  # no link, but its scope


def test_a_bulk_message_round_trips_its_lane() -> None:
    """The lane decided at acceptance survives the batch's blob."""
    message = Message(sender=Address(email="s@example.com"), subject="s", text="t", priority="bulk")

    assert Message.decode(message.encode()).lane == "bulk"


def test_links_are_searched_for_all_recipients_keys_at_once() -> None:
    """Links are searched once for the keys of every recipient: 60 links of 100 KB under
    1,000 recipients with 100 keys each are tracked (a search per key was 6 x 10^11 steps)."""
    link = "https://shop.example/" + "x" * 100_000
    html = "".join(f'<a href="{link}{i}">{i}</a>' for i in range(MAX_TRACKED_LINKS))
    sent = _chunk(Engagement(clicks=True), html=html)
    recipients = tuple(
        Recipient(
            log_id=uuid.uuid4(),
            email=f"r{i}@example.com",
            substitutions={f"-{i}-{k}-": "v" for k in range(100)},
        )
        for i in range(1000)
    )
    sent = sent.model_copy(update={"recipients": recipients})

    chunk = personalize(sent, dataclasses.replace(TRACKER, base_url="https://t"))

    assert chunk.message.html == "".join(
        f'<a href="{click_key(i)}">{i}</a>' for i in range(MAX_TRACKED_LINKS)
    )
