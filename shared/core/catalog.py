"""Every provider we can send through, declared once: its code (in routing keys, settings and
errors), its name, what one request to it may carry, what it can do, and the settings that
configure it. The settings, the topology, chunk sizing, the adapters, the webhook intake,
``GET /v1/providers``, the dashboard and the README's provider table (``make docs``) all read it
here (pure data; no adapter is imported)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class ProviderInfo:
    code: str
    name: str
    max_recipients: int
    """Recipients (to + cc + bcc) one request may carry."""
    requests_per_s: float | None
    """The client-side rate limit it starts with (the live setting
    ``providers.<code>.rate_limit`` overrides it); None: none, because the provider publishes
    no fixed rate for sending (it depends on the account: its 429s tell us)."""
    max_message_bytes: int
    """The largest message the provider accepts."""
    max_tags: int
    """Categories (SendGrid) or tags (Mailgun) one message may carry; the rest are dropped."""
    schedule_ahead_hours: int
    """How far ahead the provider itself can schedule a send."""
    webhook: str
    """Our route for its events, and how they are authenticated."""
    capabilities: tuple[str, ...]
    settings: tuple[str, ...]
    """The environment variables that configure it (``.env.example`` explains each)."""


#: What each capability means (the README's table and ``GET /v1/providers`` use these names).
CAPABILITIES: dict[str, str] = {
    "per_recipient_substitutions": "one request carries a personalised copy per recipient",
    "signed_webhooks": "its event webhooks are signed, so forged events are refused",
    "query_api": "its API answers what happened to a message (settles unknown outcomes)",
    "rate_limit_headers": "its 429 says when to try again (Retry-After / X-RateLimit-Reset)",
}

CATALOG: dict[str, ProviderInfo] = {
    "sg": ProviderInfo(
        "sg",
        "SendGrid",
        max_recipients=1000,
        requests_per_s=None,
        max_message_bytes=30_000_000,
        max_tags=10,
        schedule_ahead_hours=72,
        webhook="POST /webhooks/sendgrid: ECDSA P-256 signature (or HTTP basic auth)",
        capabilities=tuple(CAPABILITIES),  # both do everything we use
        settings=(
            "SAFEDELIVR_PROVIDERS_SENDGRID_API_KEY",
            "SAFEDELIVR_PROVIDERS_SENDGRID_BASE_URL",
            "SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY",
            "SAFEDELIVR_WEBHOOKS_SENDGRID_BASIC_USER",
            "SAFEDELIVR_WEBHOOKS_SENDGRID_BASIC_PASSWORD",
        ),
    ),
    "mg": ProviderInfo(
        "mg",
        "Mailgun",
        max_recipients=1000,
        requests_per_s=None,
        max_message_bytes=25_000_000,
        max_tags=3,
        schedule_ahead_hours=72,
        webhook="POST /webhooks/mailgun: HMAC-SHA256 of timestamp and token",
        capabilities=tuple(CAPABILITIES),  # both do everything we use
        settings=(
            "SAFEDELIVR_PROVIDERS_MAILGUN_API_KEY",
            "SAFEDELIVR_PROVIDERS_MAILGUN_DOMAIN",
            "SAFEDELIVR_PROVIDERS_MAILGUN_BASE_URL",
            "SAFEDELIVR_WEBHOOKS_MAILGUN_SIGNING_KEY",
        ),
    ),
    "ses": ProviderInfo(
        "ses",
        "Amazon SES",
        max_recipients=50,
        requests_per_s=None,
        max_message_bytes=40_000_000,
        max_tags=50,
        schedule_ahead_hours=0,
        webhook="POST /webhooks/ses: SNS notifications, RSA signature over SNS's certificate",
        # No query API: an ambiguous call is settled by SES's events within the webhook window.
        capabilities=("per_recipient_substitutions", "signed_webhooks"),
        settings=(
            "SAFEDELIVR_PROVIDERS_SES_REGION",
            "SAFEDELIVR_PROVIDERS_SES_ACCESS_KEY_ID",
            "SAFEDELIVR_PROVIDERS_SES_SECRET_ACCESS_KEY",
            "SAFEDELIVR_PROVIDERS_SES_CONFIGURATION_SET",
            "SAFEDELIVR_PROVIDERS_SES_BASE_URL",
            "SAFEDELIVR_WEBHOOKS_SES_TOPIC_ARNS",
            "SAFEDELIVR_WEBHOOKS_SES_CERT_PEM",
        ),
    ),
    "smtp": ProviderInfo(
        "smtp",
        "SMTP relay",
        # RFC 5321 4.5.3.1.8: the fewest recipients a server must take per transaction.
        max_recipients=100,
        requests_per_s=None,
        max_message_bytes=25_000_000,
        max_tags=0,
        schedule_ahead_hours=0,
        webhook="none: the relay's SMTP answer is the only evidence (accepted by relay)",
        capabilities=(),
        settings=(
            "SAFEDELIVR_PROVIDERS_SMTP_HOST",
            "SAFEDELIVR_PROVIDERS_SMTP_PORT",
            "SAFEDELIVR_PROVIDERS_SMTP_TLS",
            "SAFEDELIVR_PROVIDERS_SMTP_USERNAME",
            "SAFEDELIVR_PROVIDERS_SMTP_PASSWORD",
            "SAFEDELIVR_PROVIDERS_SMTP_POOL_SIZE",
            "SAFEDELIVR_PROVIDERS_SMTP_HELO_NAME",
            "SAFEDELIVR_PROVIDERS_SMTP_UNKNOWN_WAIT",
        ),
    ),
}

#: Every provider code, in the default failover order.
CODES: tuple[str, ...] = tuple(CATALOG)

#: The ``provider`` of the events our tracking endpoint reports (opens, clicks, unsubscribes):
#: not a provider we send through, but a source of recipient events beside them.
TRACKER: Final = "tracking"


def name_of(code: str) -> str:
    """A provider's name, or the code itself for one we do not know (old rows)."""
    info = CATALOG.get(code)
    return info.name if info else code


def code_of(text: str) -> str | None:
    """A provider's code from its code or its name, in any case (``mailgun`` -> ``mg``)."""
    wanted = text.strip().lower()
    for code, info in CATALOG.items():
        if wanted in (code, info.name.lower()):
            return code
    return None


def markdown_table() -> str:
    """The README's provider table (``make docs`` writes it; a test keeps it in step)."""
    rows = [
        "| | " + " | ".join(f"{i.name} (`{c}`)" for c, i in CATALOG.items()) + " |",
        "|---|" + "---|" * len(CATALOG),
    ]

    def row(label: str, values: list[str]) -> None:
        rows.append(f"| {label} | " + " | ".join(values) + " |")

    infos = list(CATALOG.values())
    row("Recipients per request", [f"{i.max_recipients:,}" for i in infos])
    row(
        "Requests per second (default limit)",
        [
            f"{i.requests_per_s:g}" if i.requests_per_s else "none: set by the operator"
            for i in infos
        ],
    )
    row("Largest message", [f"{i.max_message_bytes // 1_000_000} MB" for i in infos])
    row("Tags per message", [str(i.max_tags) for i in infos])
    row("Schedules ahead", [f"{i.schedule_ahead_hours} h" for i in infos])
    row("Events", [i.webhook for i in infos])
    for name, meaning in CAPABILITIES.items():
        row(f"`{name}`: {meaning}", ["yes" if name in i.capabilities else "no" for i in infos])
    row("Settings", ["<br>".join(f"`{s}`" for s in i.settings) for i in infos])
    return "\n".join(rows) + "\n"


BEGIN, END = "<!-- providers:begin -->", "<!-- providers:end -->"


def with_table(readme: str) -> str:
    """``readme`` with the provider table between its markers rewritten from the catalog."""
    head, begin, rest = readme.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the README has no {BEGIN} ... {END} block")
    return f"{head}{BEGIN}\n{markdown_table()}{END}{tail}"
