"""The ``/v1`` API's wire shapes as pydantic models: the request bodies the handlers validate
with, the answers they give, and the one error envelope.

These models are the contract: ``services.api.openapi`` builds ``/v1/openapi.json`` from
them, request bodies are checked against them before anything else (strict types: no
coercion of ``"true"`` to ``true``), and the integration suite validates real answers with
them. The batch body's models (``BatchIn`` and its parts) and :func:`field_errors` live in
``shared.delivery.batch_in``, below the API, and are re-exported here: there the rules a
schema cannot say (``shared.delivery.validation``: address syntax, header injection,
de-duplication) are the model's validators, and its errors are worded as the rules word
them. Answers are rendered from these models (``shared.infra.http.Answer``); a page's entries
are built :func:`trusted`.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import orjson
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from shared.accounts.preferences import MAX_COOLDOWN

# Re-exported: the document names them, handlers check bodies with them.
from shared.delivery.batch_in import AddressIn as AddressIn
from shared.delivery.batch_in import AttachmentIn as AttachmentIn
from shared.delivery.batch_in import BatchIn as BatchIn
from shared.delivery.batch_in import BodyIn
from shared.delivery.batch_in import RecipientIn as RecipientIn
from shared.delivery.batch_in import TrackingIn as TrackingIn
from shared.delivery.batch_in import field_errors as field_errors
from shared.infra.http import ApiError
from shared.templates.template_limits import MAX_SOURCE as MAX_TEMPLATE_PART

M = TypeVar("M", bound=BaseModel)


_In = BodyIn


class _Out(BaseModel):
    # By name too: ``from`` is the alias of ``from_``.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


def trusted(model: type[M], fields: dict[str, Any]) -> M:
    """An answer built from fields this code computed itself, not validated: the entries of
    a paged answer (up to 1,000 a page), where validating costs about 3 µs an entry and an
    unvalidated instance about 0.9. ``fields`` becomes the instance's own ``__dict__`` (a
    dict, not keywords: repacking them cost another 1.4 µs), and holds declared fields only
    (nothing goes to the extras).

    Tests run this same path: the served bytes are held to the models by the OpenAPI
    contract test (an undeclared key or a wrong type fails it), and a unit test holds a
    trusted entry byte-equal to the validated one. Sets pydantic's instance slots itself
    (``__pydantic_fields_set__`` and the others), as ``model_construct`` does at about the
    cost of validating; uv.lock pins pydantic."""
    built = model.__new__(model)
    object.__setattr__(built, "__dict__", fields)
    object.__setattr__(built, "__pydantic_fields_set__", set(fields))
    object.__setattr__(built, "__pydantic_extra__", {})
    object.__setattr__(built, "__pydantic_private__", None)
    return built


# --------------------------------------------------------------------------- requests


class SuppressionIn(_In):
    """``POST /v1/suppressions``."""

    email: str = Field(max_length=320, examples=["ann@example.com"])
    reason: str = Field("manual", min_length=1, max_length=200)


class KeyIn(_In):
    """``POST /v1/keys``."""

    name: str = Field("api", min_length=1, max_length=100, examples=["billing-service"])
    scopes: list[Literal["send", "read", "keys", "operator"]] | None = Field(
        None,
        min_length=1,
        examples=[["send"]],
        description="What the key may do (default: send, read and keys, as far as the calling "
        "key holds them): send batches and manage suppressions, read batches, logs and stats, "
        "manage keys, operate the deployment. Never more than the calling key holds.",
    )
    expires_at: AwareDatetime | None = Field(
        None,
        strict=False,  # from JSON's RFC 3339 text
        examples=["2027-01-31T00:00:00Z"],
        description="When the key stops working (RFC 3339, with a time zone); none: never.",
    )


class AlertsIn(_In):
    webhook_url: str | None = Field(
        None, description="A Slack/Discord-compatible incoming webhook; empty: none."
    )
    cool_off_s: int | None = Field(None, ge=10, le=86_400)
    queue_depth: int | None = Field(None, ge=1)
    error_burst: int | None = Field(
        None, ge=1, description="Provider-side failures of one provider in a minute."
    )
    email_to: str | list[str] | None = Field(
        None, description="Operators' addresses; alerts are mailed to them through Safedelivr."
    )
    email_from: str | None = Field(None, description="The sender of alert mail.")


class CapacityIn(_In):
    enabled: bool | None = None
    initial_per_day: int | None = Field(
        None, ge=10, description="Recipients a day a new sending domain starts at."
    )
    max_bounce_rate: float | None = Field(None, ge=0.001, le=1, examples=[0.05])
    max_complaint_rate: float | None = Field(None, ge=0.0001, le=1, examples=[0.003])


class SettingsPatch(_In):
    """``PATCH /v1/settings``: any of the live settings; provider names or codes."""

    providers: dict[str, Any] | None = Field(
        None,
        examples=[
            {"chain": ["mailgun", "sendgrid"]},
            {"sendgrid": {"paused": True, "rate_limit_per_s": 20}},
            {"max_attempts": 4},
            {"health": {"open_below": 0.5, "demote_below": 0.8, "cool_down_s": 30}},
        ],
    )
    alerts: AlertsIn | None = None
    capacity: CapacityIn | None = Field(
        None,
        description="Daily capacity per sending domain: warm-up for new domains, halved by "
        "hard-bounce or complaint rates over the limits; mail over it is held, not dropped.",
    )


class CooldownIn(_In):
    seconds: int | None = Field(
        None,
        ge=0,
        le=MAX_COOLDOWN,
        description="Least seconds between two mails to one address (0: no cooldown).",
    )
    per_category: bool | None = Field(
        None, description="Count each category apart (a receipt need not wait for a newsletter)."
    )


class PreferencesIn(_In):
    """``PATCH /v1/preferences``: what your batches get when a request does not say."""

    tracking: TrackingIn | None = None
    unsubscribe: bool | None = Field(
        None, description="List-Unsubscribe with one-click unsubscribe in every batch."
    )
    cooldown: CooldownIn | None = None


class TrackingOut(_Out):
    opens: bool
    clicks: bool


class CooldownOut(_Out):
    seconds: int
    per_category: bool


class PreferencesView(_Out):
    tracking: TrackingOut
    unsubscribe: bool
    cooldown: CooldownOut


class DomainIn(_In):
    """``POST /v1/domains``."""

    domain: str = Field(min_length=1, max_length=253, examples=["example.com"])


class CampaignIn(_In):
    """``POST /v1/campaigns``: a draft sending a template to a list."""

    name: str = Field(min_length=1, max_length=200)
    template_id: str = Field(description="One of your templates (its live version is sent).")
    list_id: str = Field(description="One of your contact lists.")
    from_: str | AddressIn = Field(alias="from", description="The sender.")
    data: dict[str, Any] | None = Field(
        None,
        description="Template variables shared by every recipient; the others come from "
        "each contact's fields (empty when a contact has none).",
    )
    rate: int | None = Field(
        None, ge=1, le=100_000, description="Recipients a second (default 2,000)."
    )
    send_at: str | None = Field(None, description="RFC 3339; absent: when it is scheduled.")


class CampaignScheduleIn(_In):
    """``POST /v1/campaigns/{id}/schedule``: optionally, a new ``send_at``."""

    send_at: str | None = None


class CampaignProgress(_Out):
    batches: int
    released: int = Field(description="Recipients handed to batches so far.")
    skipped: int = Field(description="Contacts left out (suppressed, unsubscribed, cooling).")
    queued: int | None = None
    success: int | None = None
    failed: int | None = None


class CampaignOut(_Out):
    id: str
    name: str
    template_id: str
    list_id: str
    from_: dict[str, Any] = Field(alias="from")
    data: dict[str, Any]
    rate: int
    send_at: str | None
    state: Literal["draft", "scheduled", "sending", "paused", "sent", "cancelled"]
    reason: str | None = Field(None, description="Why it paused by itself, if it did.")
    created_at: str
    updated_at: str | None
    progress: CampaignProgress


class CampaignList(_Out):
    data: list[CampaignOut]


class WebhookIn(_In):
    """``POST /v1/webhooks``."""

    url: str = Field(
        min_length=1, max_length=2000, examples=["https://hooks.example.com/safedelivr"]
    )
    events: list[str] | None = Field(
        None,
        max_length=20,
        description='Event types to receive; omitted, `[]` or `["*"]`: every type.',
        examples=[["recipient.delivered", "recipient.bounced"]],
    )


class WebhookPatch(_In):
    """``PATCH /v1/webhooks/{id}``: what is given changes; `enabled: true` on a disabled
    endpoint clears its failures and sends what waits."""

    url: str | None = Field(None, min_length=1, max_length=2000)
    events: list[str] | None = Field(None, max_length=20)
    enabled: bool | None = None


# --------------------------------------------------------------------------- answers


class RejectedOut(_Out):
    email: str
    reason: str


class TemplateRefOut(_Out):
    id: str
    version: int
    canary_version: int | None = Field(
        None, description="During a canary rollout: the version its share of recipients get."
    )


class Accepted(_Out):
    """202: the batch is stored and will be sent."""

    batch_id: str = Field(examples=["6c1f0a2e-cb0b-11f0-8000-0242ac120002"])
    accepted: int
    suppressed: list[str]
    rejected: list[RejectedOut]
    skipped: list[RejectedOut] = Field(
        description="Every address not mailed by choice, with why: its suppression's reason, "
        "or `cooldown` (mailed less than your cooldown ago). `suppressed` lists the same "
        "addresses."
    )
    status: Literal["scheduled"] | None = Field(
        None, description="`scheduled` when the batch has a `send_at`."
    )
    send_at: str | None = None
    template: TemplateRefOut | None = Field(
        None, description="The template version(s) a template batch sends."
    )
    priority: Literal["transactional", "bulk"] = Field(description="The batch's lane.")
    warnings: list[str] | None = Field(
        None,
        description="What the batch goes without that it would have by default: a `bulk` "
        "lane batch with `shared: true` carries no one-click unsubscribe (it needs one copy "
        "per recipient). Absent when there is nothing to say.",
    )


class BatchItem(_Out):
    batch_id: str
    subject: str
    recipients: int
    created_at: str
    status: str


class CancelledOut(_Out):
    batch_id: str
    status: Literal["cancelled"]


class BatchList(_Out):
    data: list[BatchItem]
    next_cursor: str | None


class AttachmentOut(_Out):
    """A file a batch's message carries: what it is, never its content."""

    filename: str
    content_type: str
    size: int = Field(description="Bytes, decoded.")
    disposition: Literal["attachment", "inline"]
    content_id: str | None = None


class BatchView(_Out):
    batch_id: str
    status: str
    created_at: str
    subject: str
    from_: dict[str, Any] = Field(alias="from")
    bulk: bool
    priority: Literal["transactional", "bulk"]
    recipients: int
    chunks: int
    send_at: str | None = Field(None, description="When a scheduled batch is (was) to go.")
    template: TemplateRefOut | None = None
    counts: dict[str, int]
    events: dict[str, int]
    failure_reasons: dict[str, int]
    attachments: list[AttachmentOut] = Field(
        default_factory=list, description="The message's files: name, type and size only."
    )


class LogEntry(_Out):
    log_id: str
    email: str
    name: str | None
    state: Literal["queued", "success", "failed"]
    event: str
    providers: dict[str, str]
    status: dict[str, bool]
    message_ids: dict[str, str]
    reason: str | None
    updated_at: str | None
    template_version: int | None = Field(
        None, description="The template version this recipient got (template batches)."
    )
    attempts: list[dict[str, Any]]
    resends: list[dict[str, Any]]
    timeline: list[dict[str, Any]]


class LogsPage(_Out):
    data: list[LogEntry]
    next_cursor: str | None


class StatsDay(_Out):
    date: str
    queued: int
    success: int
    failed: int
    bounced: int
    complained: int
    opened: int
    """Recipients who opened at least once (unique)."""
    clicked: int
    """Recipients who clicked at least once (unique)."""
    opens_total: int
    """Every open, however often one recipient opens."""
    clicks_total: int
    machine_opens: int
    """Opens among opens_total made by machines: image proxies that fetch every pixel (Gmail,
    Yahoo, Apple Mail Privacy Protection)."""
    machine_clicks: int
    """Clicks among clicks_total made by link scanners (Safe Links, Proofpoint, ...)."""


class StatsPage(_Out):
    data: list[StatsDay]


class Suppression(_Out):
    email: str
    reason: str
    source: str | None = None
    event_id: str | None = None
    created_at: str | None = None
    by_recipient: Literal["unsubscribed", "complained", "provider_list"] | None = Field(
        None,
        description="The recipient's own act that put the address here: their "
        "`unsubscribed` or `complained`, or `provider_list` (a provider dropped mail for its "
        "own list and did not say which). Only an operator key may lift such an entry; "
        "null for bounces and the addresses you added, which you may delete.",
    )


class SuppressionList(_Out):
    data: list[Suppression]
    next_cursor: str | None


class KeyView(_Out):
    key_id: str
    prefix: str
    name: str
    created_at: str
    last_used_at: str | None
    revoked: bool
    scopes: list[str] = Field(examples=[["read", "send"]])
    expires_at: str | None


class KeyList(_Out):
    data: list[KeyView]


class KeyCreated(_Out):
    key: str = Field(description="The key itself: shown once, store it now.")
    name: str
    scopes: list[str] = Field(examples=[["send"]])
    expires_at: str | None
    note: str


class DomainRecord(_Out):
    type: Literal["TXT"]
    name: str = Field(examples=["_safedelivr.example.com"])
    value: str = Field(examples=["safedelivr-verification=3q2-7Zs..."])


class DomainCapacity(_Out):
    limit_today: int = Field(description="Recipients mail from this domain may reach today.")
    sent_today: int
    state: Literal["new", "warming_up", "penalised"]
    why: str = Field(examples=["hard-bounce rate 7.5% over 5.0% today"])


DomainState = Literal["pending", "verified", "record_missing", "unverified"]


class DomainChecks(_Out):
    last_seen_at: str | None = Field(
        description="The last check that found the record (verifying is one)."
    )
    last_checked_at: str | None = Field(description="The last periodic look-up.")
    missing_since: str | None = Field(
        description="The first look-up of the current run that did not find the record."
    )
    unverified_after: str | None = Field(
        description="When a domain whose record is missing is unverified, at the first "
        "look-up after (publish the record again before)."
    )
    unverified_at: str | None
    reason: str | None = Field(description="Why the domain was unverified.")


class OtherClaim(_Out):
    domain: str = Field(description="The name claimed: this domain, a parent or a subdomain.")
    state: DomainState


class OtherClaims(_Out):
    accounts: int = Field(description="Other accounts holding these claims (never who).")
    verified: int = Field(description="How many of the claims are verified: they can send.")
    claims: list[OtherClaim]
    more: bool = Field(description="More claims than listed.")


class DomainView(_Out):
    domain: str = Field(examples=["example.com"])
    capacity: DomainCapacity | None = Field(
        description="Its sending capacity today (mail from exactly this domain); null while "
        "the operators have capacity off."
    )
    state: DomainState = Field(
        description="`pending` until verified; `verified`; `record_missing` (still verified: "
        "the record was not found since `checks.missing_since`); `unverified` (it stayed "
        "missing: sending from it is refused until it is verified again)."
    )
    verified: bool
    verified_at: str | None
    created_at: str
    record: DomainRecord = Field(description="Publish this record, then verify the domain.")
    checks: DomainChecks = Field(
        description="The record is looked up again periodically: it must stay published."
    )
    other_claims: OtherClaims | None = Field(
        description="Other accounts' claims on this domain, its parents and its subdomains "
        "(null until yours is verified). A verified one can send as it: remove the "
        "`_safedelivr` TXT values that are not yours, and it is unverified after the grace."
    )


class DomainList(_Out):
    data: list[DomainView]


class DomainClaim(_Out):
    domain: str
    user_id: str
    login: str | None
    state: DomainState
    created_at: str
    verified_at: str | None
    last_seen_at: str | None
    last_checked_at: str | None
    missing_since: str | None
    unverified_at: str | None
    reason: str | None


class DomainClaimList(_Out):
    domain: str
    data: list[DomainClaim]


class ProviderView(_Out):
    name: str = Field(examples=["sendgrid"])
    code: str = Field(examples=["sg"])
    health: float = Field(
        ge=0,
        le=1,
        description="1 - (EWMA error rate of calls + EWMA share of reported provider-side "
        "failures + a latency penalty).",
    )
    circuit: Literal["closed", "open", "half_open"]
    paused: bool
    position: int | None = Field(description="Place in the operator's running chain.")
    rate_limit_per_s: float | None = Field(
        description="The client-side limit for every process together; null: none is set."
    )
    current_rate_per_s: float = Field(description="Calls per second, all processes.")
    latency_seconds: float | None
    calls_2min: int
    reported_failures: float = Field(
        description="EWMA share of the recipient events its webhooks reported that were its "
        "own failures (drops on its side; deferrals count half), over the last two minutes."
    )
    max_recipients: int = Field(description="Recipients one request to it may carry.")
    max_message_bytes: int
    capabilities: list[str] = Field(
        examples=[["per_recipient_substitutions", "signed_webhooks", "query_api"]]
    )


class ProviderList(_Out):
    data: list[ProviderView]


class SettingsChange(_Out):
    name: str = Field(examples=["providers.sg.paused"])
    old: str | None = Field(examples=["false"])
    new: str = Field(examples=["true"])
    by: str = Field(examples=["key:3f2a9c0d1e2b"])
    at: str


class SettingsView(_Out):
    """The live settings in force (provider names as PATCH takes them), and recent changes."""

    providers: dict[str, Any] = Field(
        examples=[
            {
                "chain": ["sendgrid", "mailgun"],
                "max_attempts": 6,
                "sendgrid": {"code": "sg", "paused": False},
                "mailgun": {"code": "mg", "paused": False},
            }
        ]
    )
    alerts: dict[str, Any] = Field(
        examples=[
            {
                "webhook_url": None,
                "cool_off_s": 600,
                "queue_depth": 10000,
                "error_burst": 50,
                "email_to": [],
                "email_from": None,
            }
        ]
    )
    capacity: dict[str, Any] = Field(
        examples=[
            {
                "enabled": False,
                "initial_per_day": 1000,
                "max_bounce_rate": 0.05,
                "max_complaint_rate": 0.003,
            }
        ]
    )
    changes: list[SettingsChange]
    announced: bool | None = Field(
        None,
        description="After a PATCH: whether the change was announced to every process "
        "(applied within a second); if not, each applies it at its next reload (30 s).",
    )


class DeadLetterView(_Out):
    id: str = Field(examples=["1795000000000-3f2a9c0d1e2b4a5c6d7e8f90"])
    routing_key: str = Field(examples=["sg.6c1f0a2e-cb0b-11f0-8000-0242ac120002.retry.2"])
    reason: str = Field(examples=["delivery_limit"], description="Why RabbitMQ parked it.")
    queue: str = Field(examples=["safedelivr.sg"])
    deaths: int
    dead_at: str
    state: Literal["waiting", "replaying", "replayed"]
    replayed_at: str | None
    payload: dict[str, Any] = Field(
        description="What it carries: kind, ids, attempt, provider, size and a preview."
    )


class DeadLetterList(_Out):
    data: list[DeadLetterView]
    next_cursor: str | None


class LimitView(_Out):
    """The limit a refusal is about."""

    name: str = Field(
        examples=["lists"],
        description="A cap: `lists`, `templates`, `versions` (per template), `campaigns`, "
        "`imports` (in progress at once) or `contacts_per_import`; `batch_bytes`, what one "
        "batch may store; or a template's limit: `time`, `cpu_time`, `memory`, "
        "`integer_size`, `result_size`, `format_width`, `output_size`, `source_size`, `range` "
        "or `nesting`.",
    )
    value: int | None = Field(
        description="The most allowed; null for a template's `time`, `cpu_time` and `memory`, "
        "which are the server's settings (the message says how much), and for a batch the "
        "cluster refused below the size this server was told it holds."
    )


class ErrorDetail(_Out):
    code: str = Field(examples=["invalid_fields"])
    message: str
    fields: dict[str, str] | None = Field(
        None, description="Per-field messages, keyed like `to[3]` or `headers.X-Foo`."
    )
    batch_id: str | None = Field(
        None,
        description="With `acceptance_unknown` (503): the batch that may or may not have been "
        "accepted. `GET /v1/batches/{id}` tells: `cancelled` is never sent, `accepted`, "
        "`scheduled` or `dispatched` is accepted, `pending` is not decided yet (look again: "
        "the API cancels it within about a minute unless it was accepted).",
    )
    limit: LimitView | None = Field(
        None,
        description="With a refusal at a cap (409 `too_many_…`, 413 `too_many_contacts`) or "
        "with `template_does_not_render` (422): which limit, and its value.",
    )


class ErrorBody(_Out):
    """Every error of ``/v1``."""

    error: ErrorDetail


# --------------------------------------------------------------------------- checking


def checked(model: type[M], body: object) -> M:
    """``body`` as ``model``, or a 422 ``invalid_fields`` naming each field and its problem."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ApiError(
            422, "invalid_fields", "the request has invalid fields", fields=field_errors(exc)
        ) from None


class WebhookView(_Out):
    """A webhook endpoint. ``secret`` is shown whole only when it is created or rotated."""

    id: str
    url: str
    events: list[str]
    enabled: bool
    created_at: str
    secret: str | None = Field(None, examples=["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])
    secret_hint: str
    previous_secret_expires_at: str | None
    disabled_at: str | None
    disabled_reason: str | None
    failing_since: str | None
    failures: int


class WebhookList(_Out):
    data: list[WebhookView]


class WebhookDelivery(_Out):
    """One attempt to deliver a message."""

    msg_id: str
    type: str
    attempt: int
    status: int | None
    error: str | None
    duration_ms: int
    at: str


class WebhookDeliveries(_Out):
    data: list[WebhookDelivery]


class WebhookReplay(_Out):
    """202: the message will be delivered once more (``queued``), or a replay of it was
    already waiting and this request joined it (``queued: false``, its ``replay_id``)."""

    msg_id: str
    replay_id: str
    queued: bool


class ListIn(_In):
    """``POST /v1/lists``."""

    name: str = Field(
        min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$", examples=["Newsletter"]
    )


class ImportProgress(_Out):
    """Rows read so far, and what became of them."""

    rows_read: int
    added: int
    updated: int = Field(description="Already in the list: their fields were replaced.")
    invalid: int
    duplicates: int = Field(description="Repeated within the file (the first one counts).")
    suppressed: int = Field(description="Suppressed for all of your mail: not added.")
    unsubscribed: int = Field(description="Unsubscribed from this list: not added.")
    over_limit: int = Field(description="Past the file's row limit or the list's size limit.")


class ImportProblem(_Out):
    """A row that was not simply added."""

    row: int = Field(description="1-based, as a spreadsheet numbers it (the header is row 1).")
    email: str
    kind: Literal["invalid", "duplicate", "existing", "suppressed", "unsubscribed", "over_limit"]
    reason: str


class ImportView(_Out):
    """A CSV import: its state, progress and the first problems with their rows."""

    id: str
    list_id: str
    state: Literal["queued", "running", "done", "failed"]
    reason: str | None = Field(
        description="Why it failed (an import that stopped making "
        "progress, e.g. the API restarted, reads as failed)."
    )
    created_at: str
    updated_at: str
    finished_at: str | None
    progress: ImportProgress
    problems: list[ImportProblem]


class ContactListView(_Out):
    """A contact list with its contact count and its latest import."""

    id: str = Field(
        description="Also the `list` that mail to this list names, so its "
        "unsubscribes are this list's (`/v1/suppressions?list=<id>`)."
    )
    name: str
    created_at: str
    contacts: int
    latest_import: ImportView | None


class ContactListList(_Out):
    data: list[ContactListView]


class ListContactView(_Out):
    email: str
    name: str | None
    fields: dict[str, str]
    added_at: str


class ListContactsPage(_Out):
    data: list[ListContactView]
    next_cursor: str | None


class ImportAccepted(_Out):
    """202: the file will be imported in the background; follow it at its import."""

    import_id: str
    list_id: str
    state: str


# --------------------------------------------------------------------------- templates

#: Version numbers are Cassandra ints.
_MAX_VERSION = 2**31 - 1
#: A subject's source (its rendering is checked again when mail is sent).
MAX_TEMPLATE_SUBJECT = 2000


class TemplateVersionIn(_In):
    """``POST /v1/templates/{id}/versions``: a new, immutable version (not live until it is
    published). Sources are Jinja2 (sandboxed): ``{{ first_name }}``, ``{% if ... %}``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "subject": "Welcome, {{ first_name }}",
                    "html": "<p>Hello {{ first_name }}!</p>",
                    "sample": {"first_name": "Ann"},
                }
            ]
        }
    )

    subject: str = Field(min_length=1, max_length=MAX_TEMPLATE_SUBJECT)
    html: str | None = Field(
        None, max_length=MAX_TEMPLATE_PART, description="At least one of html and text."
    )
    text: str | None = Field(
        None,
        max_length=MAX_TEMPLATE_PART,
        description="Without it, the text part is derived from the html.",
    )
    sample: dict[str, Any] = Field(
        default_factory=dict,
        description="Data the version must render with before it may be published; the "
        "default data of a preview.",
    )

    @field_validator("sample")
    @classmethod
    def _storable(cls, sample: dict[str, Any]) -> dict[str, Any]:
        try:
            orjson.dumps(sample)
        except TypeError:  # orjson stores at most 254 levels of nesting
            raise ValueError("the sample is nested too deeply") from None
        return sample

    @model_validator(mode="after")
    def _a_body(self) -> TemplateVersionIn:
        if not self.html and not self.text:
            raise ValueError("give html, text or both")
        return self


class TemplateIn(TemplateVersionIn):
    """``POST /v1/templates``: a template with its version 1."""

    name: str = Field(min_length=1, max_length=200, examples=["welcome"])


class PublishIn(_In):
    """``POST /v1/templates/{id}/publish``."""

    version: int = Field(ge=1, le=_MAX_VERSION)
    canary_percent: float | None = Field(
        None,
        gt=0,
        lt=100,
        description="Send this share of the template's mail with `version`, the rest with the "
        "live version, until a version is published without it.",
    )


class PreviewIn(_In):
    """``POST /v1/templates/{id}/preview``."""

    data: dict[str, Any] | None = Field(
        None, description="What to render with (default: the version's sample)."
    )
    version: int | None = Field(
        None, ge=1, le=_MAX_VERSION, description="Default: the live version."
    )


class CanaryOut(_Out):
    version: int
    percent: float
    since: str


class TemplateItem(_Out):
    id: str
    name: str
    created_at: str
    live_version: int | None = Field(description="null until a version is published.")
    canary: CanaryOut | None


class TemplateList(_Out):
    data: list[TemplateItem]


class TemplateCreated(TemplateItem):
    """201: the template and its version 1 (publish it to make it live)."""

    version: int = Field(examples=[1])


class TemplateVersionOut(_Out):
    version: int
    subject: str
    created_at: str
    live: bool
    canary: bool


class RolloutCountsOut(_Out):
    """What one version's recipients came to while the canary was judged."""

    sent: int
    provider_failures: int
    hard_bounces: int
    complaints: int


class RolloutSidesOut(_Out):
    canary: RolloutCountsOut
    live: RolloutCountsOut


class RolloutOut(_Out):
    """A canary rollout's audited verdict."""

    at: str = Field(description="When the verdict was reached.")
    canary_version: int
    live_version: int = Field(description="The version the canary was compared with.")
    decision: Literal["promote", "rollback"] = Field(
        description="`promote`: the canary became the live version; `rollback`: it was "
        "withdrawn and the live version kept."
    )
    reason: str = Field(description="Why, in words (the metric and rates that decided it).")
    counts: RolloutSidesOut


class TemplateView(TemplateItem):
    """A template, its versions and its canary rollouts' verdicts, newest first."""

    versions: list[TemplateVersionOut]
    rollouts: list[RolloutOut]


class VersionCreated(_Out):
    """201: the new version's number (publish it to make it live)."""

    id: str
    version: int


class PreviewOut(_Out):
    """The version rendered with the data."""

    version: int
    subject: str
    html: str | None
    text: str | None
