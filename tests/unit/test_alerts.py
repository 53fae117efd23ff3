"""What an alert posts (``shared.alerts``): a body Slack and Discord both read, and no post
without a sink."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from shared.alerts import Alert, AlertConfig, Alerter, body, mail_body

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


class _Claims:
    """The ``alerts_sent`` claim: the first claim of a key applies (the LWT's answer)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def one(self, query: str, params: tuple[object, ...]) -> dict[str, bool]:
        key = str(params[1])
        self.asked.append(key)
        return {"[applied]": self.asked.count(key) == 1}


async def test_a_burst_alerts_once_and_this_process_stops_asking_during_the_cool_off() -> None:
    posts: list[bytes] = []

    def sink(request: httpx.Request) -> httpx.Response:
        posts.append(request.content)
        return httpx.Response(200)

    claims = _Claims()
    async with httpx.AsyncClient(transport=httpx.MockTransport(sink)) as http:
        alerter = Alerter(claims, "s", http, lambda: AlertConfig("https://hooks/x", 600))  # type: ignore[arg-type]
        sent = [await alerter.send(Alert("error_burst", "sg", "60 failures")) for _ in range(5)]

    assert sent == [True, False, False, False, False]
    assert (len(posts), claims.asked) == (1, ["error_burst:sg"])


async def test_an_alert_is_mailed_to_the_operators_when_they_are_set() -> None:
    mailed: list[tuple[str, tuple[str, ...]]] = []

    async def mail(alert: Alert, config: AlertConfig, at: datetime) -> bool:
        mailed.append((alert.kind, config.email_to))
        return True

    config = AlertConfig("", 600, ("ops@example.com",), "Alerts <alerts@example.com>")
    async with httpx.AsyncClient() as http:
        alerter = Alerter(_Claims(), "s", http, lambda: config, mail=mail)  # type: ignore[arg-type]
        assert await alerter.send(Alert("capacity", "shop.example", "held")) is True

    assert mailed == [("capacity", ("ops@example.com",))]


def test_an_alert_mail_names_the_deployment_kind_and_subject() -> None:
    mail = mail_body(Alert("circuit_open", "sg", "SendGrid circuit opened"), "prod", AT)

    assert mail["subject"] == "[Safedelivr prod] circuit_open: sg"
    assert mail["text"].startswith("SendGrid circuit opened\n")
    assert mail["categories"] == ["safedelivr-alert"]
