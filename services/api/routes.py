"""The ``/v1`` operation routes: the one table of which endpoint serves which method and path.
Each endpoint declares its documentation (``services.api.operations.operation``), and
``services.api.openapi`` builds the document from this table; ``services.api.app`` serves it
beside the routes that are not operations (the document itself, the docs page, the original
API, login, health and the dashboard).

Listed in the order the document's reference page shows them.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Route

from services.api import (
    account,
    batches,
    campaigns,
    deadletters,
    domains,
    hooks,
    lists,
    preferences,
    providers,
    templates,
)
from services.api import settings as live

V1_ROUTES: tuple[BaseRoute, ...] = (
    Route("/v1/batches", batches.submit, methods=["POST"]),
    Route("/v1/batches", batches.list_batches, methods=["GET"]),
    Route("/v1/batches/{batch_id}", batches.get_batch, methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", batches.cancel_batch, methods=["POST"]),
    Route("/v1/batches/{batch_id}/logs", batches.batch_logs, methods=["GET"]),
    Route("/v1/suppressions", account.list_suppressions, methods=["GET"]),
    Route("/v1/suppressions", account.add_suppression, methods=["POST"]),
    Route("/v1/suppressions/{email}", account.delete_suppression, methods=["DELETE"]),
    Route("/v1/preferences", preferences.get_preferences, methods=["GET"]),
    Route("/v1/preferences", preferences.patch_preferences, methods=["PATCH"]),
    Route("/v1/domains", domains.list_domains, methods=["GET"]),
    Route("/v1/domains", domains.add_domain, methods=["POST"]),
    Route("/v1/domains/{domain}", domains.get_domain, methods=["GET"]),
    Route("/v1/domains/{domain}/verify", domains.verify_domain, methods=["POST"]),
    Route("/v1/domains/{domain}", domains.delete_domain, methods=["DELETE"]),
    Route("/v1/domain-claims/{domain}", domains.list_claims, methods=["GET"]),
    Route("/v1/campaigns", campaigns.create_campaign, methods=["POST"]),
    Route("/v1/campaigns", campaigns.list_campaigns, methods=["GET"]),
    Route("/v1/campaigns/{campaign_id}", campaigns.get_campaign, methods=["GET"]),
    Route("/v1/campaigns/{campaign_id}", campaigns.delete_campaign, methods=["DELETE"]),
    Route("/v1/campaigns/{campaign_id}/schedule", campaigns.schedule_campaign, methods=["POST"]),
    Route("/v1/campaigns/{campaign_id}/pause", campaigns.pause_campaign, methods=["POST"]),
    Route("/v1/campaigns/{campaign_id}/resume", campaigns.resume_campaign, methods=["POST"]),
    Route("/v1/campaigns/{campaign_id}/cancel", campaigns.cancel_campaign, methods=["POST"]),
    Route("/v1/webhooks", hooks.list_webhooks, methods=["GET"]),
    Route("/v1/webhooks", hooks.create_webhook, methods=["POST"]),
    Route("/v1/webhooks/{endpoint_id}", hooks.get_webhook, methods=["GET"]),
    Route("/v1/webhooks/{endpoint_id}", hooks.patch_webhook, methods=["PATCH"]),
    Route("/v1/webhooks/{endpoint_id}", hooks.delete_webhook, methods=["DELETE"]),
    Route("/v1/webhooks/{endpoint_id}/rotate", hooks.rotate_webhook, methods=["POST"]),
    Route("/v1/webhooks/{endpoint_id}/deliveries", hooks.list_deliveries, methods=["GET"]),
    Route(
        "/v1/webhooks/{endpoint_id}/deliveries/{msg_id}/replay",
        hooks.replay_delivery,
        methods=["POST"],
    ),
    Route("/v1/lists", lists.create_list, methods=["POST"]),
    Route("/v1/lists", lists.list_lists, methods=["GET"]),
    Route("/v1/lists/{list_id}", lists.get_list, methods=["GET"]),
    Route("/v1/lists/{list_id}", lists.delete_list, methods=["DELETE"]),
    Route("/v1/lists/{list_id}/contacts", lists.list_contacts, methods=["GET"]),
    Route("/v1/lists/{list_id}/contacts/{email}", lists.delete_contact, methods=["DELETE"]),
    Route("/v1/lists/{list_id}/imports", lists.import_contacts, methods=["POST"]),
    Route("/v1/lists/{list_id}/imports/{import_id}", lists.get_import, methods=["GET"]),
    Route("/v1/templates", templates.list_templates, methods=["GET"]),
    Route("/v1/templates", templates.create_template, methods=["POST"]),
    Route("/v1/templates/{template_id}", templates.get_template, methods=["GET"]),
    Route("/v1/templates/{template_id}", templates.delete_template, methods=["DELETE"]),
    Route("/v1/templates/{template_id}/versions", templates.add_version, methods=["POST"]),
    Route(
        "/v1/templates/{template_id}/versions/{version}",
        templates.delete_version,
        methods=["DELETE"],
    ),
    Route("/v1/templates/{template_id}/publish", templates.publish_template, methods=["POST"]),
    Route("/v1/templates/{template_id}/preview", templates.preview_template, methods=["POST"]),
    Route("/v1/providers", providers.list_providers, methods=["GET"]),
    Route("/v1/settings", live.get_settings, methods=["GET"]),
    Route("/v1/settings", live.patch_settings, methods=["PATCH"]),
    Route("/v1/dead-letters", deadletters.list_dead_letters, methods=["GET"]),
    Route("/v1/dead-letters/{letter_id}/replay", deadletters.replay_dead_letter, methods=["POST"]),
    Route("/v1/dead-letters/{letter_id}", deadletters.delete_dead_letter, methods=["DELETE"]),
    Route("/v1/stats", account.get_stats, methods=["GET"]),
    Route("/v1/keys", account.list_keys, methods=["GET"]),
    Route("/v1/keys", account.create_key, methods=["POST"]),
    Route("/v1/keys/current", account.current_key, methods=["GET"]),
    Route("/v1/keys/{key_id}", account.revoke_key, methods=["DELETE"]),
)
