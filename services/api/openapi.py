"""``/v1/openapi.json`` (OpenAPI 3.1) and the ``/v1/docs`` page, built from ``schema``'s models
and :data:`OPERATIONS`, the table of every ``/v1`` route with its errors.

Nothing here is written by hand twice: the request and answer shapes are the models the
handlers validate with, and a test fails when the app's routes and this table disagree, or
when the committed ``services/api/openapi.json`` is not what :func:`document` builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from services.api import schema

_REF = "#/components/schemas/{model}"

#: Why each error status happens, shared by every operation that can answer it.
ERRORS: dict[int, str] = {
    400: "Malformed JSON, a bad cursor or a bad Idempotency-Key.",
    401: "Missing or invalid API key: unknown, revoked, expired or wrong (one body for every "
    "case).",
    403: "The API key lacks the scope this operation needs (`send`, `read`, `keys` or "
    "`operator`), or "
    "would grant a scope it does not hold; or (`suppressed_by_recipient`) the suppression to "
    "delete is the recipient's own, which only an operator key may lift.",
    404: "No such resource, or not yours.",
    409: "The Idempotency-Key was used with another body, or its first request is still "
    "in progress (retry after `Retry-After`); for a new key or domain, the user holds the "
    "most allowed; for a list import, another import of the list is in progress. A cap "
    "reached (`too_many_lists`, `too_many_templates`, `too_many_versions`, "
    "`too_many_campaigns`, `too_many_imports`) names it and its value in `error.limit`; "
    "deleting one (or an import ending) frees its place.",
    413: "The body is over the size cap (refused while it streams in); for a list import, "
    "also `too_many_contacts`: more rows than one import may carry (`error.limit`); for a "
    "batch, also `batch_too_large`: what it would store is more than one batch may hold "
    "(`error.limit`), and nothing was charged or stored.",
    415: "The body is not JSON (for a CSV import: not `text/csv`).",
    422: "Invalid fields: `error.fields` names each one (a `from` outside your verified "
    "domains included).",
    429: "Over the key's request rate or the user's daily recipient quota; retry after "
    "`Retry-After` seconds.",
    503: "Cassandra or RabbitMQ is unavailable, or the API is overloaded (for a template: "
    "`renderer_unavailable`, every template renderer busy); nothing was "
    "accepted: retry (with the same Idempotency-Key) after `Retry-After`. Except "
    "`acceptance_unknown` (a batch sent without an Idempotency-Key): the batch named by "
    "`error.batch_id` may have been accepted; look it up before sending it again.",
}
_ALWAYS = (401, 403, 429, 503)


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "query" | "path" | "header"
    description: str
    type: str = "string"
    required: bool = False


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str
    summary: str
    answer: type[BaseModel] | None
    status: int = 200
    body: type[BaseModel] | None = None
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = ()
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


_CURSOR = Param("cursor", "query", "`next_cursor` of the previous page.")
_LIST = Param(
    "list",
    "query",
    "A list or campaign name (for a contact list: its id): its own suppressions (one-click "
    "unsubscribes from mail that named it) instead of the ones that stop all of your mail.",
)
_DOMAIN = Param("domain", "path", "The domain, e.g. `example.com`.", required=True)
_BATCH_ID = Param("batch_id", "path", "The batch's id (a time UUID).", required=True)
_WEBHOOK_ID = Param("endpoint_id", "path", "The endpoint's id.", required=True)
_LIST_ID = Param("list_id", "path", "The list's id.", required=True)
_CSV_BODY = {
    "requestBody": {
        "required": True,
        "description": "A CSV file (UTF-8; comma, semicolon or tab separated). The first "
        "row names the columns when one of them is `email` (or `e-mail`, `email address`, "
        "`address`); otherwise the column whose first cell is an address holds the "
        "addresses and the others are named by their position from 0: `field0`, `field1`... "
        "(the address column's number is skipped). Every other column becomes a field of the "
        'contact (its substitutions), `name` its display name. Cells are quoted with `"` '
        '(a doubled `""` inside is a quote); rows end in LF, CRLF or CR.',
        "content": {"text/csv": {"schema": {"type": "string"}}},
    }
}
_TEMPLATE_ID = Param("template_id", "path", "The template's id.", required=True)
_LETTER_ID = Param("letter_id", "path", "The dead letter's id, from the listing.", required=True)
_CAMPAIGN_ID = Param("campaign_id", "path", "The campaign's id.", required=True)


def _campaign_step(operation_id: str, step: str, summary: str, description: str) -> Operation:
    return Operation(
        operation_id,
        "post",
        f"/v1/campaigns/{{campaign_id}}/{step}",
        summary,
        schema.CampaignOut,
        body=schema.CampaignScheduleIn if step == "schedule" else None,
        params=(_CAMPAIGN_ID,),
        errors=(400, 404, 409, 413, 415, 422) if step == "schedule" else (404, 409),
        description=description,
    )


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "create_batch",
        "post",
        "/v1/batches",
        "Submit a batch: one message, many recipients",
        schema.Accepted,
        status=202,
        body=schema.BatchIn,
        params=(
            Param(
                "Idempotency-Key",
                "header",
                "1-255 visible ASCII characters. A retry with the same key and body gets the "
                "first answer and never a second batch; with another body, 409.",
            ),
        ),
        errors=(400, 409, 413, 415, 422),
        description="A 202 means the batch is stored and will be sent exactly once per "
        "recipient: retries of a request that timed out are safe with an Idempotency-Key.",
    ),
    Operation(
        "list_batches",
        "get",
        "/v1/batches",
        "Your batches, newest first",
        schema.BatchList,
        params=(Param("limit", "query", "1-500, default 20.", "integer"), _CURSOR),
        errors=(400, 422),
    ),
    Operation(
        "get_batch",
        "get",
        "/v1/batches/{batch_id}",
        "A batch with counts per state and event",
        schema.BatchView,
        params=(_BATCH_ID,),
        errors=(404,),
    ),
    Operation(
        "cancel_batch",
        "post",
        "/v1/batches/{batch_id}/cancel",
        "Cancel a scheduled batch before its time",
        schema.CancelledOut,
        params=(_BATCH_ID,),
        errors=(404, 409),
        description="Only a batch still `scheduled` can be cancelled (409 once it started); "
        "cancelling it again answers the same. Its recipients are given back to the day's "
        "quota.",
    ),
    Operation(
        "list_batch_logs",
        "get",
        "/v1/batches/{batch_id}/logs",
        "Each recipient's state, provider attempts and timeline",
        schema.LogsPage,
        params=(
            _BATCH_ID,
            Param("state", "query", "Only `queued`, `success` or `failed` recipients."),
            Param("limit", "query", "1-500, default 100.", "integer"),
            _CURSOR,
        ),
        errors=(400, 404, 422),
    ),
    Operation(
        "list_suppressions",
        "get",
        "/v1/suppressions",
        "Addresses you never send to",
        schema.SuppressionList,
        params=(Param("limit", "query", "1-1000, default 100.", "integer"), _CURSOR, _LIST),
        errors=(400, 422),
    ),
    Operation(
        "create_suppression",
        "post",
        "/v1/suppressions",
        "Suppress an address",
        schema.Suppression,
        status=201,
        body=schema.SuppressionIn,
        errors=(400, 413, 415, 422),
    ),
    Operation(
        "delete_suppression",
        "delete",
        "/v1/suppressions/{email}",
        "Send to an address again",
        None,
        status=204,
        params=(Param("email", "path", "The suppressed address.", required=True), _LIST),
        errors=(404, 422),
        description="You may delete the addresses you added and bounces (a bounce that "
        "happens again suppresses the address again). An unsubscribe or a complaint is the "
        "recipient's own (`by_recipient` in the listing): deleting it is a 403 "
        "`suppressed_by_recipient` naming the address and why, unless the key holds the "
        "`operator` scope.",
    ),
    Operation(
        "get_preferences",
        "get",
        "/v1/preferences",
        "Your sending preferences",
        schema.PreferencesView,
        description="What your batches get when a request does not say: open and click "
        "tracking and the one-click unsubscribe header (all off until you turn them on), and "
        "your cooldown: the least time between two mails to one address (0: none). A "
        "recipient inside the cooldown is not sent to; the 202 lists it in `skipped` with the "
        "reason `cooldown`.",
    ),
    Operation(
        "update_preferences",
        "patch",
        "/v1/preferences",
        "Change your sending preferences",
        schema.PreferencesView,
        body=schema.PreferencesIn,
        errors=(400, 413, 415, 422),
        description="Fields left out stay as they are. A change applies to batches accepted "
        "from a few seconds later.",
    ),
    Operation(
        "list_domains",
        "get",
        "/v1/domains",
        "Your sending domains and their verification records",
        schema.DomainList,
    ),
    Operation(
        "add_domain",
        "post",
        "/v1/domains",
        "Add a sending domain (then publish its TXT record and verify it)",
        schema.DomainView,
        status=201,
        body=schema.DomainIn,
        errors=(400, 409, 413, 415, 422),
        description="Batches are accepted only `from` a verified domain or a subdomain of "
        "one. Adding a domain again returns it as it is.",
    ),
    Operation(
        "get_domain",
        "get",
        "/v1/domains/{domain}",
        "One sending domain",
        schema.DomainView,
        params=(_DOMAIN,),
        errors=(404,),
    ),
    Operation(
        "verify_domain",
        "post",
        "/v1/domains/{domain}/verify",
        "Look up the domain's TXT record now and verify it",
        schema.DomainView,
        params=(_DOMAIN,),
        errors=(404, 422),
        description="422 `not_verified` while the record cannot be found; 503 when DNS "
        "cannot be asked.",
    ),
    Operation(
        "delete_domain",
        "delete",
        "/v1/domains/{domain}",
        "Remove a sending domain",
        None,
        status=204,
        params=(_DOMAIN,),
        errors=(404,),
    ),
    Operation(
        "list_domain_claims",
        "get",
        "/v1/domain-claims/{domain}",
        "Every account's claim on a domain, its parents and subdomains (operator keys)",
        schema.DomainClaimList,
        params=(_DOMAIN,),
        errors=(404,),
    ),
    Operation(
        "create_campaign",
        "post",
        "/v1/campaigns",
        "Create a campaign (a draft): a template sent to a contact list",
        schema.CampaignOut,
        status=201,
        body=schema.CampaignIn,
        errors=(400, 409, 413, 415, 422),
        description="409 `too_many_campaigns` when you have as many campaigns as you may, "
        "ended ones included (`error.limit`); deleting one frees its place.",
    ),
    Operation(
        "list_campaigns",
        "get",
        "/v1/campaigns",
        "Your campaigns, newest first",
        schema.CampaignList,
    ),
    Operation(
        "get_campaign",
        "get",
        "/v1/campaigns/{campaign_id}",
        "A campaign with its progress: batches, recipients released and per state",
        schema.CampaignOut,
        params=(_CAMPAIGN_ID,),
        errors=(404,),
    ),
    Operation(
        "delete_campaign",
        "delete",
        "/v1/campaigns/{campaign_id}",
        "Delete a draft, or a campaign that was sent or cancelled",
        None,
        status=204,
        params=(_CAMPAIGN_ID,),
        errors=(404, 409),
        description="409 `campaign_state` while it is scheduled, sending or paused: cancel "
        "it first. Its batches stay.",
    ),
    _campaign_step(
        "schedule_campaign",
        "schedule",
        "Schedule a draft: it starts at its send_at (now when it has none)",
        "The body may set a new `send_at`. It goes out in batches of the template's live "
        "version at the campaign's rate, as bulk mail with a one-click unsubscribe from the "
        "list; the list's unsubscribes and your suppressions are left out.",
    ),
    _campaign_step(
        "pause_campaign",
        "pause",
        "Pause a scheduled or sending campaign",
        "Nothing more is handed to a provider from about a second on; what was released "
        "waits, and a resume sends it with nothing sent twice. Pausing a paused campaign "
        "answers the same.",
    ),
    _campaign_step(
        "resume_campaign",
        "resume",
        "Resume a paused campaign",
        "It goes on where it stopped (or waits for its send_at if it had not started).",
    ),
    _campaign_step(
        "cancel_campaign",
        "cancel",
        "Cancel a campaign that has not been sent",
        "Nothing more is released; recipients of released batches not yet handed to a "
        "provider end failed (`its campaign was cancelled`).",
    ),
    Operation(
        "list_webhooks",
        "get",
        "/v1/webhooks",
        "Your webhook endpoints (secrets shown as a hint), disabled ones with the reason",
        schema.WebhookList,
    ),
    Operation(
        "create_webhook",
        "post",
        "/v1/webhooks",
        "Add a webhook endpoint; its signing secret is in this answer only",
        schema.WebhookView,
        status=201,
        body=schema.WebhookIn,
        errors=(400, 409, 413, 415, 422),
        description="Events are signed per Standard Webhooks (`webhook-id`, "
        "`webhook-timestamp`, `webhook-signature`) and delivered in order per endpoint, "
        "retried for about a day. The URL must be https and resolve to public addresses "
        "(422 naming why not; for a host name, the one reason `the host does not resolve, or "
        "resolves to an address that is not publicly routable`, never what it resolved "
        "to); an unknown event type is a 422 naming it; 409 over the cap of endpoints per "
        "user.",
    ),
    Operation(
        "get_webhook",
        "get",
        "/v1/webhooks/{endpoint_id}",
        "One webhook endpoint",
        schema.WebhookView,
        params=(_WEBHOOK_ID,),
        errors=(404,),
    ),
    Operation(
        "update_webhook",
        "patch",
        "/v1/webhooks/{endpoint_id}",
        "Change an endpoint's URL or events, or disable or enable it",
        schema.WebhookView,
        body=schema.WebhookPatch,
        params=(_WEBHOOK_ID,),
        errors=(400, 404, 413, 415, 422),
        description="Enabling a disabled endpoint clears its failures and sends what waits.",
    ),
    Operation(
        "delete_webhook",
        "delete",
        "/v1/webhooks/{endpoint_id}",
        "Remove a webhook endpoint",
        None,
        status=204,
        params=(_WEBHOOK_ID,),
        errors=(404,),
    ),
    Operation(
        "rotate_webhook_secret",
        "post",
        "/v1/webhooks/{endpoint_id}/rotate",
        "A new signing secret (in this answer only); the previous one signs too for 24 h",
        schema.WebhookView,
        params=(_WEBHOOK_ID,),
        errors=(404,),
    ),
    Operation(
        "list_webhook_deliveries",
        "get",
        "/v1/webhooks/{endpoint_id}/deliveries",
        "The endpoint's delivery log, newest first (30 days)",
        schema.WebhookDeliveries,
        params=(_WEBHOOK_ID, Param("limit", "query", "1-500, default 50.", "integer")),
        errors=(404, 422),
    ),
    Operation(
        "replay_webhook_delivery",
        "post",
        "/v1/webhooks/{endpoint_id}/deliveries/{msg_id}/replay",
        "Deliver a message once more, under the same webhook-id",
        schema.WebhookReplay,
        status=202,
        params=(
            _WEBHOOK_ID,
            Param("msg_id", "path", "The message's webhook-id, from the log.", required=True),
            Param(
                "Idempotency-Key",
                "header",
                "1-255 visible ASCII characters: the same request repeated within a day is "
                "the same replay (its first answer, never a second delivery).",
            ),
        ),
        errors=(400, 404, 409),
        description="Exactly one delivery per replay: while a replay of the message waits, "
        "other requests join it (`queued: false`, its `replay_id`), so a burst of requests "
        "delivers it once; a replay asked for after the previous was delivered is delivered "
        "again. 409 while the endpoint is disabled.",
    ),
    Operation(
        "create_list",
        "post",
        "/v1/lists",
        "Create a contact list",
        schema.ContactListView,
        status=201,
        body=schema.ListIn,
        errors=(400, 409, 413, 415, 422),
        description="409 `too_many_lists` when you have as many lists as you may "
        "(`error.limit`); deleting one frees its place.",
    ),
    Operation(
        "list_lists",
        "get",
        "/v1/lists",
        "Your contact lists, newest first, with counts and each one's latest import",
        schema.ContactListList,
    ),
    Operation(
        "get_list",
        "get",
        "/v1/lists/{list_id}",
        "A contact list with its count and latest import",
        schema.ContactListView,
        params=(_LIST_ID,),
        errors=(404,),
    ),
    Operation(
        "delete_list",
        "delete",
        "/v1/lists/{list_id}",
        "Delete a contact list with its contacts and imports",
        None,
        status=204,
        params=(_LIST_ID,),
        errors=(404, 409),
        description="409 `import_running` while an import of it runs; `in_use` while a "
        "campaign that has not ended (a draft included) sends it.",
    ),
    Operation(
        "list_list_contacts",
        "get",
        "/v1/lists/{list_id}/contacts",
        "A list's contacts, a page at a time",
        schema.ListContactsPage,
        params=(_LIST_ID, Param("limit", "query", "1-1000, default 100.", "integer"), _CURSOR),
        errors=(400, 404, 422),
        description="Pages follow the list's storage order (not alphabetical overall); "
        "a page may be short before the last one.",
    ),
    Operation(
        "delete_list_contact",
        "delete",
        "/v1/lists/{list_id}/contacts/{email}",
        "Remove a contact from a list",
        None,
        status=204,
        params=(_LIST_ID, Param("email", "path", "The contact's address.", required=True)),
        errors=(404,),
    ),
    Operation(
        "import_list_contacts",
        "post",
        "/v1/lists/{list_id}/imports",
        "Import a CSV file of contacts into a list (in the background)",
        schema.ImportAccepted,
        status=202,
        params=(_LIST_ID,),
        errors=(404, 409, 413, 415, 422),
        description="The file is checked (UTF-8, an address column), then imported in "
        "slices while you follow the import. Contacts already in the list get the file's "
        "fields; addresses suppressed for all of your mail, or unsubscribed from this list "
        "(`/v1/suppressions?list=<list id>`), are not added; every such row, invalid rows "
        "and duplicates are reported with their row. One import per list at a time: 409 "
        "while one runs; `too_many_imports` when as many of your imports as you may run at "
        "once are in progress (their uploads included). 413 `too_many_contacts` for a file "
        "of more rows than one import may carry. The upload is spooled to disk as it "
        "arrives and read back a slice at a time.",
        extra=_CSV_BODY,
    ),
    Operation(
        "get_list_import",
        "get",
        "/v1/lists/{list_id}/imports/{import_id}",
        "An import's progress and report",
        schema.ImportView,
        params=(_LIST_ID, Param("import_id", "path", "The import's id.", required=True)),
        errors=(404,),
    ),
    Operation(
        "list_templates",
        "get",
        "/v1/templates",
        "Your templates, with the live version and any canary",
        schema.TemplateList,
    ),
    Operation(
        "create_template",
        "post",
        "/v1/templates",
        "Make a template with its version 1 (publish it to make it live)",
        schema.TemplateCreated,
        status=201,
        body=schema.TemplateIn,
        errors=(400, 409, 413, 415, 422),
        description="Subject, html and text are Jinja2 templates, rendered in a sandbox "
        "(no access to internals, undefined names are errors, html autoescaped) under "
        "limits of time, memory, CPU, integer size and output; a render that passes one is "
        "a 422 `template_does_not_render` naming it in `error.limit`. Without a "
        "text part, the text is derived from the html. 409 `too_many_templates` when you "
        "have as many templates as you may (`error.limit`).",
    ),
    Operation(
        "get_template",
        "get",
        "/v1/templates/{template_id}",
        "A template and its versions, newest first, with which is live and which in canary",
        schema.TemplateView,
        params=(_TEMPLATE_ID,),
        errors=(404,),
    ),
    Operation(
        "delete_template",
        "delete",
        "/v1/templates/{template_id}",
        "Delete a template with all of its versions",
        None,
        status=204,
        params=(_TEMPLATE_ID,),
        errors=(404, 409),
        description="409 `in_use` while a campaign that has not ended (a draft included) "
        "sends it. Batches already accepted keep what they rendered.",
    ),
    Operation(
        "add_template_version",
        "post",
        "/v1/templates/{template_id}/versions",
        "Add a version (immutable; not live until published)",
        schema.VersionCreated,
        status=201,
        body=schema.TemplateVersionIn,
        params=(_TEMPLATE_ID,),
        errors=(400, 404, 409, 413, 415, 422),
        description="409 `too_many_versions` when the template has as many versions as it "
        "may (`error.limit`); deleting one that is neither live nor in canary frees its "
        "place.",
    ),
    Operation(
        "delete_template_version",
        "delete",
        "/v1/templates/{template_id}/versions/{version}",
        "Delete a version that is neither live nor in canary",
        None,
        status=204,
        params=(
            _TEMPLATE_ID,
            Param("version", "path", "The version's number.", "integer", required=True),
        ),
        errors=(404, 409),
        description="409 `version_in_use` for the live version or the one in canary: "
        "publish another first.",
    ),
    Operation(
        "publish_template",
        "post",
        "/v1/templates/{template_id}/publish",
        "Make a version live, or start its canary beside the live one",
        schema.TemplateItem,
        body=schema.PublishIn,
        params=(_TEMPLATE_ID,),
        errors=(400, 404, 409, 413, 415, 422),
        description="Without `canary_percent`, the version becomes live and any canary ends "
        "(rolling back is publishing an older version). With it, that share of the "
        "template's mail uses the version and the rest the live one. 422 "
        "`template_does_not_render` when the version does not render with its own sample "
        "data (`error.fields` names each part and its error, with the line, and "
        "`error.limit` the limit it passed, if any); `cannot_publish` "
        "for a canary with nothing live yet or of the live version itself; `invalid_fields` "
        "naming `version` when the template has no such version. 409 `template_changed` "
        "when the live version or canary changed while publishing (another publish, or the "
        "canary's verdict): nothing was written; read the template again.",
    ),
    Operation(
        "preview_template",
        "post",
        "/v1/templates/{template_id}/preview",
        "Render a version (default: the live one) with your data or its sample",
        schema.PreviewOut,
        body=schema.PreviewIn,
        params=(_TEMPLATE_ID,),
        errors=(400, 404, 413, 415, 422),
        description="422 `template_does_not_render` naming each part's error (and line), "
        "and in `error.limit` the limit it passed, if any; "
        "`no_live_version` when none is live and no version is named; `invalid_fields` "
        "naming `version` when the template has no such version.",
    ),
    Operation(
        "list_providers",
        "get",
        "/v1/providers",
        "Each provider's health, circuit, pause and current rate, as every process sees them",
        schema.ProviderList,
    ),
    Operation(
        "get_settings",
        "get",
        "/v1/settings",
        "The live settings in force, and the latest changes (operator keys)",
        schema.SettingsView,
    ),
    Operation(
        "patch_settings",
        "patch",
        "/v1/settings",
        "Change live settings: chain order, pausing a provider, attempts (operator keys)",
        schema.SettingsView,
        body=schema.SettingsPatch,
        errors=(400, 413, 415, 422),
        description="Stored, audited (who, when, old -> new) and announced: every running "
        'process applies the change within a second. `{"providers": {"chain": '
        '["mailgun", "sendgrid"]}}` reorders the chain; `{"providers": '
        '{"sendgrid": {"paused": true}}}` sends everything through the others (with '
        'every provider paused, work waits in the queues); `{"providers": '
        '{"max_attempts": 4}}` bounds attempts per chunk.',
    ),
    Operation(
        "list_dead_letters",
        "get",
        "/v1/dead-letters",
        "Dead letters: work RabbitMQ parked, newest first (operator keys)",
        schema.DeadLetterList,
        params=(Param("limit", "query", "1-500, default 50.", "integer"), _CURSOR),
        errors=(400, 422),
    ),
    Operation(
        "replay_dead_letter",
        "post",
        "/v1/dead-letters/{letter_id}/replay",
        "Publish a dead letter again, once (operator keys)",
        schema.DeadLetterView,
        params=(_LETTER_ID,),
        errors=(404, 409),
        description="409 `already_replayed` for a letter replayed before (nothing is "
        "published twice), `replaying` while another replay holds it, `unroutable` when no "
        "queue takes its routing key now (it stays).",
    ),
    Operation(
        "delete_dead_letter",
        "delete",
        "/v1/dead-letters/{letter_id}",
        "Delete a dead letter (operator keys)",
        None,
        status=204,
        params=(_LETTER_ID,),
        errors=(404,),
    ),
    Operation(
        "get_stats",
        "get",
        "/v1/stats",
        "Delivery per day (UTC), zero-filled",
        schema.StatsPage,
        params=(
            Param("from", "query", "First day, YYYY-MM-DD (default: six days before `to`)."),
            Param("to", "query", "Last day, YYYY-MM-DD (default: today)."),
        ),
        errors=(422,),
    ),
    Operation(
        "list_keys", "get", "/v1/keys", "Your API keys (never their secrets)", schema.KeyList
    ),
    Operation(
        "create_key",
        "post",
        "/v1/keys",
        "Make an API key (shown once)",
        schema.KeyCreated,
        status=201,
        body=schema.KeyIn,
        errors=(400, 409, 413, 415, 422),
    ),
    Operation(
        "revoke_key",
        "delete",
        "/v1/keys/{key_id}",
        "Revoke an API key (refused everywhere within 1 s)",
        None,
        status=204,
        params=(Param("key_id", "path", "The key's id (`key_id` in the list).", required=True),),
        errors=(404,),
    ),
)


def document(server_url: str = "/") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``/v1``."""
    models = {op.answer for op in OPERATIONS if op.answer} | {
        op.body for op in OPERATIONS if op.body
    }
    models.add(schema.ErrorBody)
    inputs: list[tuple[type[BaseModel], Literal["validation"]]] = [
        (m, "validation") for m in sorted(models, key=lambda m: m.__name__)
    ]
    _, definitions = models_json_schema(inputs, ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Safedelivr",
            "version": "1",
            "description": "Multi-provider email delivery: submit a batch, follow each "
            "recipient's fate, keep suppressions, read daily stats. Every error is "
            '`{"error": {"code", "message", "fields"?, "limit"?}}`.',
        },
        "servers": [{"url": server_url}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key: `sd_live_<key_id>_<secret>`.",
                }
            },
        },
    }


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "parameters": [_parameter(p) for p in op.params],
        "responses": {str(op.status): _answer(op)},
    }
    if op.description:
        out["description"] = op.description
    out.update(op.extra)
    if op.body is not None:
        out["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(op.body)}},
        }
    for status in sorted({*op.errors, *_ALWAYS}):
        out["responses"][str(status)] = {
            "description": ERRORS[status],
            "content": {"application/json": {"schema": _ref(schema.ErrorBody)}},
        }
    return out


def _answer(op: Operation) -> dict[str, Any]:
    if op.answer is None:
        return {"description": "Done; no body."}
    return {
        "description": (op.answer.__doc__ or op.summary).strip().splitlines()[0],
        "content": {"application/json": {"schema": _ref(op.answer)}},
    }


def _parameter(p: Param) -> dict[str, Any]:
    return {
        "name": p.name,
        "in": p.where,
        "required": p.required or p.where == "path",
        "description": p.description,
        "schema": {"type": p.type},
    }


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def openapi_doc(request: Request) -> dict[str, Any]:
    """This app's document (built once, on first use)."""
    state = request.app.state
    doc: dict[str, Any] | None = getattr(state, "openapi", None)
    if doc is None:
        doc = state.openapi = document()
    return doc


async def openapi_json(request: Request) -> Response:
    """``GET /v1/openapi.json``: public, like the docs page."""
    return JSONResponse(openapi_doc(request))


# --------------------------------------------------------------------------- the docs page


def type_text(node: dict[str, Any]) -> str:
    """A JSON schema as a short type expression: ``string | RecipientIn``, ``list[string]``."""
    if "$ref" in node:
        return str(node["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in node:
        return " | ".join(type_text(n) for n in node["anyOf"])
    kind = node.get("type", "any")
    if kind == "array":
        return f"list[{type_text(node.get('items', {}))}]"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string, {type_text(node['additionalProperties'])}]"
    return "null" if kind == "null" else str(kind)


def _body_text(body: dict[str, Any]) -> str:
    """A request body's type as the docs page shows it (``text/csv`` ones by their type)."""
    ((media, content),) = body["content"].items()
    text = type_text(content["schema"])
    return text if media == "application/json" else f"{media}: {text}"


def reference(doc: dict[str, Any]) -> dict[str, Any]:
    """What the ``/v1/docs`` page shows, flattened from the document."""
    operations = [
        {
            "method": method.upper(),
            "path": path,
            "id": op["operationId"],
            "summary": op["summary"],
            "description": op.get("description", ""),
            "parameters": op["parameters"],
            "body": _body_text(op["requestBody"]) if "requestBody" in op else None,
            "responses": [
                {
                    "status": status,
                    "description": answer["description"],
                    "schema": type_text(answer["content"]["application/json"]["schema"])
                    if "content" in answer
                    else None,
                }
                for status, answer in op["responses"].items()
            ],
        }
        for path, methods in doc["paths"].items()
        for method, op in methods.items()
    ]
    schemas = []
    for name, node in doc["components"]["schemas"].items():
        required = set(node.get("required", ()))
        schemas.append(
            {
                "name": name,
                "description": node.get("description", ""),
                "fields": [
                    {
                        "name": field_name,
                        "type": type_text(prop),
                        "required": field_name in required,
                        "description": prop.get("description", ""),
                    }
                    for field_name, prop in node.get("properties", {}).items()
                ],
                "examples": node.get("examples", []),
            }
        )
    return {"info": doc["info"], "operations": operations, "schemas": schemas}
