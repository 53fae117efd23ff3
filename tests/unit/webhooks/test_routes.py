"""Every provider of the catalog whose events come by webhook has its route in the webhook
service, where the catalog (and so the README and ``GET /v1/providers``) says it is."""

from __future__ import annotations

import pytest
from starlette.routing import Route

from services.webhooks.app import create_app
from shared.core.catalog import CATALOG
from shared.core.errors import ConfigError
from shared.infra.config import Settings, WebhookSettings


def test_every_catalog_webhook_has_its_route() -> None:
    app = create_app(Settings())
    served = {
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
    }
    declared = {
        (method, path)
        for info in CATALOG.values()
        for method, _, path in [info.webhook.partition(":")[0].partition(" ")]
        if method == "POST"
    }

    assert declared
    assert declared <= served


def test_a_pinned_sns_certificate_that_is_not_one_stops_the_service_at_start() -> None:
    with pytest.raises(ConfigError, match="SAFEDELIVR_WEBHOOKS_SES_CERT_PEM"):
        create_app(Settings(webhooks=WebhookSettings(ses_cert_pem="not a certificate")))
