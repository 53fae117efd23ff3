"""Pure view-model builders for the dashboard: read-model dicts in, template-ready values out.

Nothing here does I/O. The handlers in :mod:`services.api.dashboard.pages` fetch with the same
read models as the ``/v1`` API (:mod:`services.api.queries`, the stores) and hand the results
to these functions; the templates only lay them out.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from markupsafe import Markup

from services.api.dashboard.charts import Series, stacked_bars
from services.api.domain_claims import state_of
from services.api.session_store import safe_next
from shared.accounts import domains
from shared.accounts.domain_checks import unverified_after
from shared.audience.suppressions import made_by_recipient
from shared.core.addresses import AddressError, normalize_email, split_address_list
from shared.core.catalog import CATALOG
from shared.core.digits import natural
from shared.core.webhook_events import KIND_RANK

if TYPE_CHECKING:
    from services.api.domain_claims import OtherClaims
    from services.api.queries import BatchOverview, BatchSummary, RecipientLog, Step
    from shared.accounts.domain_checks import CheckRules
    from shared.accounts.domains import SendingDomain

#: Provider codes as people know them.
PROVIDER_NAMES: Mapping[str, str] = {
    **{code: info.name for code, info in CATALOG.items()},
    "safedelivr": "Safedelivr",
}

#: The overview chart's series, bottom to top (Okabe-Ito colours: safe for colour blindness,
#: each at least 3:1 against the white background).
CHART_SERIES: tuple[Series, ...] = (
    Series("success", "Delivered", "#007a5a"),
    Series("failed", "Failed", "#c2410c"),
    Series("awaiting", "Awaiting outcome", "#5f6b7a"),
)

_GOOD = frozenset({"success", "delivered", "completed", "sent", "opened", "clicked", "resolved"})
_BAD = frozenset(
    {
        "failed",
        "bounced",
        "dropped",
        "complained",
        "unsubscribed",
        "revoked",
        "incomplete",
        "rejected",
        "cancelled",
    }
)
_WAIT = frozenset({"deferred", "sending", "claimed", "calling", "ambiguous", "planned"})
_FORM_FIELDS = frozenset({"from", "to", "subject", "text", "html", "bulk"})
_INDEXED = re.compile(r"^(?P<field>[a-z_]+)\[(?P<index>\d+)\]")
#: Same-second order of provider events (``sent`` before ``delivered`` before ``bounced``...).
_KIND_ORDER: dict[str, int] = {str(kind): rank for kind, rank in KIND_RANK.items()}
#: Most fields read from one submitted form (ours have at most eight).
MAX_FORM_FIELDS = 32


# --------------------------------------------------------------------------- formatting


def tone(value: str | None) -> str:
    """The badge style of a state, event or status: ``ok``, ``bad``, ``warn`` or ``pending``."""
    if value in _GOOD:
        return "ok"
    if value in _BAD:
        return "bad"
    if value in _WAIT:
        return "warn"
    return "pending"


def provider_name(code: str) -> str:
    return PROVIDER_NAMES.get(code, code)


def parse_time(value: datetime | str | None) -> datetime | None:
    """An aware UTC datetime from a datetime (naive means UTC) or an ISO string."""
    if value is None:
        return None
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def fmt_time(value: datetime | str | None) -> str:
    """``2026-11-01 14:03:07 UTC``, or an em dash for no time."""
    when = parse_time(value)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC") if when else "—"


def iso(value: datetime | str | None) -> str:
    """The machine-readable form for ``<time datetime=...>``."""
    when = parse_time(value)
    return when.isoformat() if when else ""


def percent(numerator: int, denominator: int) -> str | None:
    """``2.5%`` (one decimal), or None when there is nothing to divide by."""
    if denominator <= 0:
        return None
    return f"{numerator / denominator * 100:.1f}%"


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def login_url(next_path: str | None) -> str:
    """The "Log in with GitHub" target, carrying a safe post-login destination."""
    return "/auth/github/login?" + urlencode({"next": safe_next(next_path)})


def initials(name: str | None, login: str) -> str:
    """Up to two letters for the avatar badge (no third-party image requests)."""
    words = [w for w in re.split(r"[\s._-]+", name or login) if w]
    letters = "".join(w[0] for w in words[:2]).upper()
    return letters or "?"


# --------------------------------------------------------------------------- overview


@dataclass(frozen=True, slots=True)
class DayRow:
    day: date
    queued: int
    success: int
    failed: int
    awaiting: int
    bounced: int
    complained: int
    opened: int
    clicked: int
    opens_total: int = 0
    clicks_total: int = 0
    machine_opens: int = 0
    machine_clicks: int = 0


@dataclass(frozen=True, slots=True)
class Overview:
    days: list[DayRow]
    totals: dict[str, int]
    bounce_rate: str | None
    complaint_rate: str | None
    chart: Markup
    start: date
    end: date

    @property
    def empty(self) -> bool:
        return self.totals["queued"] == 0 and self.totals["success"] == 0


def day_rows(rows: Iterable[Mapping[str, Any]]) -> list[DayRow]:
    """Rows of ``shared.delivery.stats.zero_filled`` as typed days; ``awaiting`` = accepted minus
    outcomes.

    Outcomes are counted on the day they happen, so a day's outcomes can exceed what it
    accepted (mail accepted just before midnight); ``awaiting`` never goes below zero.
    """
    out = []
    for r in rows:
        n = {k: int(r.get(k, 0)) for k in ("queued", "success", "failed")}
        out.append(
            DayRow(
                day=date.fromisoformat(str(r["date"])),
                queued=n["queued"],
                success=n["success"],
                failed=n["failed"],
                awaiting=max(n["queued"] - n["success"] - n["failed"], 0),
                bounced=int(r.get("bounced", 0)),
                complained=int(r.get("complained", 0)),
                opened=int(r.get("opened", 0)),
                clicked=int(r.get("clicked", 0)),
                opens_total=int(r.get("opens_total", 0)),
                clicks_total=int(r.get("clicks_total", 0)),
                machine_opens=int(r.get("machine_opens", 0)),
                machine_clicks=int(r.get("machine_clicks", 0)),
            )
        )
    return out


def overview(rows: Sequence[Mapping[str, Any]]) -> Overview:
    """The overview page: the stacked chart, its table, totals and the period's rates.

    Bounce rate is bounced ÷ accepted; complaint rate is complained ÷ delivered (the usual
    definitions: a complaint needs a delivered message).
    """
    days = day_rows(rows)
    if not days:
        raise ValueError("the overview needs at least one day")
    keys = (
        "queued",
        "success",
        "failed",
        "awaiting",
        "bounced",
        "complained",
        "opened",
        "clicked",
        "opens_total",
        "clicks_total",
        "machine_opens",
        "machine_clicks",
    )
    totals = {k: sum(int(getattr(d, k)) for d in days) for k in keys}
    start, end = days[0].day, days[-1].day
    period = f"{start.strftime('%d %b')} to {end.strftime('%d %b %Y')} (UTC days)"
    summary = (
        f"{plural(totals['success'], 'recipient')} delivered, {totals['failed']:,} failed and "
        f"{totals['awaiting']:,} awaiting an outcome"
    )
    chart = stacked_bars(
        [d.day for d in days],
        [{"success": d.success, "failed": d.failed, "awaiting": d.awaiting} for d in days],
        CHART_SERIES,
        title=f"Recipients per day, {period}",
        desc=f"Stacked bars per day: delivered, failed, awaiting outcome. In total {summary}. "
        "The same numbers are in the table below the chart.",
        id_prefix="stats-chart",
    )
    return Overview(
        days=days,
        totals=totals,
        bounce_rate=percent(totals["bounced"], totals["queued"]),
        complaint_rate=percent(totals["complained"], totals["success"]),
        chart=chart,
        start=start,
        end=end,
    )


# --------------------------------------------------------------------------- batches


@dataclass(frozen=True, slots=True)
class BatchRow:
    batch_id: str
    subject: str
    recipients: int
    created: str
    created_iso: str
    status: str
    tone: str


def batch_rows(items: Iterable[BatchSummary]) -> list[BatchRow]:
    """Items of ``queries.list_for_user`` for the batch table."""
    return [
        BatchRow(
            batch_id=str(i.batch_id),
            subject=i.subject or "(no subject)",
            recipients=i.recipients,
            created=fmt_time(i.created_at),
            created_iso=iso(i.created_at),
            status=i.status or "unknown",
            tone=tone(i.status),
        )
        for i in items
    ]


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    at: datetime
    what: str
    provider: str | None
    detail: str | None
    tone: str
    rank: int = 0
    """Order among entries of the same second: acceptance, attempts, then events by kind."""

    @property
    def when(self) -> str:
        return fmt_time(self.at)

    @property
    def when_iso(self) -> str:
        return self.at.isoformat()


@dataclass(frozen=True, slots=True)
class LogRow:
    log_id: str
    email: str
    name: str | None
    state: str
    event: str
    providers: list[tuple[str, str, str | None]]
    """``(provider name, result, detail)``: the detail is in the timeline too."""
    reason: str | None
    updated: str
    updated_iso: str
    timeline: list[TimelineEntry] = field(default_factory=list)

    @property
    def state_tone(self) -> str:
        return tone(self.state)

    @property
    def event_tone(self) -> str:
        return tone(self.event)


#: What an attempt's state says, in words (a resolved one by its resolution).
_ATTEMPT_WORDS = {
    "planned": "planned",
    "claimed": "about to call",
    "calling": "calling",
    "accepted": "accepted",
    "rejected": "refused",
    "ambiguous": "no clear answer (timed out, cut off, server error): checking if it was sent",
}
_RESOLUTION_WORDS = {
    "accepted": "confirmed sent",
    "partial": "confirmed sent to some recipients only",
    "not_accepted": "confirmed not sent",
}


def attempt_outcome(state: str, resolution: str | None) -> str:
    """An attempt's outcome as the timeline says it: a call with no clear answer is checked
    against the provider's evidence (its webhooks, its query API), then confirmed."""
    if state == "resolved":
        return _RESOLUTION_WORDS.get(resolution or "", "resolved")
    return _ATTEMPT_WORDS.get(state, state)


def _attempt_entries(attempts: Iterable[Step], *, resend: bool) -> list[TimelineEntry]:
    out = []
    for a in attempts:
        if a.at is None:
            continue
        number = a.attempt + 1  # attempts count from 0, people from 1
        out.append(
            TimelineEntry(
                at=a.at,
                what=f"{'Re-send' if resend else 'Attempt'} {number}: "
                f"{attempt_outcome(a.state, a.resolution)}",
                provider=provider_name(a.provider) or None,
                detail=a.error or None,
                tone=tone("failed" if a.resolution == "not_accepted" else a.state),
                rank=2 if resend else 1,
            )
        )
    return out


def _event_detail(detail: object, message_ids: set[str]) -> str | None:
    if not detail:
        return None
    text = str(detail)
    return f"message id {text}" if text in message_ids else text


def timeline(accepted_at: datetime, log: RecipientLog) -> list[TimelineEntry]:
    """One recipient's history, oldest first: acceptance, its chunk's provider attempts, the
    provider events (``log_events``) and any single-recipient re-sends (``send_attempts``).
    An event whose detail is just the provider's message id says so.
    """
    ids = set(log.message_ids.values())
    entries = [TimelineEntry(accepted_at, "Accepted: queued", None, None, "pending")]
    entries += _attempt_entries(log.attempts, resend=False)
    entries += _attempt_entries(log.resends, resend=True)
    for e in log.events:
        kind = e.kind or "unknown"
        entries.append(
            TimelineEntry(
                at=e.at,
                what=kind.capitalize(),
                provider=provider_name(e.provider) or None,
                detail=_event_detail(e.detail, ids),
                tone=tone(kind),
                rank=10 + _KIND_ORDER.get(kind, 0),
            )
        )
    # Providers stamp events in whole seconds, our own records to the millisecond: within a
    # second, order by what must have come first (accepted, attempted, then the events).
    return sorted(entries, key=lambda t: (t.at.replace(microsecond=0), t.rank, t.at))


def provider_result(value: str) -> tuple[str, str | None]:
    """A ``providers`` map value such as ``dropped: Spam Content`` as (result, detail)."""
    result, sep, detail = value.partition(":")
    return (result.strip(), detail.strip() or None) if sep else (value, None)


def log_rows(items: Iterable[RecipientLog], accepted_at: datetime) -> list[LogRow]:
    """Items of ``queries.logs_page``, each with its timeline."""
    return [
        LogRow(
            log_id=str(i.log_id),
            email=i.email,
            name=i.name,
            state=i.state or "queued",
            event=i.event or "queued",
            providers=[
                (provider_name(code), *provider_result(result))
                for code, result in sorted(i.providers.items())
            ],
            reason=i.reason,
            updated=fmt_time(i.updated_at),
            updated_iso=iso(i.updated_at),
            timeline=timeline(accepted_at, i),
        )
        for i in items
    ]


@dataclass(frozen=True, slots=True)
class BatchDetail:
    batch_id: str
    subject: str
    sender: str
    status: str
    tone: str
    reason: str | None
    created: str
    created_iso: str
    bulk: bool
    recipients: int
    chunks: int
    counts: dict[str, int]
    events: list[tuple[str, int]]
    failure_reasons: list[tuple[str, int]]
    attachments: list[tuple[str, str, int]] = field(default_factory=list)
    """Each file's name, type and decoded size (never its content)."""

    @property
    def in_flight(self) -> bool:
        return self.counts.get("queued", 0) > 0 and self.status != "failed"


def batch_detail(view: BatchOverview) -> BatchDetail:
    """A batch's overview (with its header's failure reason) for the batch page."""
    header, message = view.header, view.header.message
    name, email = message.sender.name, message.sender.email
    return BatchDetail(
        batch_id=str(header.batch_id),
        subject=message.subject or "(no subject)",
        sender=f"{name} <{email}>" if name else email,
        status=view.status,
        tone=tone(view.status),
        reason=header.reason,
        created=fmt_time(header.created_at),
        created_iso=iso(header.created_at),
        bulk=message.bulk,
        recipients=header.recipient_count,
        chunks=header.chunk_count,
        counts=dict(view.counts),
        events=sorted(view.events.items(), key=lambda kv: (-kv[1], kv[0])),
        failure_reasons=list(view.failure_reasons.items()),
        attachments=[(a.filename, a.content_type, a.size) for a in message.attachments],
    )


# --------------------------------------------------------------------------- forms


def parse_form(raw: bytes) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body; the last value of a repeated name wins.

    Raises:
        ValueError: not UTF-8, or more than :data:`MAX_FORM_FIELDS` fields.
    """
    text = raw.decode("utf-8")
    pairs = parse_qsl(
        text, keep_blank_values=True, strict_parsing=False, max_num_fields=MAX_FORM_FIELDS
    )
    return dict(pairs)


def recipient_entries(text: str) -> list[str]:
    """The ``to`` box: addresses separated by commas and/or line breaks, blanks dropped."""
    entries: list[str] = []
    for line in text.splitlines():
        entries.extend(split_address_list(line))
    return entries


def _body_text(value: str | None) -> str | None:
    """Browsers send textarea line breaks as CRLF; mail bodies use LF here."""
    if value is None or not value.strip():
        return None
    return value.replace("\r\n", "\n").replace("\r", "\n")


def compose_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The compose form as the JSON body ``POST /v1/batches`` takes (validated there)."""
    sender = (form.get("from") or "").strip()
    return {
        "from": sender or None,
        "to": recipient_entries(form.get("to") or ""),
        "subject": (form.get("subject") or "").strip() or None,
        "text": _body_text(form.get("text")),
        "html": _body_text(form.get("html")),
        "bulk": form.get("bulk") in ("on", "true", "1"),
    }


_LABELS = {
    "from": "From",
    "to": "To",
    "subject": "Subject",
    "text": "Text",
    "html": "HTML",
    "email": "Email",
    "reason": "Reason",
    "name": "Name",
}


def _sentence(label: str, message: str) -> str:
    if message.startswith(("is ", "must ", "are ")):
        return f"{label} {message}"
    return message[:1].upper() + message[1:]


def form_errors(
    fields: Mapping[str, str],
    entries: Sequence[str] = (),
    form_fields: Collection[str] = _FORM_FIELDS,
) -> dict[str, list[str]]:
    """Validation field paths (``to[3]``, ``from.email``, ``subject``) as messages per form
    field (the send form's, unless ``form_fields`` names another form's); paths that belong
    to no form field are collected under ``form``.

    ``entries`` are the submitted recipients, so ``to[3]`` can name the address it is about.
    """
    out: dict[str, list[str]] = {}
    for path, message in fields.items():
        indexed = _INDEXED.match(path)
        name = indexed["field"] if indexed else re.split(r"[.\[]", path, maxsplit=1)[0]
        if name not in form_fields:
            name = "form"
        if indexed and name == "to":
            index = int(indexed["index"])
            what = entries[index] if index < len(entries) else f"entry {index + 1}"
            text = f"{what}: {message}"
        else:
            text = _sentence(_LABELS.get(name, name.capitalize()), message)
        out.setdefault(name, []).append(text)
    return out


#: Form-level explanations of send failures that concern no single field, by error code.
_SEND_FAILURES = {
    "idempotency_conflict": "This form was already submitted with different content. "
    "Submit it again to send it as a new batch.",
    "idempotency_in_progress": "This form was already submitted and is still being "
    "processed: check Batches before sending it again.",
    "unavailable": "Safedelivr could not reach its database or message broker, so the "
    "batch was not accepted. Your message is kept below: try again in a few seconds.",
}


def send_errors(
    code: str,
    message: str,
    fields: Mapping[str, str] | None,
    entries: Sequence[str] = (),
    *,
    wait: str | None = None,
) -> dict[str, list[str]]:
    """What the send form shows for a refused batch: field errors beside their fields, or
    one form-level explanation (idempotency replays, the request rate, quota, an outage);
    ``wait`` is the answer's Retry-After."""
    if fields:
        return form_errors(fields, entries)
    if code == "rate_limited":
        seconds = natural(wait or "") or 1
        return {
            "form": [
                "You are sending faster than your account's request rate allows, so this "
                f"batch was not accepted. Your message is kept below: wait "
                f"{plural(seconds, 'second')}, then send it again."
            ]
        }
    text = _SEND_FAILURES.get(code) or (message[:1].upper() + message[1:])
    return {"form": [text]}


def accepted_notice(params: Mapping[str, str]) -> str | None:
    """The one-line result shown on a batch page right after the send form redirected there."""
    if params.get("sent") != "1":
        return None
    counts = {
        k: v
        for k in ("accepted", "rejected", "suppressed", "cooling")
        if (v := natural(params.get(k, "0"))) is not None
    }
    parts = [f"Batch accepted: {plural(counts.get('accepted', 0), 'recipient')} queued"]
    # An address inside the cooldown is dropped as a suppressed one is (its reason apart).
    cooling = min(counts.get("cooling", 0), counts.get("suppressed", 0))
    if suppressed := counts.get("suppressed", 0) - cooling:
        parts.append(f"{suppressed:,} skipped (on your suppression list)")
    if cooling:
        parts.append(f"{cooling:,} skipped (mailed within your cooldown)")
    if counts.get("rejected"):
        parts.append(f"{counts['rejected']:,} rejected (not a valid address)")
    return "; ".join(parts) + "."


# --------------------------------------------------------------------------- keys, suppressions


@dataclass(frozen=True, slots=True)
class KeyRow:
    key_id: str
    prefix: str
    name: str
    created: str
    created_iso: str
    last_used: str
    last_used_iso: str
    revoked: bool
    scopes: str = ""
    expires: str = "never"
    expires_iso: str = ""


#: The dashboard's choices of a new key's lifetime, in days (0: it does not expire).
KEY_LIFETIMES: tuple[tuple[int, str], ...] = (
    (0, "never expires"),
    (30, "30 days"),
    (90, "90 days"),
    (365, "1 year"),
)


def key_form(form: Mapping[str, str], now: datetime) -> tuple[list[str], datetime | None]:
    """The scopes (``scope_<name>`` checkboxes) and expiry (``lifetime`` in days) a key form
    asks for; an unknown lifetime is refused by the caller's check, as "must be one of"."""
    scopes = [s for s in ("send", "read", "keys") if form.get(f"scope_{s}") == "on"]
    days = natural(form.get("lifetime", "0"))
    if days is None or days not in dict(KEY_LIFETIMES):
        days = 0
    return scopes, (now + timedelta(days=days)) if days else None


def key_rows(views: Iterable[Mapping[str, Any]]) -> list[KeyRow]:
    """``accounts.key_view`` dicts, live keys first, newest first within each group."""
    ordered = sorted(views, key=lambda v: str(v.get("created_at") or ""), reverse=True)
    ordered.sort(key=lambda v: bool(v.get("revoked")))
    return [
        KeyRow(
            key_id=str(v["key_id"]),
            prefix=str(v["prefix"]),
            name=str(v.get("name") or ""),
            created=fmt_time(v.get("created_at")),
            created_iso=iso(v.get("created_at")),
            last_used=fmt_time(v.get("last_used_at")) if v.get("last_used_at") else "never",
            last_used_iso=iso(v.get("last_used_at")),
            revoked=bool(v.get("revoked")),
            scopes=", ".join(v.get("scopes") or ()),
            expires=fmt_time(v.get("expires_at")) if v.get("expires_at") else "never",
            expires_iso=iso(v.get("expires_at")),
        )
        for v in ordered
    ]


def suppression_source(source: str) -> str:
    """Who put an address on the list: a provider's webhook, the API or the dashboard."""
    if source in ("api", "dashboard"):
        return {"api": "API", "dashboard": "Dashboard"}[source]
    if source in PROVIDER_NAMES:
        return f"{PROVIDER_NAMES[source]} event"
    return source or "—"


def revoked_notice(rows: Sequence[KeyRow], key_id: str | None) -> str | None:
    """The confirmation after a revoke, only for a key of this user that is revoked."""
    row = next((r for r in rows if key_id and r.key_id == key_id and r.revoked), None)
    if row is None:
        return None
    return f"Key “{row.name}” ({row.prefix}…) revoked: requests with it get 401 within a second."


def suppression_notice(params: Mapping[str, str]) -> str | None:
    """The confirmation after adding or removing an address (only for a valid address)."""
    messages = {
        "added": "{} is suppressed: future batches will skip it.",
        "removed": "{} was removed from the list: future batches will send to it again.",
        "absent": "{} was not on the list.",
    }
    for key, message in messages.items():
        value = params.get(key)
        if value is None:
            continue
        try:
            return message.format(normalize_email(value))
        except AddressError:
            return None
    return None


@dataclass(frozen=True, slots=True)
class SuppressionRow:
    email: str
    reason: str
    source: str
    added: str
    added_iso: str
    by_recipient: str = ""
    """Why the user cannot remove it (the recipient made it), in words; empty: they can."""


#: What stands in for the Remove button of an entry the recipient made.
_BY_RECIPIENT = {
    "unsubscribed": "The recipient unsubscribed: only an operator can lift it",
    "complained": "The recipient reported spam: only an operator can lift it",
    "provider_list": "On a provider's own list: only an operator can lift it",
}


def suppression_rows(rows: Iterable[Mapping[str, Any]]) -> list[SuppressionRow]:
    """Rows of ``SuppressionStore.page``."""
    return [
        SuppressionRow(
            email=str(r["email"]),
            reason=str(r.get("reason") or ""),
            source=suppression_source(str(r.get("source") or "")),
            added=fmt_time(r.get("created_at")),
            added_iso=iso(r.get("created_at")),
            by_recipient=_BY_RECIPIENT.get(made_by_recipient(r) or "", ""),
        )
        for r in rows
    ]


@dataclass(frozen=True, slots=True)
class DomainRow:
    domain: str
    verified: bool
    state: str
    """``pending``, ``verified``, ``record_missing`` or ``unverified``."""
    verified_when: str
    verified_iso: str
    added: str
    added_iso: str
    record_name: str
    record_value: str
    last_seen: str
    last_seen_iso: str
    missing_since: str
    missing_since_iso: str
    unverified_after: str
    unverified_after_iso: str
    reason: str
    others: str | None
    """Other accounts' claims, in a sentence (None: none, or not shown)."""
    other_claims: tuple[tuple[str, str], ...]


def domain_rows(
    found: Iterable[SendingDomain],
    rules: CheckRules,
    others: Mapping[str, OtherClaims | None] | None = None,
) -> list[DomainRow]:
    """A user's sending domains, each with the TXT record that proves it, the state of its
    checks and what may be said of other accounts' claims on it."""
    rows = []
    for d in found:
        after = unverified_after(d, rules)
        theirs = (others or {}).get(d.domain)
        rows.append(
            DomainRow(
                domain=d.domain,
                verified=d.verified,
                state=state_of(d),
                verified_when=fmt_time(d.verified_at),
                verified_iso=iso(d.verified_at),
                added=fmt_time(d.created_at),
                added_iso=iso(d.created_at),
                record_name=domains.record_name(d.domain),
                record_value=domains.record_value(d.token),
                last_seen=fmt_time(d.seen_at),
                last_seen_iso=iso(d.seen_at),
                missing_since=fmt_time(d.missing_since),
                missing_since_iso=iso(d.missing_since),
                unverified_after=fmt_time(after),
                unverified_after_iso=iso(after),
                reason=d.unverified_reason or "",
                others=others_sentence(theirs),
                other_claims=theirs.claims if theirs else (),
            )
        )
    return rows


def others_sentence(theirs: OtherClaims | None) -> str | None:
    """``Also claimed by 2 other accounts (1 claim verified).``; None when there is none."""
    if theirs is None or not theirs.claims:
        return None
    accounts = f"{theirs.accounts} other account" + ("s" if theirs.accounts != 1 else "")
    verified = f"{theirs.verified} claim" + (" is" if theirs.verified == 1 else "s are")
    return f"Also claimed by {accounts}: {verified} verified."


def domain_notice(params: Mapping[str, str]) -> str | None:
    """The confirmation after adding, verifying or removing a domain (only for a valid name:
    the page never repeats arbitrary text from its URL)."""
    messages = {
        "added": "{} was added: publish its TXT record, then press Verify.",
        "verified": "{} is verified: batches may now be sent from it and its subdomains.",
        "removed": "{} was removed: batches can no longer be sent from it.",
    }
    for key, message in messages.items():
        value = params.get(key)
        if value is None:
            continue
        try:
            return message.format(domains.normalize_domain(value))
        except domains.DomainError:
            return None
    return None
