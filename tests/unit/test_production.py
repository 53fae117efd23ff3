"""Production mode refuses the sandbox's defaults, naming every offending variable at once."""

from __future__ import annotations

import base64

import pytest
from pydantic import SecretStr

from shared.core.errors import ConfigError
from shared.infra.config import (
    AmqpSettings,
    ApiSettings,
    GitHubSettings,
    ProviderSettings,
    Settings,
    TrackingSettings,
    WebhookSettings,
    load_settings,
)
from shared.infra.production import DEV_TRACKING_KEYS, production_problems


def fit(**overrides: object) -> Settings:
    """Settings a production deployment could start with."""
    values: dict[str, object] = {
        "env": "production",
        "providers": ProviderSettings(
            sendgrid_api_key=SecretStr("SG.real"),
            sendgrid_base_url="https://api.sendgrid.com",
            mailgun_api_key=SecretStr("key-real"),
            mailgun_base_url="https://api.mailgun.net",
        ),
        "github": GitHubSettings(
            client_secret=SecretStr("gh-real"),
            oauth_base_url="https://github.com",
            api_base_url="https://api.github.com",
            redirect_uri="https://mail.example.com/auth/github/callback",
        ),
        "api": ApiSettings(
            public_url="https://mail.example.com", dns_url="https://cloudflare-dns.com/dns-query"
        ),
        "amqp": AmqpSettings(url=SecretStr("amqps://sd:s3cret@mq1:5671/,amqps://sd:s3cret@mq2/")),
        "metrics_token": SecretStr("a-long-random-metrics-token"),
        "tracking": TrackingSettings(
            public_url="https://t.mail.example.com",
            keys=SecretStr("k1:" + base64.b64encode(b"r" * 32).decode()),
        ),
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def variables(settings: Settings) -> list[str]:
    return [problem.split(":", 1)[0] for problem in production_problems(settings)]


def test_settings_fit_for_production_have_no_problem() -> None:
    assert production_problems(fit()) == []


def test_development_mode_accepts_the_sandbox_defaults() -> None:
    assert production_problems(Settings()) == []


def test_every_sandbox_default_is_named() -> None:
    assert variables(Settings(env="production")) == [
        "SAFEDELIVR_PROVIDERS_SENDGRID_BASE_URL",
        "SAFEDELIVR_PROVIDERS_MAILGUN_BASE_URL",
        "SAFEDELIVR_GITHUB_OAUTH_BASE_URL",
        "SAFEDELIVR_GITHUB_API_BASE_URL",
        "SAFEDELIVR_GITHUB_REDIRECT_URI",
        "SAFEDELIVR_API_PUBLIC_URL",
        "SAFEDELIVR_API_DNS_URL",
        "SAFEDELIVR_PROVIDERS_SENDGRID_API_KEY",
        "SAFEDELIVR_PROVIDERS_MAILGUN_API_KEY",
        "SAFEDELIVR_GITHUB_CLIENT_SECRET",
        "SAFEDELIVR_AMQP_URL",
        "SAFEDELIVR_TRACKING_PUBLIC_URL",
        "SAFEDELIVR_TRACKING_KEYS",
        "SAFEDELIVR_METRICS_TOKEN",
    ]


def test_a_plain_http_provider_is_refused() -> None:
    providers = fit().providers.model_copy(update={"mailgun_base_url": "http://api.mailgun.net"})
    assert variables(fit(providers=providers)) == ["SAFEDELIVR_PROVIDERS_MAILGUN_BASE_URL"]


def test_an_smtp_relay_in_the_chain_must_be_remote_encrypted_and_secret() -> None:
    """The sandbox relay's host, no TLS and its password are each named, once smtp is used."""
    providers = fit().providers.model_copy(update={"chain": "sg,mg,smtp", "smtp_tls": "none"})
    assert variables(fit(providers=providers)) == [
        "SAFEDELIVR_PROVIDERS_SMTP_HOST",
        "SAFEDELIVR_PROVIDERS_SMTP_TLS",
        "SAFEDELIVR_PROVIDERS_SMTP_PASSWORD",
    ]


def test_a_real_smtp_relay_in_the_chain_is_fit() -> None:
    providers = fit().providers.model_copy(
        update={
            "chain": "sg,mg,smtp",
            "smtp_host": "smtp.example.net",
            "smtp_password": SecretStr("relay-real"),
        }
    )
    assert production_problems(fit(providers=providers)) == []


@pytest.mark.parametrize(
    "url", ["amqps://guest:guest@mq1/", "amqps://mq1/", "amqps://sd:ok@mq1/,amqps://mq2/"]
)
def test_a_broker_node_without_a_password_of_its_own_is_refused(url: str) -> None:
    assert variables(fit(amqp=AmqpSettings(url=SecretStr(url)))) == ["SAFEDELIVR_AMQP_URL"]


def test_unsigned_sendgrid_webhooks_are_refused() -> None:
    webhooks = WebhookSettings(sendgrid_insecure_basic_only=True)
    assert variables(fit(webhooks=webhooks)) == ["SAFEDELIVR_WEBHOOKS_SENDGRID_INSECURE_BASIC_ONLY"]


def test_sending_from_unverified_domains_is_refused() -> None:
    api = fit().api.model_copy(update={"sender_domains": "any"})
    assert variables(fit(api=api)) == ["SAFEDELIVR_API_SENDER_DOMAINS"]


@pytest.mark.parametrize("token", [None, SecretStr("short")])
def test_metrics_without_a_real_token_are_refused(token: SecretStr | None) -> None:
    """/metrics tells outsiders what users send: production keeps it behind a token."""
    assert variables(fit(metrics_token=token)) == ["SAFEDELIVR_METRICS_TOKEN"]


def test_open_sign_up_is_refused() -> None:
    assert variables(fit(signup="open")) == ["SAFEDELIVR_SIGNUP"]


@pytest.mark.parametrize(("env", "policy"), [("production", "closed"), ("development", "open")])
def test_sign_up_defaults_to_closed_in_production_and_open_in_the_sandbox(
    env: str, policy: str
) -> None:
    assert Settings(env=env).signup_policy == policy


def test_an_explicit_sign_up_policy_wins_over_the_default() -> None:
    assert fit(signup="approval").signup_policy == "approval"


def test_loading_production_settings_with_defaults_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAFEDELIVR_ENV", "production")
    monkeypatch.setenv("SAFEDELIVR_SIGNUP", "open")

    with pytest.raises(ConfigError) as caught:
        load_settings()

    message = str(caught.value)
    assert message.startswith("SAFEDELIVR_ENV=production refuses to start")
    assert "SAFEDELIVR_SIGNUP:" in message
    assert "SAFEDELIVR_GITHUB_CLIENT_SECRET:" in message


def test_plain_http_webhooks_are_refused_in_production() -> None:
    """Users' events would travel unencrypted: named by its variable."""
    from shared.infra.config import HooksSettings

    problems = production_problems(fit(hooks=HooksSettings(allow_http=True)))

    assert [p.split(":")[0] for p in problems] == ["SAFEDELIVR_HOOKS_ALLOW_HTTP"]


@pytest.mark.parametrize("kid", ["dev", "old"])
def test_the_development_tracking_key_is_refused_anywhere_in_the_ring(kid: str) -> None:
    own = "k1:" + base64.b64encode(b"r" * 32).decode()
    dev = DEV_TRACKING_KEYS.replace("dev:", f"{kid}:")
    tracking = fit().tracking.model_copy(update={"keys": SecretStr(f"{own},{dev}")})

    assert variables(fit(tracking=tracking)) == ["SAFEDELIVR_TRACKING_KEYS"]


def test_ses_in_the_chain_needs_its_own_secret_https_and_topics() -> None:
    providers = ProviderSettings(
        chain="sg,mg,ses",
        sendgrid_api_key=SecretStr("SG.real"),
        sendgrid_base_url="https://api.sendgrid.com",
        mailgun_api_key=SecretStr("key-real"),
        mailgun_base_url="https://api.mailgun.net",
        ses_base_url="http://email.us-east-1.amazonaws.com",
    )
    assert variables(fit(providers=providers)) == [
        "SAFEDELIVR_PROVIDERS_SES_BASE_URL",
        "SAFEDELIVR_PROVIDERS_SES_SECRET_ACCESS_KEY",
        "SAFEDELIVR_WEBHOOKS_SES_TOPIC_ARNS",
    ]


def test_a_pinned_sns_certificate_is_refused() -> None:
    settings = fit(webhooks=WebhookSettings(ses_cert_pem="-----BEGIN CERTIFICATE-----"))
    assert variables(settings) == ["SAFEDELIVR_WEBHOOKS_SES_CERT_PEM"]
