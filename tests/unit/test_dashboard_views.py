"""The dashboard's pure parts: SVG chart rendering and the view-model builders."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from datetime import UTC, date, datetime, timedelta

import pytest

from services.api.dashboard import charts, views
from services.api.domain_claims import OtherClaims
from shared.accounts import domains
from shared.accounts.domain_checks import CheckRules
from shared.accounts.domains import SendingDomain
from shared.delivery import validation
from tests.unit import readmodels

RULES = CheckRules(every=timedelta(hours=6), grace=timedelta(days=3))

SVG = "{http://www.w3.org/2000/svg}"
DAYS = [date(2026, 11, 2) + timedelta(days=i) for i in range(3)]
SERIES = (
    charts.Series("success", "Delivered", "#007a5a"),
    charts.Series("failed", "Failed", "#c2410c"),
)
T0 = datetime(2026, 11, 2, 10, 0, 0, 400_000, tzinfo=UTC)


def _chart(counts: list[dict[str, int]], **kw: str) -> ET.Element:
    svg = charts.stacked_bars(DAYS, counts, SERIES, title=kw.get("title", "T"), desc="D")
    return ET.fromstring(str(svg))  # noqa: S314 - our own markup


def _title(element: ET.Element, tag: str = "title") -> ET.Element:
    """``element``'s ``tag`` child (an SVG title unless told), which must be there."""
    found = element.find(f"{SVG}{tag}")
    assert found is not None, f"no {tag} in {ET.tostring(element)!r}"
    return found


def _rects(root: ET.Element) -> list[ET.Element]:
    return [r for r in root.iter(f"{SVG}rect") if r.get("class") != "chart-empty-bg"]


def _stats_row(day: str, **counts: int) -> dict[str, object]:
    return {
        "date": day,
        **{
            m: counts.get(m, 0)
            for m in ("queued", "success", "failed", "bounced", "complained", "opened", "clicked")
        },
    }


# --------------------------------------------------------------------------- charts


def test_nice_scale_rounds_the_top_up_to_a_round_step() -> None:
    """A maximum of 7 gets an axis of 0-8 in steps of 2."""
    assert charts.nice_scale(7) == (8, 2)


def test_nice_scale_uses_1_2_5_steps_for_large_numbers() -> None:
    """A maximum of 1,234 gets steps of 500 up to 1,500."""
    assert charts.nice_scale(1234) == (1500, 500)


def test_nice_scale_of_an_empty_chart_still_has_a_grid() -> None:
    """No data still gives a 0-4 axis."""
    assert charts.nice_scale(0) == (4, 1)


def test_chart_is_an_image_named_by_its_title_and_desc() -> None:
    """The SVG has role=img and aria-labelledby pointing at its title and desc."""
    root = _chart([{}, {}, {}])
    ids = root.get("aria-labelledby", "").split()
    assert root.get("role") == "img"
    assert [_title(root).get("id"), _title(root, "desc").get("id")] == ids


def test_chart_escapes_its_text() -> None:
    """Markup in a title is escaped, not interpreted."""
    root = _chart([{}, {}, {}], title="<script>x</script>")
    assert _title(root).text == "<script>x</script>"
    assert root.find(f".//{SVG}script") is None


def test_chart_stacks_the_first_series_at_the_bottom() -> None:
    """Delivered sits below failed, and heights are proportional to the values."""
    rects = _rects(_chart([{"success": 3, "failed": 1}, {}, {}]))
    success, failed = rects
    assert float(success.get("y", 0)) > float(failed.get("y", 0))
    assert float(success.get("height", 0)) == pytest.approx(3 * float(failed.get("height", 0)))


def test_chart_segments_are_named_with_day_and_value() -> None:
    """Each segment's tooltip says the day, the count and the series."""
    rects = _rects(_chart([{}, {"success": 2}, {}]))
    assert [_title(r).text for r in rects] == ["Tue 3: 2 delivered"]


def test_chart_draws_no_segment_for_zero() -> None:
    """A zero count draws nothing (no invisible zero-height bars)."""
    assert _rects(_chart([{"success": 0, "failed": 0}, {}, {}])) == []


def test_empty_chart_says_there_was_no_mail() -> None:
    """All-zero data shows a 'No mail in this period' label."""
    texts = [t.text for t in _chart([{}, {}, {}]).iter(f"{SVG}text")]
    assert "No mail in this period" in texts


def test_chart_needs_counts_for_every_day() -> None:
    """Mismatched days and counts are a programming error."""
    with pytest.raises(ValueError, match="one counts mapping per day"):
        charts.stacked_bars(DAYS, [{}], SERIES, title="T", desc="D")


# --------------------------------------------------------------------------- formatting


def test_tone_classifies_states_and_events() -> None:
    """Outcomes map to ok/bad, deferrals to warn, everything else to pending."""
    assert [views.tone(v) for v in ("delivered", "bounced", "deferred", "queued")] == [
        "ok",
        "bad",
        "warn",
        "pending",
    ]


def test_fmt_time_reads_naive_times_as_utc() -> None:
    """Cassandra's naive timestamps are UTC."""
    assert views.fmt_time(datetime(2026, 11, 2, 14, 3, 7)) == "2026-11-02 14:03:07 UTC"  # noqa: DTZ001


def test_fmt_time_of_nothing_is_a_dash() -> None:
    """A missing time renders as an em dash."""
    assert views.fmt_time(None) == "—"


def test_percent_has_one_decimal() -> None:
    """1 of 40 is 2.5%."""
    assert views.percent(1, 40) == "2.5%"


def test_percent_of_nothing_is_none() -> None:
    """A zero denominator gives no rate rather than 0% or an error."""
    assert views.percent(0, 0) is None


def test_login_url_keeps_a_local_next() -> None:
    """A local path survives into the GitHub login link."""
    assert views.login_url("/batches?cursor=x") == "/auth/github/login?next=%2Fbatches%3Fcursor%3Dx"


def test_login_url_drops_an_external_next() -> None:
    """An absolute or scheme-relative next becomes / (no open redirect)."""
    assert views.login_url("//evil.example/x") == "/auth/github/login?next=%2F"


def test_initials_come_from_the_name_or_login() -> None:
    """Two letters from the name, else from the login."""
    assert (views.initials("Sandbox User", "x"), views.initials(None, "octo-cat")) == ("SU", "OC")


# --------------------------------------------------------------------------- overview


def test_awaiting_never_goes_below_zero() -> None:
    """Outcomes counted on a later day than acceptance do not make awaiting negative."""
    (row,) = views.day_rows([_stats_row("2026-11-02", queued=1, success=3)])
    assert row.awaiting == 0


def test_overview_rates_use_accepted_and_delivered() -> None:
    """Bounce rate is bounced/accepted, complaint rate complained/delivered."""
    o = views.overview(
        [
            _stats_row("2026-11-01", queued=10, success=4, failed=1, bounced=1),
            _stats_row("2026-11-02", queued=10, success=4, complained=2),
        ]
    )
    assert (o.bounce_rate, o.complaint_rate) == ("5.0%", "25.0%")


def test_overview_totals_sum_the_days() -> None:
    """Totals add up every metric over the period."""
    o = views.overview(
        [_stats_row("2026-11-01", queued=2, success=1), _stats_row("2026-11-02", queued=3)]
    )
    assert (o.totals["queued"], o.totals["success"], o.totals["awaiting"]) == (5, 1, 4)


def test_overview_counts_engagement_unique_and_in_total() -> None:
    """Opens and clicks: recipients who did, every hit, and those made by machines."""
    o = views.overview(
        [
            {**_stats_row("2026-11-01", opened=2), "opens_total": 5, "machine_opens": 1},
            {**_stats_row("2026-11-02", clicked=1), "clicks_total": 3, "machine_clicks": 2},
        ]
    )
    assert [o.totals[k] for k in ("opened", "opens_total", "machine_opens")] == [2, 5, 1]
    assert [o.totals[k] for k in ("clicked", "clicks_total", "machine_clicks")] == [1, 3, 2]


def test_overview_without_mail_is_empty_with_no_rates() -> None:
    """A quiet week is empty and has no rates to show."""
    o = views.overview([_stats_row("2026-11-01"), _stats_row("2026-11-02")])
    assert (o.empty, o.bounce_rate, o.complaint_rate) == (True, None, None)


def test_overview_chart_title_names_the_period() -> None:
    """The chart's title says which days it covers."""
    o = views.overview([_stats_row("2026-11-01"), _stats_row("2026-11-07")])
    assert "01 Nov to 07 Nov 2026" in str(o.chart)


# --------------------------------------------------------------------------- batches


def test_batch_rows_name_a_missing_subject() -> None:
    """A batch without a subject is listed as '(no subject)'."""
    (row,) = views.batch_rows([readmodels.summary(subject="", status="accepted")])
    assert (row.subject, row.tone) == ("(no subject)", "pending")


def test_timeline_orders_entries_of_one_second_causally() -> None:
    """Within a second: accepted, the attempt, then sent before delivered."""
    second = T0.replace(microsecond=0)
    log = readmodels.recipient(
        attempts=[readmodels.step(0, "sg", "sent", T0 + timedelta(milliseconds=300))],
        events=[readmodels.event(second, "delivered"), readmodels.event(second, "sent")],
    )
    entries = views.timeline(T0, log)
    assert [e.what for e in entries] == ["Accepted: queued", "Attempt 1: sent", "Sent", "Delivered"]


def test_timeline_numbers_attempts_and_resends_from_one() -> None:
    """Attempts and re-sends count from 0; both show as 1 to people."""
    log = readmodels.recipient(
        attempts=[readmodels.step(0, "sg", "rejected", T0 + timedelta(seconds=1))],
        resends=[readmodels.step(0, "mg", "accepted", T0 + timedelta(seconds=2))],
    )
    entries = views.timeline(T0, log)
    assert [(e.what, e.provider) for e in entries[1:]] == [
        ("Attempt 1: refused", "SendGrid"),
        ("Re-send 1: accepted", "Mailgun"),
    ]


def test_timeline_tells_how_an_unclear_call_was_settled() -> None:
    """A call with no clear answer is checked against the provider's evidence, then told as
    confirmed sent or not: "SendGrid timed out → confirmed not sent → Mailgun delivered"."""
    at = T0 + timedelta(seconds=1)
    steps = [
        dataclasses.replace(readmodels.step(0, "sg", "resolved", at), resolution="not_accepted"),
        dataclasses.replace(readmodels.step(1, "mg", "resolved", at), resolution="accepted"),
        dataclasses.replace(readmodels.step(2, "mg", "resolved", at), resolution="partial"),
        readmodels.step(3, "sg", "ambiguous", at),
    ]
    entries = views.timeline(T0, readmodels.recipient(attempts=steps))
    assert [e.what for e in entries[1:]] == [
        "Attempt 1: confirmed not sent",
        "Attempt 2: confirmed sent",
        "Attempt 3: confirmed sent to some recipients only",
        "Attempt 4: no clear answer (timed out, cut off, server error): checking if it was sent",
    ]
    assert entries[1].tone == views.tone("failed")


def test_timeline_labels_a_bare_message_id() -> None:
    """An event whose detail is the provider's message id says so."""
    log = readmodels.recipient(
        events=[readmodels.event(T0, "sent", detail="abc")], message_ids={"sg": "abc"}
    )
    entries = views.timeline(T0, log)
    assert entries[-1].detail == "message id abc"


def test_log_rows_name_the_providers_tried() -> None:
    """Provider codes become provider names, with each one's result."""
    log = readmodels.recipient(
        state="success", event="delivered", providers={"sg": "dropped", "mg": "delivered"}
    )
    (row,) = views.log_rows([log], T0)
    assert row.providers == [("Mailgun", "delivered", None), ("SendGrid", "dropped", None)]


def test_provider_result_splits_off_the_detail() -> None:
    """'dropped: Spam Content' is the result 'dropped' with its detail."""
    assert views.provider_result("dropped: Spam Content") == ("dropped", "Spam Content")


def test_batch_detail_is_in_flight_while_recipients_are_queued() -> None:
    """A batch with queued recipients is in flight; its sender shows name and address."""
    b = views.batch_detail(
        readmodels.overview(
            header=readmodels.header(sender={"email": "shop@example.com", "name": "Shop"}),
            status="dispatched",
            counts={"queued": 1, "success": 0, "failed": 0},
        )
    )
    assert (b.in_flight, b.sender) == (True, "Shop <shop@example.com>")


# --------------------------------------------------------------------------- forms


def test_parse_form_keeps_the_last_of_repeated_fields() -> None:
    """A repeated name keeps its last value; blanks are kept."""
    assert views.parse_form(b"a=1&a=2&b=&c=x+y") == {"a": "2", "b": "", "c": "x y"}


def test_parse_form_refuses_too_many_fields() -> None:
    """More fields than any dashboard form has is refused."""
    with pytest.raises(ValueError, match="Max number of fields"):
        views.parse_form("&".join(f"f{i}=1" for i in range(100)).encode())


def test_parse_form_refuses_bytes_that_are_not_utf8() -> None:
    """A body that is not UTF-8 is refused."""
    with pytest.raises(UnicodeDecodeError, match="can't decode byte 0xff"):
        views.parse_form(b"a=\xff")


def test_recipient_entries_split_on_commas_and_lines() -> None:
    """Commas and line breaks both separate; blanks go; quoted commas stay."""
    text = 'a@example.com, b@example.com\r\n\n"Doe, Jo" <jo@example.com>,'
    assert views.recipient_entries(text) == [
        "a@example.com",
        "b@example.com",
        '"Doe, Jo" <jo@example.com>',
    ]


def test_compose_body_passes_the_api_validation() -> None:
    """A filled-in form becomes a body POST /v1/batches accepts."""
    body = views.compose_body(
        {
            "from": "Shop <shop@example.com>",
            "to": "a@example.com\nb@example.com",
            "subject": "Hi",
            "text": "Hello",
            "html": "",
            "bulk": "on",
        }
    )
    parsed = validation.parse_batch_request(body, max_recipients=10)
    assert (parsed.accepted, parsed.message.bulk, parsed.message.html) == (2, True, None)


def test_compose_body_uses_lf_line_breaks() -> None:
    """Textarea CRLF line breaks become LF in the bodies."""
    body = views.compose_body({"text": "a\r\nb", "html": "<p>a</p>\r\n"})
    assert (body["text"], body["html"]) == ("a\nb", "<p>a</p>\n")


def test_compose_body_sends_blank_fields_as_absent() -> None:
    """Blank from and subject are absent, so validation says they are required."""
    body = views.compose_body({"from": "  ", "subject": " ", "text": "x", "to": "a@example.com"})
    with pytest.raises(validation.InvalidRequest) as caught:
        validation.parse_batch_request(body, max_recipients=10)
    assert caught.value.fields == {"from": "is required", "subject": "is required"}


def test_form_errors_name_the_recipient_entry() -> None:
    """An error on to[1] names the second address as typed."""
    errors = views.form_errors({"to[1]": "bad address"}, ["a@example.com", "b@"])
    assert errors == {"to": ["b@: bad address"]}


def test_form_errors_read_as_sentences() -> None:
    """A bare 'is required' becomes 'Subject is required'."""
    assert views.form_errors({"subject": "is required"}) == {"subject": ["Subject is required"]}


def test_form_errors_outside_the_form_go_to_the_form() -> None:
    """A path that is no form field (headers.X) is reported for the whole form."""
    assert views.form_errors({"headers.X-A": "bad header"}) == {"form": ["Bad header"]}


def test_send_errors_explain_an_outage_at_form_level() -> None:
    """An outage is one form-level message that says nothing was accepted."""
    errors = views.send_errors("unavailable", "cassandra unavailable: x", None)
    assert list(errors) == ["form"]
    assert "was not accepted" in errors["form"][0]


def test_send_errors_sentence_case_other_messages() -> None:
    """A quota refusal without fields is shown as a sentence."""
    errors = views.send_errors("quota_exceeded", "this batch would pass the daily quota", None)
    assert errors == {"form": ["This batch would pass the daily quota"]}


def test_send_errors_say_how_long_to_wait_over_the_request_rate() -> None:
    """A 429 for the request rate says the batch was not sent, that the message is kept,
    and how many seconds to wait (the answer's Retry-After)."""
    errors = views.send_errors("rate_limited", "too many requests", None, wait="37")

    (text,) = errors["form"]
    assert "not accepted" in text and "kept" in text and "wait 37 seconds" in text


def test_a_suppression_the_recipient_made_says_so_instead_of_offering_removal() -> None:
    """An unsubscribe (marked, or from before marks) shows who may lift it; a sender's own
    entry and a bounce stay removable."""
    rows = views.suppression_rows(
        [
            {"email": "a@x.org", "reason": "unsubscribe", "source": "sg", "by_recipient": None},
            {"email": "b@x.org", "reason": "manual", "source": "api", "by_recipient": "complained"},
            {"email": "c@x.org", "reason": "manual", "source": "api", "by_recipient": None},
            {"email": "d@x.org", "reason": "bounce/bounce", "source": "sg", "by_recipient": None},
        ]
    )

    assert [bool(r.by_recipient) for r in rows] == [True, True, False, False]
    assert "unsubscribed" in rows[0].by_recipient and "operator" in rows[0].by_recipient
    assert "spam" in rows[1].by_recipient


def test_send_errors_prefer_field_errors() -> None:
    """With field errors, they are what the form shows."""
    errors = views.send_errors("invalid_fields", "2 invalid", {"subject": "is required"})
    assert errors == {"subject": ["Subject is required"]}


def test_accepted_notice_reports_what_happened_to_recipients() -> None:
    """After sending: queued, suppressed and rejected counts in one sentence."""
    notice = views.accepted_notice(
        {"sent": "1", "accepted": "3", "suppressed": "1", "rejected": "2"}
    )
    assert notice == (
        "Batch accepted: 3 recipients queued; 1 skipped (on your suppression list); "
        "2 rejected (not a valid address)."
    )


def test_accepted_notice_tells_addresses_left_out_by_the_cooldown_apart() -> None:
    """Addresses inside the cooldown are counted among the suppressed, and told apart."""
    notice = views.accepted_notice(
        {"sent": "1", "accepted": "1", "suppressed": "3", "cooling": "2"}
    )
    assert notice == (
        "Batch accepted: 1 recipient queued; 1 skipped (on your suppression list); "
        "2 skipped (mailed within your cooldown)."
    )


def test_accepted_notice_needs_the_sent_marker() -> None:
    """A batch page opened normally shows no notice."""
    assert views.accepted_notice({"accepted": "3"}) is None


# --------------------------------------------------------------------------- keys, suppressions


def _key(key_id: str, created: str, *, revoked: bool = False) -> dict[str, object]:
    return {
        "key_id": key_id,
        "prefix": f"sd_live_{key_id}_",
        "name": f"k{key_id}",
        "created_at": created,
        "last_used_at": None,
        "revoked": revoked,
    }


def test_key_rows_list_live_keys_first_newest_first() -> None:
    """Live keys come before revoked ones, each group newest first."""
    rows = views.key_rows(
        [
            _key("a", "2026-11-01T00:00:00+00:00"),
            _key("b", "2026-11-03T00:00:00+00:00", revoked=True),
            _key("c", "2026-11-02T00:00:00+00:00"),
        ]
    )
    assert [r.key_id for r in rows] == ["c", "a", "b"]


def test_key_rows_say_never_for_an_unused_key() -> None:
    """A key never used shows 'never'."""
    (row,) = views.key_rows([_key("a", "2026-11-01T00:00:00+00:00")])
    assert row.last_used == "never"


def test_key_rows_show_scopes_and_expiry() -> None:
    view = {**_key("a", "2026-11-01T00:00:00+00:00"), "scopes": ["read", "send"]}
    view["expires_at"] = "2027-01-01T00:00:00+00:00"

    (row,) = views.key_rows([view])

    assert (row.scopes, row.expires_iso) == ("read, send", "2027-01-01T00:00:00+00:00")


def test_the_key_form_reads_ticked_scopes_and_a_lifetime() -> None:
    now = datetime(2026, 11, 25, tzinfo=UTC)

    scopes, expires = views.key_form(
        {"scope_send": "on", "scope_keys": "on", "lifetime": "30"}, now
    )

    assert scopes == ["send", "keys"]
    assert expires == now + timedelta(days=30)


@pytest.mark.parametrize("lifetime", ["0", "7", "²", "", "-30"])
def test_the_key_form_lets_a_key_live_forever_unless_a_listed_lifetime_is_chosen(
    lifetime: str,
) -> None:
    assert views.key_form({"lifetime": lifetime}, datetime.now(UTC)) == ([], None)


def test_revoked_notice_names_a_revoked_key_of_the_user() -> None:
    """The notice names the key by name and prefix."""
    rows = views.key_rows([_key("a", "2026-11-01T00:00:00+00:00", revoked=True)])
    assert views.revoked_notice(rows, "a") == (
        "Key “ka” (sd_live_a_…) revoked: requests with it get 401 within a second."
    )


def test_revoked_notice_ignores_keys_that_are_not_revoked() -> None:
    """A crafted link naming a live or unknown key shows nothing."""
    rows = views.key_rows([_key("a", "2026-11-01T00:00:00+00:00")])
    assert (views.revoked_notice(rows, "a"), views.revoked_notice(rows, "zzz")) == (None, None)


def test_suppression_notice_only_for_an_address() -> None:
    """A crafted added= that is not an address shows nothing."""
    assert views.suppression_notice({"added": "Your account is locked"}) is None


def test_suppression_notice_confirms_a_removal() -> None:
    """Removing an address says future batches will send to it."""
    notice = views.suppression_notice({"removed": "a@example.com"})
    assert (
        notice == "a@example.com was removed from the list: future batches will send to it again."
    )


@pytest.mark.parametrize("crafted", ["Your account is locked", "a..b", "-x.example.com", ""])
def test_domain_notice_only_for_a_domain_name(crafted: str) -> None:
    """A crafted added= that is not a domain name shows nothing."""
    assert views.domain_notice({"added": crafted}) is None


def test_domain_notice_names_the_normalised_domain() -> None:
    """The confirmation repeats the domain as stored (lower case)."""
    notice = views.domain_notice({"verified": "Shop.Example.COM"})
    assert notice is not None and notice.startswith("shop.example.com is verified")


def test_domain_rows_carry_the_record_to_publish() -> None:
    """Each row shows the TXT record's name and value, and whether it is verified."""
    found = SendingDomain("example.com", "tok", datetime(2026, 11, 1, tzinfo=UTC), None)
    (row,) = views.domain_rows([found], RULES)
    assert (row.record_name, row.record_value) == (
        "_safedelivr.example.com",
        domains.record_value("tok"),
    )
    assert row.verified is False and row.verified_when == "—" and row.state == "pending"


def test_domain_rows_say_since_when_a_record_is_missing_and_when_it_unverifies() -> None:
    at = datetime(2026, 11, 1, tzinfo=UTC)
    found = SendingDomain("example.com", "tok", at, at, seen_at=at, missing_since=at)
    (row,) = views.domain_rows([found], RULES)
    assert (row.state, row.missing_since, row.unverified_after) == (
        "record_missing",
        "2026-11-01 00:00:00 UTC",
        "2026-11-04 00:00:00 UTC",
    )


def test_domain_rows_say_how_many_others_claim_a_domain() -> None:
    at = datetime(2026, 11, 1, tzinfo=UTC)
    found = SendingDomain("example.com", "tok", at, at)
    theirs = OtherClaims(2, 1, (("example.com", "verified"), ("example.com", "pending")), False)
    (row,) = views.domain_rows([found], RULES, {"example.com": theirs})
    (alone,) = views.domain_rows([found], RULES, {"example.com": None})
    assert row.others == "Also claimed by 2 other accounts: 1 claim is verified."
    assert row.other_claims == theirs.claims and alone.others is None


def test_suppression_source_names_the_provider() -> None:
    """A provider code becomes '<Provider> event'; our own sources are named."""
    assert [views.suppression_source(s) for s in ("sg", "dashboard", "api")] == [
        "SendGrid event",
        "Dashboard",
        "API",
    ]
