"""``make run``: migrate, declare topology, start every service process, print what runs where.

Runs each service as its own ``safedelivr <service>`` process (as in production), waits for
each health endpoint, creates a demo user and key, prints the dashboard URL and a curl that
sends a batch, then waits. Ctrl-C (or SIGTERM, or SIGHUP) stops the processes in reverse
order, letting each drain. The sandbox signs SendGrid-style events with a key pair made for
this run, and the webhook service is given its public half; likewise the SNS notifications of
its SES events, whose certificate the webhook service pins (with the sandbox's topic allowed).
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from sandbox import signing
from shared.accounts.accounts import create_key, upsert_github_user
from shared.accounts.domains import DomainStore
from shared.core.catalog import CATALOG
from shared.infra.config import ProviderSettings, Settings
from shared.infra.db import Database
from shared.infra.migrations import migrate
from shared.infra.resources import declare_topology

#: GitHub id of the sandbox's default user (sandbox/oauth.py).
DEMO_GITHUB_ID = 1_000_001
#: The demo user's sending domain, verified at start-up (the README's examples send from it).
DEMO_DOMAIN = "example.com"
#: Seconds to wait for one service's /healthz.
START_TIMEOUT = 60.0
#: Where the sandbox's SMTP relay listens under ``make run`` (unless
#: SAFEDELIVR_SANDBOX_SMTP_PORT says), so provider ``smtp`` can be pointed at it.
DEV_RELAY_PORT = 8025


@dataclass
class Service:
    name: str
    port: int
    process: subprocess.Popen[bytes] | None = None


def _signing_env() -> dict[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return {
        "SAFEDELIVR_SANDBOX_SENDGRID_PRIVATE_KEY": private,
        "SAFEDELIVR_WEBHOOKS_SENDGRID_PUBLIC_KEY": base64.b64encode(public).decode(),
    }


def _relay_port(settings: Settings) -> int:
    return settings.sandbox.smtp_port or DEV_RELAY_PORT


def _relay_env(settings: Settings) -> dict[str, str]:
    """Provider ``smtp`` pointed at the sandbox's relay (a relay of the user's, set in the
    environment, wins)."""
    sandbox = settings.sandbox
    return {
        "SAFEDELIVR_PROVIDERS_SMTP_HOST": "127.0.0.1",
        "SAFEDELIVR_PROVIDERS_SMTP_PORT": str(_relay_port(settings)),
        "SAFEDELIVR_PROVIDERS_SMTP_TLS": "none",
        "SAFEDELIVR_PROVIDERS_SMTP_USERNAME": sandbox.smtp_user,
        "SAFEDELIVR_PROVIDERS_SMTP_PASSWORD": sandbox.smtp_password.get_secret_value(),
    }


def _chain_env(settings: Settings) -> dict[str, str]:
    """The chain of every provider in the catalog (each one's stand-in is in the sandbox), when
    the environment or ``.env`` keeps the default: so ``GET /v1/providers`` lists them all and
    a batch may pin any of them."""
    if settings.providers.chain != ProviderSettings.model_fields["chain"].default:
        return {}
    return {"SAFEDELIVR_PROVIDERS_CHAIN": ",".join(CATALOG)}


def _chain_shown(settings: Settings) -> str:
    chain = _chain_env(settings).get("SAFEDELIVR_PROVIDERS_CHAIN", settings.providers.chain)
    return ", ".join(chain.split(","))


def _ses_env(settings: Settings) -> dict[str, str]:
    """The sandbox's SNS signing key for this run, its certificate pinned by the webhook
    service, and the sandbox's topic allowed there."""
    private, certificate = signing.generate_sns_pair()
    return {
        "SAFEDELIVR_SANDBOX_SES_SIGNING_KEY": private,
        "SAFEDELIVR_WEBHOOKS_SES_CERT_PEM": certificate,
        "SAFEDELIVR_WEBHOOKS_SES_TOPIC_ARNS": settings.sandbox.ses_topic_arn,
    }


def _wait_healthy(service: Service) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    url = f"http://127.0.0.1:{service.port}/healthz"
    while time.monotonic() < deadline:
        if service.process is not None and service.process.poll() is not None:
            raise RuntimeError(f"{service.name} exited with {service.process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{service.name} did not answer {url} within {START_TIMEOUT:.0f}s")


def _setup(settings: Settings) -> str:
    async def go() -> str:
        await migrate(settings.cassandra)
        await declare_topology(settings)
        # The demo key belongs to the sandbox GitHub's default user, so logging in to the
        # dashboard (through the fake GitHub) shows what the printed curl sends.
        db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
        try:
            user_id = await upsert_github_user(
                db,
                github_id=DEMO_GITHUB_ID,
                login="sandbox-user",
                name="Sandbox User",
                email="sandbox-user@example.com",
                avatar_url=None,
            )
            # The demo sends from example.com: verified up front (the sandbox's DNS would
            # verify it too, once its TXT record is published through /_control/dns).
            domains = DomainStore(db)
            await domains.add(user_id, DEMO_DOMAIN)
            await domains.mark_verified(user_id, DEMO_DOMAIN)
            return await create_key(db, user_id, "make run")
        finally:
            await db.close()

    return asyncio.run(go())


def run(settings: Settings) -> int:
    key = _setup(settings)
    env = {
        # Readable lines on a terminal, unless the user asked for JSON.
        "SAFEDELIVR_LOG_FORMAT": "console",
        # Users' webhooks may point at the sandbox's receiver (plain http on loopback).
        "SAFEDELIVR_HOOKS_ALLOW_HTTP": "true",
        "SAFEDELIVR_HOOKS_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
        "SAFEDELIVR_HOOKS_MAIL_FROM": f"Safedelivr <noreply@{DEMO_DOMAIN}>",
        # So may the operators' alerts (the sandbox records what is posted to it).
        "SAFEDELIVR_ALERTS_ALLOW_HTTP": "true",
        "SAFEDELIVR_ALERTS_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
        # Provider smtp is the sandbox's relay, which has no TLS.
        **_relay_env(settings),
        # Every provider the sandbox stands in for, unless the user chose a chain.
        **_chain_env(settings),
        **os.environ,
        **_signing_env(),
        **_ses_env(settings),
        "SAFEDELIVR_WEBHOOKS_MAILGUN_SIGNING_KEY": (
            settings.sandbox.mailgun_signing_key.get_secret_value()
        ),
        "SAFEDELIVR_SANDBOX_SMTP_PORT": str(_relay_port(settings)),
    }
    services = [
        Service("sandbox", settings.sandbox.port),
        Service("webhooks", settings.webhooks.port),
        Service("tracking", settings.tracking.port),
        Service("consumers", settings.consumers.port),
        Service("hooks", settings.hooks.port),
        Service("api", settings.api.port),
        # After the API: it checks every login and takes every message through it.
        Service("submission", settings.submission.port),
    ]
    stopping = running = False
    died: list[str] = []

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        if not running:  # still starting: leave the wait for a service's health at once
            raise KeyboardInterrupt

    # Ctrl-C too sets the flag rather than relying on KeyboardInterrupt: whatever handler
    # was in place before (a library's) could swallow it; the previous ones come back after.
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        for s in services:
            # A process group of its own: Ctrl-C reaches this process alone, which then stops
            # each service once (a second SIGINT makes uvicorn abort mid-drain, with a
            # traceback per service).
            s.process = subprocess.Popen(
                [sys.executable, "-m", "services.cli", s.name], env=env, process_group=0
            )
            _wait_healthy(s)
            print(f"  {s.name:<10} http://127.0.0.1:{s.port}  (pid {s.process.pid})")
        _banner(settings, key)
        running = True
        while not stopping:
            exited = [s for s in services if s.process is None or s.process.poll() is not None]
            # A service that ended on its own with status 0 retired itself (over its memory
            # limit, shared.infra.memory_guard): a fresh one takes its place, as systemd would.
            retired = [s for s in exited if s.process is not None and s.process.returncode == 0]
            if len(retired) < len(exited):
                died = [s.name for s in exited if s not in retired]
                break
            for s in retired:
                print(f"  {s.name} retired itself: starting a fresh one")
                s.process = subprocess.Popen(
                    [sys.executable, "-m", "services.cli", s.name], env=env, process_group=0
                )
                _wait_healthy(s)
            time.sleep(0.5)
    except KeyboardInterrupt:
        stopping = True
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _stop_all(services)
    if died:
        # A service died on its own: the others were stopped, and the exit status says so.
        print(f"safedelivr dev: {', '.join(died)} exited; stopped the others", file=sys.stderr)
        return 1
    return 0


def _stop_all(services: list[Service]) -> None:
    """One SIGINT each, the last started first, then wait for them to drain."""
    print("\nstopping…")
    for s in reversed(services):
        if s.process and s.process.poll() is None:
            s.process.send_signal(signal.SIGINT)
    for s in reversed(services):
        if s.process:
            try:
                s.process.wait(timeout=35)
            except subprocess.TimeoutExpired:
                s.process.kill()


def _banner(settings: Settings, key: str) -> None:
    api = settings.api.public_url
    print(f"""
Safedelivr is running.
  API + dashboard  {api}
  webhooks         http://127.0.0.1:{settings.webhooks.port}/webhooks/{{sendgrid,mailgun,ses}}
  tracking         {settings.tracking.public_url}/{{o,c,u}}/<token>  (opens, clicks, unsubscribe)
  consumers        http://127.0.0.1:{settings.consumers.port}/readyz
  hooks            http://127.0.0.1:{settings.hooks.port}/readyz  (users' webhooks; the sandbox
                   receiver http://127.0.0.1:{settings.sandbox.port}/_receiver/<any> takes them)
  SMTP submission  smtp://127.0.0.1:{settings.submission.smtp_port}  (AUTH PLAIN or LOGIN,
                   the password an API key; no STARTTLS in development)
  SMTP relay       smtp://127.0.0.1:{_relay_port(settings)}  (the sandbox's: provider smtp)
  providers        {_chain_shown(settings)} in that failover order (sandbox stand-ins; a batch
                   may pin one with "provider"; SAFEDELIVR_PROVIDERS_CHAIN chooses others)
  sandbox          http://127.0.0.1:{settings.sandbox.port}  (SendGrid, Mailgun, Amazon SES, GitHub)
  RabbitMQ UI      http://127.0.0.1:15672  (guest/guest)

Demo API key (shown once): {key}

Send a batch:
  curl -s {api}/v1/batches -H 'Authorization: Bearer {key}' \\
    -H 'Content-Type: application/json' \\
    -d '{{"from":"Demo <demo@example.com>","to":"ann@example.com, bounce@example.com",
         "subject":"Hello","text":"Hi there"}}'
Then: curl -s {api}/v1/batches/<batch_id>/logs -H 'Authorization: Bearer {key}'

Or over SMTP (its answer names the batch):
  python3 -c 'import smtplib; s = smtplib.SMTP("127.0.0.1", {settings.submission.smtp_port}); \\
    s.login("api", "{key}"); s.mail("demo@example.com"); s.rcpt("ann@example.com"); \\
    print(s.data(b"From: demo@example.com\\r\\nSubject: Hi\\r\\n\\r\\nHello\\r\\n"))'

Ctrl-C stops everything (RabbitMQ and Cassandra keep running: make services-down).
""")
