"""What an alert posts (``shared.ops.alerts``): a body Slack and Discord both read, and no post
without a sink."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from shared.ops.alerts import Alert, AlertConfig, Alerter, body, mail_body, vet_sink
from shared.outbound.hook_delivery import Resolve
from shared.outbound.ssrf import IPAddress, TargetError

AT = datetime(2026, 11, 26, 2, 0, tzinfo=UTC)
#: A public address every sink host of these tests resolves to, unless told otherwise.
PUBLIC = ipaddress.ip_address("93.184.216.34")


def resolving(**hosts: str) -> Resolve:
    """A resolver: each host of ``hosts`` to its address, any other to :data:`PUBLIC`."""

    async def resolve(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(hosts.get(host.replace(".", "_"), str(PUBLIC)))]

    return resolve


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


async def test_without_a_sink_a_burst_is_logged_once_per_cool_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The log line is the alert then, so it keeps the cool-off (it was written every second)."""
    caplog.set_level("WARNING", logger="shared.ops.alerts")
    async with httpx.AsyncClient() as http:
        alerter = Alerter(None, "s", http, lambda: AlertConfig("", 600))  # type: ignore[arg-type]
        for _ in range(5):
            await alerter.send(Alert("circuit_open", "sg", "SendGrid circuit opened"))
        await alerter.send(Alert("circuit_open", "mg", "Mailgun circuit opened"))
    assert [r.getMessage() for r in caplog.records if r.name == "shared.ops.alerts"] == [
        "alert circuit_open/sg: SendGrid circuit opened",
        "alert circuit_open/mg: Mailgun circuit opened",
    ]


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
        alerter = Alerter(
            claims,  # type: ignore[arg-type]
            "s",
            http,
            lambda: AlertConfig("https://hooks.example/x", 600),
            resolver=resolving(),
        )
        sent = [await alerter.send(Alert("error_burst", "sg", "60 failures")) for _ in range(5)]

    assert sent == [True, False, False, False, False]
    assert (len(posts), claims.asked) == (1, ["error_burst:sg"])


async def test_a_sink_set_during_a_logged_burst_hears_of_it_at_once() -> None:
    """The log's cool-off is its own: the operator who read the log line and set a sink gets
    the burst's next alert posted, not ten minutes later."""
    posts: list[bytes] = []

    def sink(request: httpx.Request) -> httpx.Response:
        posts.append(request.content)
        return httpx.Response(200)

    config = AlertConfig("", 600)
    async with httpx.AsyncClient(transport=httpx.MockTransport(sink)) as http:
        alerter = Alerter(
            _Claims(),  # type: ignore[arg-type]
            "s",
            http,
            lambda: config,
            resolver=resolving(),
        )
        logged = await alerter.send(Alert("error_burst", "sg", "60 failures"))
        config = AlertConfig("https://hooks.example/x", 600)
        posted = await alerter.send(Alert("error_burst", "sg", "61 failures"))

    assert (logged, posted, len(posts)) == (False, True, 1)


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


async def _posted(url: str, answer: int = 200, **guard: Any) -> list[httpx.Request]:
    """The requests one alert to the sink ``url`` made."""
    made: list[httpx.Request] = []

    def sink(request: httpx.Request) -> httpx.Response:
        made.append(request)
        return httpx.Response(answer, headers={"location": "http://169.254.169.254/"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(sink)) as http:
        alerter = Alerter(_Claims(), "s", http, lambda: AlertConfig(url, 600), **guard)  # type: ignore[arg-type]
        await alerter.send(Alert("dead_letters", "q", "dead"))
    return made


@pytest.mark.parametrize(
    ("url", "resolver"),
    [
        ("https://metadata.internal/latest", resolving(metadata_internal="169.254.169.254")),
        ("https://10.0.0.7/hook", resolving()),
        ("https://[::ffff:127.0.0.1]/hook", resolving()),
        ("http://hooks.example/x", resolving()),
        ("https://user:pw@hooks.example/x", resolving()),
    ],
)
async def test_an_alert_is_never_posted_into_our_own_network(url: str, resolver: Resolve) -> None:
    """Internal, loopback and link-local sinks, plain http and credentials are refused at
    the post, whoever set the URL and however (the CLI writes it unchecked)."""
    assert await _posted(url, resolver=resolver) == []


async def test_an_alert_goes_to_the_address_vetted_and_no_redirect_is_followed() -> None:
    made = await _posted("https://hooks.example/services/x", 302, resolver=resolving())

    assert [(r.url.host, r.url.path, r.headers["host"]) for r in made] == [
        (str(PUBLIC), "/services/x", "hooks.example")
    ]
    assert made[0].extensions["sni_hostname"] == "hooks.example"


async def test_an_internal_sink_is_allowed_where_the_operator_allows_its_network() -> None:
    guard: dict[str, Any] = {
        "allow_http": True,
        "allowed": (ipaddress.ip_network("10.1.0.0/16"),),
        "resolver": resolving(chat_internal="10.1.2.3"),
    }
    made = await _posted("http://chat.internal:8065/hooks/x", **guard)

    assert [(r.url.host, r.url.port) for r in made] == [("10.1.2.3", 8065)]


async def test_a_sink_is_vetted_when_it_is_set() -> None:
    """What the API checks before storing ``alerts.webhook_url``."""
    with pytest.raises(TargetError, match="not publicly routable"):
        await vet_sink(
            "https://metadata.internal/", resolver=resolving(metadata_internal="169.254.169.254")
        )
    target, address = await vet_sink("https://hooks.example/x", resolver=resolving())
    assert (target.host, address) == ("hooks.example", PUBLIC)
