"""What production mode (``SAFEDELIVR_ENV=production``) refuses to start with.

The defaults are made for ``make run`` on one machine: sandbox providers on 127.0.0.1, secrets
everyone can read in this repository, plain HTTP, open sign-up. Each is fine there and a hole
in production, and none of them fails loudly by itself (the sandbox answers like the real
providers do). :func:`production_problems` names every such setting by its variable, so an
operator fixes them all in one go rather than one start-up at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from shared.infra.config import Settings

_PREFIX = "SAFEDELIVR_"
#: The secrets this repository ships as defaults (for the sandbox).
_PUBLIC_SECRETS = frozenset(
    {
        "sandbox-sendgrid-key",
        "sandbox-mailgun-key",
        "sandbox-github-secret",
        "guest",
        "sandbox-smtp-password",
        "sandbox-ses-secret",
    }
)
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
#: The development signing key of tracking tokens (the default; refused here).
DEV_TRACKING_KEYS = "dev:ZGV2ZWxvcG1lbnQtb25seS10cmFja2luZy1rZXktMDAwMDAw"


def _dev_key_in(ring: str) -> bool:
    """Whether the ring holds the development key (under any id, in any place: a key that
    still verifies lets anyone forge tokens)."""
    dev = DEV_TRACKING_KEYS.partition(":")[2]
    return any(part.strip().partition(":")[2] == dev for part in ring.split(","))


def _ses_problems(settings: Settings) -> list[str]:
    p, w = settings.providers, settings.webhooks
    problems: list[str] = []
    if "ses" in p.chain_codes:
        problems += _remote_https("PROVIDERS_SES_BASE_URL", p.ses_base_url)
        problems += _secret(
            "PROVIDERS_SES_SECRET_ACCESS_KEY", p.ses_secret_access_key.get_secret_value()
        )
        if not w.ses_topic_arns.strip():
            problems.append(
                f"{_PREFIX}WEBHOOKS_SES_TOPIC_ARNS: no SNS topic is allowed, so no SES event "
                "would be taken; name the configuration set's topic"
            )
    if w.ses_cert_pem:
        problems.append(
            f"{_PREFIX}WEBHOOKS_SES_CERT_PEM: a pinned certificate is the sandbox's; SNS's "
            "signing certificate is fetched from SNS in production"
        )
    return problems


def production_problems(settings: Settings) -> list[str]:
    """Every setting production mode refuses, as ``VARIABLE: why``; empty when the
    settings are fit for production (or when they are not production settings)."""
    if settings.env != "production":
        return []
    p, g, w, api = settings.providers, settings.github, settings.webhooks, settings.api
    problems = [
        *_remote_https("PROVIDERS_SENDGRID_BASE_URL", p.sendgrid_base_url),
        *_remote_https("PROVIDERS_MAILGUN_BASE_URL", p.mailgun_base_url),
        *_remote_https("GITHUB_OAUTH_BASE_URL", g.oauth_base_url),
        *_remote_https("GITHUB_API_BASE_URL", g.api_base_url),
        *_https("GITHUB_REDIRECT_URI", g.redirect_uri),
        *_https("API_PUBLIC_URL", api.public_url),
        *_remote_https("API_DNS_URL", api.dns_url),
        *_secret("PROVIDERS_SENDGRID_API_KEY", p.sendgrid_api_key.get_secret_value()),
        *_secret("PROVIDERS_MAILGUN_API_KEY", p.mailgun_api_key.get_secret_value()),
        *_secret("GITHUB_CLIENT_SECRET", g.client_secret.get_secret_value()),
        *_amqp("AMQP_URL", settings.amqp.url.get_secret_value()),
        *_https("TRACKING_PUBLIC_URL", settings.tracking.public_url),
    ]
    if "smtp" in p.chain_codes:
        problems += _smtp_problems(settings)
    if _dev_key_in(settings.tracking.keys.get_secret_value()):
        problems.append(
            f"{_PREFIX}TRACKING_KEYS: the development key signs links anyone could forge; "
            "set your own (kid:base64 of 32 random bytes)"
        )
    if settings.hooks.allow_http:
        problems.append(
            f"{_PREFIX}HOOKS_ALLOW_HTTP: users' webhook events would travel unencrypted"
        )
    if settings.alerts.allow_http:
        problems.append(f"{_PREFIX}ALERTS_ALLOW_HTTP: alerts would travel unencrypted")
    if w.sendgrid_insecure_basic_only:
        problems.append(
            f"{_PREFIX}WEBHOOKS_SENDGRID_INSECURE_BASIC_ONLY: accepts unsigned SendGrid events; "
            "configure SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY instead"
        )
    problems += _ses_problems(settings)
    if api.sender_domains != "verified":
        problems.append(
            f"{_PREFIX}API_SENDER_DOMAINS: any lets every user send from any domain; use verified"
        )
    if settings.metrics_token is None or len(settings.metrics_token.get_secret_value()) < 16:
        problems.append(
            f"{_PREFIX}METRICS_TOKEN: /metrics would be open to anyone who reaches a service; "
            "set a random token of 16 characters or more and give it to Prometheus"
        )
    if settings.signup_policy == "open":
        problems.append(
            f"{_PREFIX}SIGNUP: open sign-up lets anyone with a GitHub account send mail; "
            "use closed, allowlist or approval"
        )
    return problems


def _smtp_problems(settings: Settings) -> list[str]:
    """An SMTP relay in the chain must be another machine, reached over TLS, with a secret
    of its own."""
    p = settings.providers
    problems = []
    if p.smtp_host in _LOOPBACK:
        problems.append(
            f"{_PREFIX}PROVIDERS_SMTP_HOST: {p.smtp_host} is this machine (the sandbox), "
            "not the relay"
        )
    if p.smtp_tls == "none":
        problems.append(
            f"{_PREFIX}PROVIDERS_SMTP_TLS: none would send mail and the relay password in the "
            "clear; use starttls or implicit"
        )
    if p.smtp_username:
        problems += _secret("PROVIDERS_SMTP_PASSWORD", p.smtp_password.get_secret_value())
    return problems


def _remote_https(name: str, url: str) -> list[str]:
    host = urlsplit(url).hostname or ""
    if host in _LOOPBACK:
        return [f"{_PREFIX}{name}: {url} is this machine (the sandbox), not the real service"]
    return _https(name, url)


def _https(name: str, url: str) -> list[str]:
    if urlsplit(url).scheme != "https":
        return [f"{_PREFIX}{name}: {url} is not HTTPS"]
    return []


def _secret(name: str, value: str) -> list[str]:
    if value in _PUBLIC_SECRETS or not value:
        return [f"{_PREFIX}{name}: is the default from the repository; set the real secret"]
    return []


def _amqp(name: str, urls: str) -> list[str]:
    """Every node's URL must carry a password of its own (not RabbitMQ's ``guest``)."""
    for node in urls.split(","):
        password = urlsplit(node.strip()).password
        if not password or password in _PUBLIC_SECRETS:
            return [f"{_PREFIX}{name}: a node has no password or the default guest account"]
    return []
