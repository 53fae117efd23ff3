"""The ``mailto:`` unsubscribe: the token of a mail sent to it (``shared.engagement.
unsubscribe_event``), and what the inbound routes refuse (``services.webhooks.inbound``)."""

from __future__ import annotations

import base64
import time
import urllib.parse
import uuid

import pytest
from pydantic import SecretStr

from services.webhooks.inbound import check_basic, parse_form, sendgrid_mail
from shared.core.keyring import KeyRing
from shared.engagement.engagement import Tracker, list_unsubscribe
from shared.engagement.engagement_tokens import Claim, sign
from shared.engagement.unsubscribe_event import (
    candidates,
    mailto_claim,
    tracker_event,
    unsubscribe_event,
)
from shared.infra.config import Settings, WebhookSettings
from shared.infra.http import ApiError

RING = KeyRing((("k1", b"k" * 32),))
OTHER = KeyRing((("k1", b"o" * 32),))
CLAIM = Claim("unsubscribe", uuid.uuid1(), uuid.uuid4(), chunk=2, scope="news")
TOKEN = sign(CLAIM, RING)


def test_the_subject_the_mailto_link_sets_names_the_recipient() -> None:
    header = list_unsubscribe(Tracker("https://t.example", RING, mailto="u@t.example"), TOKEN)
    query = header.split("mailto:", 1)[1].rstrip(">").split("?subject=", 1)[1]
    subject = urllib.parse.unquote(query)  # as a mail client puts it into the Subject

    assert mailto_claim(subject, [], RING) == CLAIM


def test_a_reply_prefix_and_any_case_still_find_the_token() -> None:
    assert mailto_claim(f"Re: UNSUBSCRIBE {TOKEN}", [], RING) == CLAIM


def test_a_plus_address_carries_the_token_too() -> None:
    assert mailto_claim("", ["x@y.example", f"Unsub <unsubscribe+{TOKEN}@t.example>"], RING) == (
        CLAIM
    )


@pytest.mark.parametrize(
    "subject",
    [
        "",
        "unsubscribe",
        "please take me off",
        f"unsubscribe {TOKEN[:-2]}xx",  # altered
        f"unsubscribe {sign(CLAIM, OTHER)}",  # another deployment's key
        f"unsubscribe {sign(Claim('click', CLAIM.batch_id, CLAIM.log_id, link=0), RING)}",
        "unsubscribe " + "a" * 16 + "." + "b" * 5000 + "." + "c" * 22,  # longer than a token
    ],
    # Named, not shown: the tokens are signed anew in each process, and parallel workers
    # must collect the same test ids.
    ids=["empty", "bare", "words", "altered", "other-key", "click-token", "too-long"],
)
def test_anything_but_one_of_our_unsubscribe_tokens_is_not_an_unsubscribe(subject: str) -> None:
    assert mailto_claim(subject, ["u@t.example", subject], RING) is None


def test_a_huge_subject_is_looked_at_only_so_far() -> None:
    started = time.perf_counter()

    found = candidates("unsubscribe " * 200_000 + TOKEN, ["+" * 200_000] * 10_000)

    assert found == [] and time.perf_counter() - started < 1.0


def test_one_click_and_mailto_for_one_copy_are_one_unsubscribe() -> None:
    by_post = unsubscribe_event(CLAIM, "a@example.com", "one-click unsubscribe")
    by_mail = unsubscribe_event(CLAIM, "a@example.com", "mailto unsubscribe")

    assert by_post.event_id == by_mail.event_id
    assert by_mail.suppress and by_mail.kind == "unsubscribed"
    assert by_mail.raw_event == "mailto unsubscribe"


def test_opens_and_clicks_do_not_suppress() -> None:
    ev = tracker_event(CLAIM, "clicked", "c:1", url="https://x.example", machine="scanner")

    assert not ev.suppress and ev.reason == "by scanner"


def _settings(user: str | None, password: str | None) -> Settings:
    return Settings().model_copy(
        update={
            "webhooks": WebhookSettings(
                inbound_basic_user=user,
                inbound_basic_password=SecretStr(password) if password is not None else None,
            )
        }
    )


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_inbound_parse_without_basic_auth_configured_fails_closed() -> None:
    with pytest.raises(ApiError) as refused:
        check_basic(_basic("u", ""), _settings("u", ""))

    assert refused.value.status == 503


def test_inbound_parse_with_other_credentials_is_a_401() -> None:
    with pytest.raises(ApiError) as refused:
        check_basic(_basic("u", "wrong"), _settings("u", "secret"))

    assert refused.value.status == 401


def test_inbound_parse_with_the_configured_credentials_passes() -> None:
    check_basic(_basic("u", "secret"), _settings("u", "secret"))


async def test_an_urlencoded_form_is_read() -> None:
    form = await parse_form(
        b"subject=unsubscribe+x&recipient=a%40b", "application/x-www-form-urlencoded"
    )

    assert form == {"subject": "unsubscribe x", "recipient": "a@b"}


async def test_a_multipart_form_keeps_its_text_fields_and_leaves_files_out() -> None:
    raw = (
        b'--B\r\nContent-Disposition: form-data; name="subject"\r\n\r\nhi\r\n'
        b'--B\r\nContent-Disposition: form-data; name="attachment1"; filename="a.txt"\r\n'
        b"Content-Type: text/plain\r\n\r\nfile\r\n--B--\r\n"
    )

    form = await parse_form(raw, "multipart/form-data; boundary=B")

    assert form == {"subject": "hi"}


@pytest.mark.parametrize(
    ("raw", "content_type", "status"),
    [
        (b'{"subject": "x"}', "application/json", 415),
        (b"", "", 415),
        (b"garbage without a boundary", "multipart/form-data", 400),
        (b"--B\r\nno headers here", "multipart/form-data; boundary=B", 400),
        (b"&".join(b"f%d=1" % i for i in range(500)), "application/x-www-form-urlencoded", 400),
        (
            b"".join(
                b'--B\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nx\r\n' % i
                for i in range(500)
            )
            + b"--B--\r\n",
            "multipart/form-data; boundary=B",
            400,
        ),
    ],
)
async def test_hostile_bodies_are_clear_4xx(raw: bytes, content_type: str, status: int) -> None:
    with pytest.raises(ApiError) as refused:
        await parse_form(raw, content_type)

    assert refused.value.status == status


def test_inbound_parse_addresses_come_from_to_and_the_envelope() -> None:
    form = {"to": "a@t.example", "subject": "s", "envelope": '{"to": ["b@t.example", 3]}'}

    assert sendgrid_mail(form) == ("s", ["a@t.example", "b@t.example"])
    assert sendgrid_mail({"envelope": "not json"}) == ("", [""])
