"""Configuration: one pydantic-settings class per concern, read from ``SAFEDELIVR_*`` variables.

Nothing here is instantiated at import time. Entry points call :func:`load_settings` once at
start-up; it validates every section and turns a validation failure into a
:class:`ConfigError` whose message names the offending environment variable. Tests build
sections directly with keyword arguments instead of touching ``os.environ``.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.core.catalog import CODES
from shared.core.errors import ConfigError
from shared.core.keyring import ring_from
from shared.infra import github_accounts
from shared.infra.production import DEV_TRACKING_KEYS, production_problems

#: Every variable we read starts with this.
ENV_PREFIX = "SAFEDELIVR_"

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")


def _config(section: str) -> SettingsConfigDict:
    return SettingsConfigDict(
        env_prefix=f"{ENV_PREFIX}{section}_" if section else ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        use_attribute_docstrings=True,
    )


class CassandraSettings(BaseSettings):
    """Where the Cassandra cluster is and how our keyspace is replicated."""

    model_config = _config("CASSANDRA")

    hosts: str = "127.0.0.1"
    """Comma-separated contact points."""
    port: int = Field(9042, ge=1, le=65535)
    """The native protocol (CQL) port."""
    keyspace: str = "safedelivr"
    """Created by ``safedelivr migrate`` when missing."""
    replication: str = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    """CQL replication map for ``CREATE KEYSPACE``; use NetworkTopologyStrategy on clusters."""
    local_dc: str | None = None
    """The datacenter whose nodes serve requests (LOCAL_* consistency); set on multi-DC clusters."""
    username: str | None = None
    """PasswordAuthenticator credentials, when the cluster requires them."""
    password: SecretStr | None = None
    request_timeout: float = Field(10.0, gt=0)
    """Seconds a CQL request may take before it fails (503 on the API)."""
    connect_timeout: float = Field(10.0, gt=0)
    """Seconds to wait for a connection to a node."""
    speculative_delay: float = Field(0.5, ge=0)
    """Seconds after which a read or idempotent write still unanswered is also sent to the
    next replica (the first answer wins); 0 turns speculative execution off. Never applies to
    lightweight transactions or counters."""
    heartbeat_interval: float = Field(5.0, gt=0)
    """Seconds between heartbeats on an idle connection, and to wait for the answer: a node
    that died without closing its connections is dropped within twice this."""
    max_mutation_bytes: int = Field(16 * 1024 * 1024, ge=1024 * 1024)
    """The cluster's ``max_mutation_size`` (half its ``commitlog_segment_size``, 32 MiB, unless
    set): the most one batch may store (its message, recipients with their substitutions, its
    202 answer). A batch that would store more is refused (413 ``batch_too_large``) before
    anything is accepted; never set it above the cluster's."""

    @field_validator("keyspace")
    @classmethod
    def _keyspace_is_identifier(cls, value: str) -> str:
        if not _IDENTIFIER.match(value):
            raise ValueError("must be a lowercase CQL identifier (letters, digits, underscore)")
        return value

    @field_validator("replication")
    @classmethod
    def _replication_is_map(cls, value: str) -> str:
        stripped = value.strip()
        if not (stripped.startswith("{") and stripped.endswith("}") and "class" in stripped):
            raise ValueError("must be a CQL map such as {'class': 'SimpleStrategy', ...}")
        if ";" in stripped:
            raise ValueError("must not contain ';'")
        return stripped

    @property
    def contact_points(self) -> list[str]:
        return [h.strip() for h in self.hosts.split(",") if h.strip()]


class AmqpSettings(BaseSettings):
    """The RabbitMQ connection and the names and limits of our topology."""

    model_config = _config("AMQP")

    url: SecretStr = SecretStr("amqp://guest:guest@127.0.0.1:5672/")
    """amqp:// or amqps:// URL, credentials and vhost included; the nodes of a cluster as
    several URLs separated by commas (a lost connection moves to the next node)."""
    exchange: str = "safedelivr"
    """The topic exchange; queue names are derived from it (see shared.infra.topology)."""
    delivery_limit: int = Field(10, ge=1)
    """Deliveries of one message before it is dead-lettered as poison."""
    publish_timeout: float = Field(10.0, gt=0)
    """Seconds to wait for the broker to confirm a publish."""

    @field_validator("exchange")
    @classmethod
    def _exchange_name(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9_.:-]{1,200}$", value):
            raise ValueError("may hold only letters, digits and _.:-")
        return value


class ApiSettings(BaseSettings):
    """The HTTP API service."""

    model_config = _config("API")

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(8080, ge=1, le=65535)
    public_url: str = "http://127.0.0.1:8080"
    """The URL people reach the API and dashboard at (links, OAuth)."""
    max_recipients: int = Field(10_000, ge=1)
    """Recipients accepted in one batch request (after de-duplication)."""
    bulk_threshold: int = Field(1_000, ge=0)
    """A batch that does not say its ``priority`` goes in the bulk lane above this many
    recipients, else in the transactional one (``shared.core.lanes``)."""
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    """Request bodies above this are refused with 413 while they stream in."""
    schedule_horizon_days: float = Field(30.0, gt=0, le=366)
    """How far ahead a batch's ``send_at`` may be."""
    max_concurrency: int = Field(256, ge=1)
    """HTTP requests in progress per API process before new ones get 503 + Retry-After."""
    body_budget_bytes: int = Field(16 * 1024 * 1024, ge=1024 * 1024)
    """Bytes of request bodies one API process holds at once, from the moment a body is read
    until its answer is sent (``shared.infra.byte_budget``): a body over 64 KiB waits for room, then
    gets 503 + Retry-After unread. A body larger than this runs alone."""
    body_wait: float = Field(5.0, ge=0)
    """Seconds a large body waits for room in the body budget before its 503."""
    memory_max_mb: int = Field(192, ge=32)
    """The most memory (RSS, MB) one API process may hold: over it, the process retires itself
    (``shared.infra.memory_guard``, armed by ``safedelivr api``: it finishes what it holds, and a
    fresh one takes its place), and
    ``make hostile`` judges the process by it. The body budget is what keeps a process under
    it whatever arrives (measured: an idle process holds about 85 MB, and a 10 MB batch about
    65 MB more until it is answered)."""
    outbox_relay_interval: float = Field(5.0, gt=0)
    """Seconds between two passes of the outbox relay."""
    outbox_grace: float = Field(30.0, ge=0)
    """Seconds a pending batch may stay unpublished before the relay publishes it."""
    commit_budget: float = Field(15.0, gt=0)
    """Seconds from the start of a request without an Idempotency-Key within which the API
    decides its batch (a lightweight transaction, repeated while its outcome is unknown);
    past it the answer is 503 ``acceptance_unknown`` naming the batch. The relay cancels a
    batch still undecided this long plus ``outbox_grace`` after it was accepted."""
    idempotency_lease: float = Field(30.0, gt=0)
    """Seconds a request holds its Idempotency-Key; a retry after that takes the key over and
    finishes the same batch (the holder died or stalled)."""
    rate_limit_per_second: float = Field(50.0, gt=0)
    """Sustained requests per second allowed per API key, and per user on a dashboard
    session (see shared.accounts.ratelimit)."""
    rate_burst: int = Field(100, ge=1)
    """Requests one key (or one dashboard user) may make at once; with the rate it sets the
    window (burst / rate s)."""
    sender_domains: Literal["verified", "any"] = "verified"
    """``verified``: a batch's ``from`` must be in a domain its user verified (``/v1/domains``);
    ``any`` turns that check off (tests of other things; refused in production)."""
    dns_url: str = "http://127.0.0.1:8090/dns-query"
    """A DNS-over-HTTPS JSON endpoint for domain verification (the sandbox's by default;
    e.g. https://cloudflare-dns.com/dns-query or https://dns.google/resolve)."""
    domain_recheck_every: float = Field(21_600.0, ge=1)
    """Seconds between two look-ups of a verified domain's TXT record (by the consumers): a
    domain stays verified only while its record stays published."""
    domain_grace: float = Field(259_200.0, ge=0)
    """Seconds a verified domain's record may be missing before the domain is unverified (at
    the first look-up after; two look-ups must have missed it)."""
    max_keys_per_user: int = Field(50, ge=1)
    """Live API keys one user may hold; creating another answers 409 ``too_many_keys``."""
    daily_recipient_quota: int = Field(100_000, ge=1)
    """Recipients one user may have accepted per UTC day, across all of their keys."""
    suppression_cache_ttl: float = Field(5.0, ge=0)
    """Seconds an API process uses a user's suppression list after reading it
    (``shared.audience.suppression_cache``): how late it sees a change made through another process
    whose broadcast it missed (with the broadcast: milliseconds). 0 reads it for every batch."""
    domain_cache_ttl: float = Field(5.0, ge=0)
    """Seconds an API process uses a user's verified sending domains after reading them
    (``shared.infra.user_cache``): how late it sees a domain removed or unverified through another
    process whose broadcast it missed (with the broadcast: milliseconds). 0 reads them for
    every batch."""
    suppression_cache_small: int = Field(2_000, ge=0)
    """Entries a user's suppression list may hold to be kept whole by each API process; the
    addresses of a batch of a user with a longer list are looked up for each batch."""
    session_idle_ttl: int = Field(7 * 86_400, ge=1)
    """Seconds a dashboard session survives without use (sliding; refreshed while in use)."""
    session_max_age: int = Field(30 * 86_400, ge=1)
    """Seconds after login when a session ends however much it is used."""


class WebhookSettings(BaseSettings):
    """The provider webhook receiver."""

    model_config = _config("WEBHOOKS")

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(8081, ge=1, le=65535)
    sendgrid_public_key: str | None = None
    """Base64 DER (SubjectPublicKeyInfo) ECDSA P-256 key from SendGrid's Signed Event Webhook."""
    sendgrid_basic_user: str | None = None
    """Basic auth that SendGrid sends with each event post (optional, besides the signature)."""
    sendgrid_basic_password: SecretStr | None = None
    sendgrid_insecure_basic_only: bool = False
    """Accept SendGrid posts on Basic auth alone, without the signature. For development
    against a SendGrid account without the Signed Event Webhook only: anyone who learns the
    password can then forge events. Refused in production."""
    mailgun_signing_key: SecretStr | None = None
    """Mailgun's HTTP webhook signing key (HMAC-SHA256 of timestamp and token)."""
    ses_topic_arns: str = ""
    """Comma-separated ARNs of the SNS topics whose notifications are taken (the SES
    configuration set's event destination); anything else is refused, since any AWS account's
    SNS signs validly."""
    ses_cert_pem: str | None = None
    """A PEM certificate that verifies SNS signatures instead of fetching SNS's signing
    certificate (development only: the sandbox's; refused in production)."""
    inbound_basic_user: str | None = None
    """Basic auth user of SendGrid Inbound Parse (the ``mailto:`` unsubscribe), given in its
    URL: ``https://user:password@host/webhooks/inbound/sendgrid``. Inbound Parse posts are
    unsigned: without this user and password they get 503 (fail closed)."""
    inbound_basic_password: SecretStr | None = None
    timestamp_tolerance: int = Field(300, ge=1)
    """Seconds a signed webhook's timestamp may be off (replay window)."""
    max_concurrency: int = Field(64, ge=1)
    """Webhook posts in progress per process before new ones get 503 + Retry-After (the
    providers retry), so a flood cannot queue without bound."""
    body_budget_bytes: int = Field(8 * 1024 * 1024, ge=1024 * 1024)
    """Bytes of webhook bodies one process holds at once (as
    ``SAFEDELIVR_API_BODY_BUDGET_BYTES``; over it a post waits, then gets 503 + Retry-After,
    and the provider retries it)."""
    body_wait: float = Field(5.0, ge=0)
    """Seconds a large body waits for room in the body budget before its 503."""
    memory_max_mb: int = Field(160, ge=32)
    """The most memory (RSS, MB) one webhook process may hold (as
    ``SAFEDELIVR_API_MEMORY_MAX_MB``)."""
    deferred_deadline: int = Field(4 * 3600, ge=1)
    """Seconds a recipient may stay deferred before we try another provider."""


class ProviderSettings(BaseSettings):
    """The provider chain and each provider's credentials and endpoints."""

    model_config = _config("PROVIDERS")

    chain: str = "sg,mg"
    """Failover order by provider code: ``sg`` SendGrid, ``mg`` Mailgun, ``ses`` Amazon SES,
    ``smtp`` an SMTP relay (``make run``: all four, the sandbox standing in for each)."""
    max_attempts: int = Field(6, ge=1)
    """Provider attempts per chunk before its recipients end ``failed``."""
    backoff: str = "5,30,120,600"
    """Delay tiers in seconds used when the chain is exhausted and cycles again."""
    timeout: float = Field(30.0, gt=0)
    """Seconds a provider request may wait for the connection, for sending and for the answer.
    A call is presumed dead (its outcome unknown) after twice this plus 5 seconds."""
    resolve_interval: int = Field(30, ge=1)
    """Seconds between looks for evidence of a call whose outcome is unknown (the process
    died during it, or the answer never came)."""
    query_after: int = Field(300, ge=1)
    """Seconds after such a call before the provider's query API (SendGrid Email Activity,
    Mailgun Events) is asked which recipients it accepted; its answer is trusted from then
    on, so this must exceed the provider's indexing delay."""
    webhook_window: int = Field(3600, ge=1)
    """Seconds to wait for any webhook about such a call when the provider has no usable
    query API; after that the recipients without evidence are sent through the next
    provider (a duplicate is then possible, a loss is not)."""
    sendgrid_api_key: SecretStr = SecretStr("sandbox-sendgrid-key")
    """SendGrid API key with the Mail Send (and Email Activity read) permissions."""
    sendgrid_base_url: str = "http://127.0.0.1:8090/sendgrid"
    """https://api.sendgrid.com in production."""
    mailgun_api_key: SecretStr = SecretStr("sandbox-mailgun-key")
    """Mailgun private API key."""
    mailgun_domain: str = "sandbox.safedelivr.local"
    """The Mailgun sending domain."""
    mailgun_base_url: str = "http://127.0.0.1:8090/mailgun"
    """https://api.mailgun.net (or https://api.eu.mailgun.net) in production."""
    smtp_host: str = "127.0.0.1"
    """The SMTP relay (provider ``smtp``); ``make run`` points it at the sandbox's relay."""
    smtp_port: int = Field(587, ge=1, le=65535)
    smtp_tls: Literal["starttls", "implicit", "none"] = "starttls"
    """``starttls`` (port 587), ``implicit`` (TLS from the first byte, port 465) or ``none``
    (the sandbox's relay; refused in production)."""
    smtp_username: str = "sandbox-smtp-user"
    """AUTH user (empty: no AUTH)."""
    smtp_password: SecretStr = SecretStr("sandbox-smtp-password")
    smtp_pool_size: int = Field(4, ge=1, le=64)
    """Connections to the relay per consumer process, and so transactions at once."""
    smtp_helo_name: str = "localhost"
    """The name we give in EHLO, also the domain of our Message-IDs: this host's public name."""
    smtp_unknown_wait: int = Field(300, ge=1)
    """Seconds an SMTP call whose answer never came waits for evidence before its
    recipients go to the next provider (the relay has no events and no query API: none will
    come, so the webhook window would only delay them; a duplicate is then possible, a loss
    is not)."""
    ses_region: str = "us-east-1"
    """The AWS region of the Amazon SES account (its SigV4 signing region)."""
    ses_access_key_id: str = "sandbox-ses-key-id"
    """The AWS access key id of an IAM identity allowed ``ses:SendEmail``."""
    ses_secret_access_key: SecretStr = SecretStr("sandbox-ses-secret")
    """Its secret access key."""
    ses_configuration_set: str | None = "safedelivr"
    """The SES configuration set every message names: its event destination (SNS) must
    publish Send, Delivery, Bounce, Complaint, DeliveryDelay and Reject events to a topic in
    SAFEDELIVR_WEBHOOKS_SES_TOPIC_ARNS."""
    ses_base_url: str = "http://127.0.0.1:8090/ses"
    """https://email.<region>.amazonaws.com in production."""
    ses_concurrency: int = Field(10, ge=1, le=50)
    """SES calls in flight at once for one chunk of personal copies (one call per recipient)."""

    @field_validator("chain")
    @classmethod
    def _chain_codes(cls, value: str) -> str:
        codes = [c.strip() for c in value.split(",") if c.strip()]
        if not codes:
            raise ValueError("needs at least one provider code")
        unknown = [c for c in codes if c not in CODES]
        if unknown:
            raise ValueError(f"unknown provider code(s) {unknown}; known: {list(CODES)}")
        if len(set(codes)) != len(codes):
            raise ValueError("lists a provider twice")
        return ",".join(codes)

    @field_validator("backoff")
    @classmethod
    def _backoff_tiers(cls, value: str) -> str:
        try:
            tiers = [int(v) for v in value.split(",") if v.strip()]
        except ValueError as exc:
            raise ValueError("must be comma-separated whole seconds") from exc
        if not tiers or any(t <= 0 for t in tiers):
            raise ValueError("needs at least one positive delay")
        return ",".join(str(t) for t in tiers)

    @property
    def chain_codes(self) -> tuple[str, ...]:
        return tuple(self.chain.split(","))

    @property
    def call_lease(self) -> float:
        """Seconds after which a call still marked in progress is presumed dead."""
        return 2 * self.timeout + 5

    @property
    def backoff_tiers(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.backoff.split(","))


class ConsumerSettings(BaseSettings):
    """The consumer process."""

    model_config = _config("CONSUMERS")

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(8082, ge=1, le=65535)
    """Where the consumer process serves /healthz, /readyz and /metrics."""
    prefetch: int = Field(4, ge=1, le=1000)
    """Chunks (of up to 1,000 recipients) in flight per provider queue."""
    work_budget_bytes: int = Field(16 * 1024 * 1024, ge=1024 * 1024)
    """Bytes of recipients' data (addresses and substitutions) whose provider calls one
    process builds and sends at once (``shared.infra.byte_budget``); a chunk waits for room (a
    prefetch counts messages, not bytes). A chunk larger than this runs alone."""
    memory_max_mb: int = Field(224, ge=32)
    """The most memory (RSS, MB) one consumer process may hold (as
    ``SAFEDELIVR_API_MEMORY_MAX_MB``)."""
    bulk_prefetch: int = Field(1, ge=1, le=1000)
    """Chunks in flight per provider's bulk-lane queue: fewer than ``prefetch``, so a draining
    bulk batch leaves this process's calls and the provider's rate to transactional mail (the
    bench: 1 keeps the transactional p99 under a second while a million bulk recipients drain,
    2 let it reach 2 s, with no more bulk throughput)."""
    canary_window: float = Field(3600.0, gt=0)
    """Seconds a template's canary runs before its recipients are compared with the live
    version's."""
    canary_deadline: float = Field(86_400.0, gt=0)
    """Seconds after which a canary with too few recipients to compare is promoted."""
    canary_min_sent: int = Field(100, ge=1)
    """Recipients each version needs before their rates are compared."""
    canary_margin_failures: float = Field(0.05, ge=0, le=1)
    """How much higher (a fraction: 0.05 = 5 points) the canary's provider-side failure rate
    may be than the live version's before it is rolled back."""
    canary_margin_bounces: float = Field(0.02, ge=0, le=1)
    """The same for hard bounces."""
    canary_margin_complaints: float = Field(0.002, ge=0, le=1)
    """The same for complaints."""


class StatsSettings(BaseSettings):
    """How stats are laid out."""

    model_config = _config("STATS")

    buckets: int = Field(64, ge=1, le=4096)
    """Partitions per user and day that outcome rows are spread over (a recipient's bucket is
    its log id modulo this). Fixed once a keyspace holds stats: ``safedelivr migrate``
    records it and the services refuse to start with another value."""


class TemplateSettings(BaseSettings):
    """Users' templates: the worker processes they are compiled and rendered in."""

    model_config = _config("TEMPLATES")

    workers: int = Field(2, ge=1, le=64)
    """Worker processes per API process; a render waits for a free one."""
    warm: bool = True
    """Start the workers with the API process, so that no render waits for one to start
    (about a second each); off, each starts on the first job that needs it (an API process
    that renders no template then runs none: the test suite's stacks)."""
    memory_mb: int = Field(512, ge=128)
    """Address space of a worker (RLIMIT_AS, MiB): a template needing more is refused
    (``memory``) and its worker replaced."""
    cpu_seconds: int = Field(6, ge=1)
    """CPU seconds one job may use (RLIMIT_CPU; the worker is killed past it: ``cpu_time``).
    A backstop for the deadline: it holds even when the API process cannot kill the worker."""
    deadline: float = Field(5.0, gt=0)
    """Seconds of wall time to compile and render one version (or a batch's copies); past
    them the worker is killed and replaced (``time``)."""
    wait: float = Field(10.0, gt=0)
    """Seconds a render may wait for a free worker before it is refused (503
    ``renderer_unavailable``)."""


class SandboxSettings(BaseSettings):
    """The local SendGrid/Mailgun/GitHub stand-ins."""

    model_config = _config("SANDBOX")

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(8090, ge=1, le=65535)
    webhook_url: str = "http://127.0.0.1:8081"
    """Base URL of the webhook service the sandbox posts signed events to."""
    sendgrid_private_key: SecretStr | None = None
    """PEM ECDSA P-256 private key used to sign SendGrid-style events."""
    mailgun_signing_key: SecretStr = SecretStr("sandbox-mailgun-signing-key")
    """The key the sandbox signs Mailgun-style events with."""
    webhook_delay: float = Field(0.2, ge=0)
    """Seconds between accepting mail and posting its events."""
    query_delay: float = Field(2.0, ge=0)
    """Seconds before accepted mail shows in the query APIs (SendGrid Email Activity,
    Mailgun Events), as the real ones lag."""
    sendgrid_email_activity: bool = True
    """Whether the SendGrid account has the Email Activity History add-on (without it the
    query API answers 400 ``authorization required``)."""
    smtp_port: int = Field(0, ge=0, le=65535)
    """Where the SMTP relay stand-in listens; 0 (the default): any free port, read back from
    ``GET /_control/smtp`` (``make run`` does), so two sandboxes on one machine (tests, a
    soak beside ``make run``) never compete for one."""
    smtp_max_bytes: int = Field(25_000_000, ge=1024)
    """The largest message the SMTP relay stand-in takes, advertised in its EHLO (``SIZE``)."""
    smtp_user: str = "sandbox-smtp-user"
    """The user the SMTP relay stand-in admits (AUTH PLAIN or LOGIN)."""
    smtp_password: SecretStr = SecretStr("sandbox-smtp-password")
    """That user's password."""
    ses_access_key_id: str = "sandbox-ses-key-id"
    """The only AWS access key id the SES stand-in accepts."""
    ses_secret_access_key: SecretStr = SecretStr("sandbox-ses-secret")
    """Its secret: SES calls signed (SigV4) with another are refused with 403."""
    ses_signing_key: SecretStr | None = None
    """PEM RSA private key that signs the SNS notifications of SES events (None: a fresh one
    each start; ``GET /_control/ses/certificate`` shows its certificate)."""
    ses_topic_arn: str = "arn:aws:sns:us-east-1:000000000000:safedelivr-ses-events"
    """The SNS topic the SES stand-in's events are published to."""


class GitHubSettings(BaseSettings):
    """The GitHub OAuth app used for dashboard login (defaults: the local sandbox)."""

    model_config = _config("GITHUB")

    client_id: str = "safedelivr-sandbox"
    """The GitHub OAuth app's client id."""
    client_secret: SecretStr = SecretStr("sandbox-github-secret")
    oauth_base_url: str = "http://127.0.0.1:8090/github"
    """Base of ``/login/oauth/authorize`` and ``/login/oauth/access_token``: https://github.com."""
    api_base_url: str = "http://127.0.0.1:8090/github/api"
    """Base of ``/user`` and ``/user/emails``: https://api.github.com in production."""
    redirect_uri: str = "http://127.0.0.1:8080/auth/github/callback"
    """Sent verbatim; must equal the OAuth app's registered callback URL exactly."""
    timeout: float = Field(10.0, gt=0)

    @field_validator("oauth_base_url", "api_base_url", "redirect_uri")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/?#\s]+(/[^?#\s]*)?$", value):
            raise ValueError("must be an http(s) URL without query or fragment")
        return value

    @property
    def authorize_url(self) -> str:
        return self.oauth_base_url.rstrip("/") + "/login/oauth/authorize"

    @property
    def token_url(self) -> str:
        return self.oauth_base_url.rstrip("/") + "/login/oauth/access_token"

    @property
    def api_url(self) -> str:
        return self.api_base_url.rstrip("/")


class TrackingSettings(BaseSettings):
    """The tracking endpoint (its own port): the open pixel, tracked links and the one-click
    unsubscribe of the mail we send."""

    model_config = _config("TRACKING")

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(8083, ge=1, le=65535)
    public_url: str = "http://127.0.0.1:8083"
    """The URL recipients reach it at, put into mail (HTTPS in production: RFC 8058)."""
    keys: SecretStr = SecretStr(DEV_TRACKING_KEYS)
    """Signing keys of the tokens in mail URLs, ``kid:base64,...`` (32 bytes or more each;
    the first signs, all verify: add a new key first, drop an old one once its mail is old)."""
    unsubscribe_mailto: str | None = None
    """The address of the ``mailto:`` List-Unsubscribe (unset: the HTTPS URL only)."""
    redirect_hosts: str = ""
    """Comma-separated hosts whose personal links (holding a substitution key, so different
    per recipient) are tracked too: a click then goes to the recipient's own URL, and only
    while its host is listed. Links without keys are always tracked (they go only to the
    stored message's own links)."""
    max_concurrency: int = Field(256, ge=1)
    """Requests in progress per process before new ones get 503."""
    memory_max_mb: int = Field(128, ge=32)
    """The most memory (RSS, MB) one tracking process may hold (as
    ``SAFEDELIVR_API_MEMORY_MAX_MB``; its bodies are at most 4 KB)."""

    @property
    def allowed_hosts(self) -> frozenset[str]:
        return frozenset(h.strip().lower() for h in self.redirect_hosts.split(",") if h.strip())

    @field_validator("keys")
    @classmethod
    def _ring(cls, value: SecretStr) -> SecretStr:
        ring_from(value.get_secret_value())  # raises ValueError naming the problem
        return value

    @field_validator("public_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+(/[^\s]*)?$", value):
            raise ValueError("must be an http(s) URL")
        return value.rstrip("/")


class ClientSettings(BaseSettings):
    """The ``safedelivr send|batches|logs|stats`` commands, which call a running API."""

    model_config = _config("CLIENT")

    api_url: str | None = None
    """The API's base URL (default: SAFEDELIVR_API_PUBLIC_URL)."""
    api_key: SecretStr | None = None
    """The API key the commands authenticate with."""


class HooksSettings(BaseSettings):
    """Users' outbound webhooks: the delivery worker (``safedelivr hooks``) and its guards."""

    model_config = _config("HOOKS")

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(8084, ge=1, le=65535)
    """Where the delivery worker serves /healthz, /readyz and /metrics."""
    memory_max_mb: int = Field(128, ge=32)
    """The most memory (RSS, MB) one hooks process may hold (as
    ``SAFEDELIVR_API_MEMORY_MAX_MB``)."""
    timeout: float = Field(10.0, gt=0, le=60)
    """Seconds one delivery may take (connect, send, answer) before it counts as failed."""
    allow_http: bool = False
    """Whether endpoints may be plain http:// URLs (the sandbox receiver under ``make run``);
    never in production."""
    allowed_networks: str = ""
    """Comma-separated networks (CIDR) endpoints may resolve to although not public, e.g.
    ``10.1.0.0/16`` for an internal receiver (``127.0.0.0/8`` for the sandbox)."""
    max_endpoints: int = Field(20, ge=1, le=1000)
    """Endpoints one user may have."""
    delays: str = "5,30,120,600,1800,3600,7200,14400,28800,28800"
    """Seconds before each retry of a failing delivery (about a day in all); each becomes a
    delay queue."""
    disable_after: int = Field(86_400, ge=0)
    """Seconds an endpoint must have failed continuously before it is disabled..."""
    disable_min_failures: int = Field(20, ge=1)
    """...with at least this many failed deliveries in a row."""
    mail_from: str = ""
    """The sender of the mail telling a user their endpoint was disabled, e.g.
    ``Safedelivr <noreply@your-domain>``; empty: no mail (the dashboard still says so)."""
    sweep_interval: float = Field(60.0, gt=0)
    """Seconds between two sweeps that wake every endpoint with work (a lost wake message
    delays delivery by at most this)."""
    order_window: float = Field(2.0, ge=0, le=30)
    """Seconds an event waits before it is sent, so that what happened before it (reported
    by another process a moment later: a provider's webhook, a consumer's attempt) is sent
    first: events reach an endpoint in the order they happened."""

    @field_validator("delays")
    @classmethod
    def _delays(cls, value: str) -> str:
        try:
            found = [int(v) for v in value.split(",")]
        except ValueError:
            raise ValueError("must be comma-separated whole seconds") from None
        if not found or any(d < 1 or d > 86_400 for d in found):
            raise ValueError("each delay is 1 to 86400 seconds")
        return value

    @field_validator("allowed_networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        networks_of(value)
        return value

    @property
    def delay_tiers(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.delays.split(","))

    @property
    def networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return networks_of(self.allowed_networks)


class SubmissionSettings(BaseSettings):
    """SMTP submission (``safedelivr submission``): applications that speak only SMTP hand their
    mail to it, and it becomes a batch through the API's ``POST /v1/batches``."""

    model_config = _config("SUBMISSION")

    host: str = "127.0.0.1"
    """Address to listen on (SMTP and the health port)."""
    port: int = Field(8085, ge=1, le=65535)
    """Where the process serves /healthz, /readyz and /metrics."""
    smtp_port: int = Field(8587, ge=1, le=65535)
    """The SMTP submission port (587 in production, behind the host's firewall rules)."""
    hostname: str = "localhost"
    """The name the server gives in its greeting and EHLO answer."""
    api_url: str | None = None
    """The API it submits batches to (default: SAFEDELIVR_API_PUBLIC_URL)."""
    tls_cert_file: str | None = None
    """PEM certificate (chain) for STARTTLS; required in production, where AUTH is refused
    before STARTTLS."""
    tls_key_file: str | None = None
    """The certificate's private key (PEM)."""
    max_message_bytes: int = Field(10_000_000, ge=10_000, le=40_000_000)
    """The largest message accepted (announced as SIZE; larger ones get 552)."""
    max_recipients: int = Field(1000, ge=1, le=10_000)
    """RCPT TO commands one message may carry (more get 452, as RFC 5321 says)."""
    timeout: float = Field(30.0, gt=0, le=300)
    """Seconds the API may take to accept a batch before the client is told to try again."""
    max_sessions: int = Field(200, ge=1)
    """SMTP sessions open at once per process; more are told 421 and to come back."""
    memory_max_mb: int = Field(256, ge=64)
    """The most memory (RSS, MB) one submission process may hold (as
    ``SAFEDELIVR_API_MEMORY_MAX_MB``; a message is held whole while it is parsed)."""


class AlertSettings(BaseSettings):
    """Where operators' alerts may be posted (the live setting ``alerts.webhook_url``)."""

    model_config = _config("ALERTS")

    allow_http: bool = False
    """Whether the alert sink may be a plain http:// URL (the sandbox's receiver under
    ``make run``); never in production."""
    allowed_networks: str = ""
    """Comma-separated networks (CIDR) the sink may resolve to although not public, e.g.
    ``10.1.0.0/16`` for an internal chat server (``127.0.0.0/8`` for the sandbox). Apart from
    ``SAFEDELIVR_HOOKS_ALLOWED_NETWORKS``: allowing an internal sink must not let every user's
    webhook endpoint reach it."""

    @field_validator("allowed_networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        networks_of(value)
        return value

    @property
    def networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return networks_of(self.allowed_networks)


def networks_of(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """The networks of a comma-separated CIDR list; ValueError naming one that is not."""
    found = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            try:
                found.append(ipaddress.ip_network(part, strict=False))
            except ValueError:
                raise ValueError(f"{part!r} is not a network (CIDR)") from None
    return tuple(found)


class ListSettings(BaseSettings):
    """Contact lists and their CSV imports (``/v1/lists``)."""

    model_config = _config("LISTS")

    import_max_bytes: int = Field(50 * 1024 * 1024, ge=1024)
    """A CSV import's body above this is refused with 413 while it streams in."""
    import_max_rows: int = Field(1_000_000, ge=1)
    """Rows read of one import; the rest are counted as over the limit."""
    max_contacts: int = Field(1_000_000, ge=1)
    """Contacts one list may hold (its partitions stay bounded); new ones beyond are
    reported as over the limit."""
    import_slice: int = Field(1_000, ge=1, le=10_000)
    """Rows an import processes between two progress writes."""
    import_stale_after: float = Field(120.0, gt=0)
    """Seconds without progress after which a running import reads as failed (its API
    process stopped: a restart or a crash)."""


class CapSettings(BaseSettings):
    """Per-user caps on what a user may create and run at once (``services.api.caps``)."""

    model_config = _config("CAPS")

    lists: int = Field(100, ge=1, le=10_000)
    """Contact lists one user may have; another is refused with 409 ``too_many_lists``
    (deleting one frees its place)."""
    templates: int = Field(200, ge=1, le=10_000)
    """Templates one user may have (409 ``too_many_templates``)."""
    versions: int = Field(100, ge=1, le=10_000)
    """Versions one template may have (409 ``too_many_versions``; deleting a version that is
    neither live nor in canary frees its place)."""
    campaigns: int = Field(1_000, ge=1, le=10_000)
    """Campaigns one user may have, ended ones included (409 ``too_many_campaigns``)."""
    imports: int = Field(2, ge=1, le=100)
    """CSV imports of one user in progress at once, their uploads included (409
    ``too_many_imports``)."""
    contacts_per_import: int = Field(1_000_000, ge=1)
    """Rows one CSV import may carry (the header aside); a file with more is refused with 413
    ``too_many_contacts`` before anything of it is imported."""
    claim_grace: float = Field(120.0, ge=10)
    """Seconds a place taken for something being created is kept although the thing is not
    found (its creation is still under way); after that a place whose thing is missing (its
    process died between the two steps) is given back the next time the user is at the cap.
    An import's place is kept this plus the upload's time limit."""


class Settings(BaseSettings):
    """Every section, validated together at start-up."""

    model_config = _config("")

    env: Literal["development", "production"] = "development"
    """``production`` refuses to start with sandbox URLs, default secrets, insecure settings
    or open sign-up (see :mod:`shared.infra.production`)."""
    signup: Literal["open", "closed", "allowlist", "approval"] | None = None
    """Who may create an account by logging in with GitHub: anyone (``open``), nobody new
    (``closed``), the logins and ``org:NAME`` organisations of ``SAFEDELIVR_SIGNUP_ALLOW``
    (``allowlist``), or whoever an operator approves (``approval``). Unset: ``closed`` in
    production, ``open`` otherwise (the sandbox)."""
    signup_allow: str = ""
    """Comma-separated GitHub accounts admitted by ``allowlist``, by numeric id: ``ID`` or
    ``LOGIN:ID`` (the login is a reminder, never compared), and organisations as ``org:ID``
    or ``org:NAME:ID``. A bare login is refused: renamed, it could be anyone's."""
    operators: str = ""
    """Comma-separated GitHub accounts who see the dashboard's Operations pages (providers,
    live settings, dead letters, sign-up requests), by numeric id: ``ID`` or ``LOGIN:ID``
    (``octocat:583231``; the "id" of https://api.github.com/users/LOGIN). A bare login is
    refused. API operator routes take operator keys."""
    metrics_token: SecretStr | None = None
    """When set, ``GET /metrics`` on every service answers only requests carrying
    ``Authorization: Bearer <token>`` (Prometheus: ``authorization: {credentials: ...}``);
    unset, it is open to whoever reaches the port (required in production)."""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR."""
    log_format: Literal["json", "console"] = "json"
    """One JSON object per line (for collectors), or readable lines (``make run`` uses these)."""
    cassandra: CassandraSettings = Field(default_factory=CassandraSettings)
    amqp: AmqpSettings = Field(default_factory=AmqpSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    templates: TemplateSettings = Field(default_factory=TemplateSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    providers: ProviderSettings = Field(default_factory=ProviderSettings)
    consumers: ConsumerSettings = Field(default_factory=ConsumerSettings)
    stats: StatsSettings = Field(default_factory=StatsSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    github: GitHubSettings = Field(default_factory=GitHubSettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)
    client: ClientSettings = Field(default_factory=ClientSettings)
    hooks: HooksSettings = Field(default_factory=HooksSettings)
    lists: ListSettings = Field(default_factory=ListSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    caps: CapSettings = Field(default_factory=CapSettings)
    submission: SubmissionSettings = Field(default_factory=SubmissionSettings)

    @field_validator("operators")
    @classmethod
    def _operators(cls, value: str) -> str:
        github_accounts.parse_accounts(value)
        return value

    @field_validator("signup_allow")
    @classmethod
    def _signup_allow(cls, value: str) -> str:
        github_accounts.parse_accounts(value, orgs=True)
        return value

    @property
    def operator_ids(self) -> frozenset[int]:
        """The GitHub ids of ``operators``."""
        return github_accounts.ids(github_accounts.parse_accounts(self.operators))

    @property
    def signup_policy(self) -> Literal["open", "closed", "allowlist", "approval"]:
        """``signup``, or its default for ``env``."""
        if self.signup is not None:
            return self.signup
        return "closed" if self.env == "production" else "open"


#: Every section by its variables' infix (``SAFEDELIVR_<SECTION>_<FIELD>``).
SECTIONS: dict[str, type[BaseSettings]] = {
    "CASSANDRA": CassandraSettings,
    "AMQP": AmqpSettings,
    "API": ApiSettings,
    "TEMPLATES": TemplateSettings,
    "WEBHOOKS": WebhookSettings,
    "PROVIDERS": ProviderSettings,
    "CONSUMERS": ConsumerSettings,
    "STATS": StatsSettings,
    "SANDBOX": SandboxSettings,
    "GITHUB": GitHubSettings,
    "TRACKING": TrackingSettings,
    "CLIENT": ClientSettings,
    "HOOKS": HooksSettings,
    "LISTS": ListSettings,
    "ALERTS": AlertSettings,
    "CAPS": CapSettings,
    "SUBMISSION": SubmissionSettings,
}


def load_settings(**overrides: Any) -> Settings:
    """Read and validate every section; raise ConfigError naming the bad variable."""
    sections: dict[str, Any] = {}
    problems: list[str] = []
    for name, cls in SECTIONS.items():
        try:
            sections[name.lower()] = cls()
        except ValidationError as exc:
            problems.extend(describe_errors(exc, f"{ENV_PREFIX}{name}_"))
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    sections.update(overrides)
    try:
        settings = Settings(**sections)
    except ValidationError as exc:
        raise ConfigError(
            "invalid configuration:\n  " + "\n  ".join(describe_errors(exc, ENV_PREFIX))
        ) from exc
    refused = production_problems(settings)
    if refused:
        raise ConfigError(
            f"{ENV_PREFIX}ENV=production refuses to start:\n  " + "\n  ".join(refused)
        )
    return settings


def describe_errors(exc: ValidationError, prefix: str) -> list[str]:
    """Turn pydantic errors into ``VARIABLE: message`` lines."""
    lines = []
    for error in exc.errors():
        field = "_".join(str(part) for part in error["loc"]).upper()
        lines.append(f"{prefix}{field}: {error['msg']}")
    return lines
