"""The mail telling a user their webhook endpoint was disabled (pure)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from services.hooks.notice import mail_body
from shared.outbound.hook_store import Endpoint


def test_the_notice_names_the_endpoint_the_reason_and_the_way_back() -> None:
    """URL, reason, endpoint id, how to re-enable and where the dashboard is."""
    endpoint = Endpoint(
        uuid.uuid4(),
        uuid.uuid4(),
        "https://h.example/in",
        frozenset(),
        "whsec_x",
        datetime(2026, 11, 26, tzinfo=UTC),
    )

    body = mail_body(endpoint, "20 deliveries in a row failed", "https://mail.example.com")

    assert body["subject"] == "Your Safedelivr webhook endpoint was disabled"
    for part in (
        "https://h.example/in",
        "20 deliveries in a row failed",
        str(endpoint.endpoint_id),
        '{"enabled": true}',
        "https://mail.example.com",
    ):
        assert part in body["text"]
