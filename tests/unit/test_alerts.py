"""What an alert posts (``shared.alerts``): a body Slack and Discord both read, and no post
without a sink."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from shared.alerts import Alert, AlertConfig, Alerter, body

AT = datetime(2026, 11, 26, 2, 0, tzinfo=UTC)


def test_the_body_carries_the_sentence_for_slack_and_for_discord() -> None:
    posted = body(Alert("circuit_open", "sg", "SendGrid circuit opened"), "safedelivr", AT)
    assert posted["text"] == posted["content"] == "[Safedelivr safedelivr] SendGrid circuit opened"
    assert (posted["kind"], posted["subject"], posted["at"]) == (
        "circuit_open",
        "sg",
        "2026-11-26T02:00:00+00:00",
    )


async def test_without_a_sink_an_alert_is_only_logged() -> None:
    """No URL: nothing is claimed or posted (the database is never asked)."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError("posted without a sink")

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        alerter = Alerter(None, "s", http, lambda: AlertConfig("", 600))  # type: ignore[arg-type]
        assert await alerter.send(Alert("queue_depth", "q", "deep")) is False
