"""The SMTP submission process (``safedelivr submission``): the SMTP server of
:mod:`services.submission.server` on ``SAFEDELIVR_SUBMISSION_SMTP_PORT``, and /healthz,
/readyz (the API answers) and /metrics on its own HTTP port.

It holds no connection to Cassandra or RabbitMQ: every message becomes a batch through the
API, which owns acceptance. Several workers share the SMTP port (``SO_REUSEPORT``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from starlette.applications import Starlette
from starlette.requests import Request

from services.submission.server import Submissions, serve
from shared.core.errors import ConfigError
from shared.infra.config import Settings
from shared.infra.gil import CpuLane
from shared.infra.health import Check, health_routes
from shared.infra.metrics import new_registry

log = logging.getLogger(__name__)


def api_url(settings: Settings) -> str:
    """Where batches are submitted: the configured URL, else the API's public one."""
    return (settings.submission.api_url or settings.api.public_url).rstrip("/")


def create_app(settings: Settings, *, api: httpx.AsyncClient | None = None) -> Starlette:
    """The process's app; ``api`` (its caller keeps it) replaces the client it would open
    to the API (tests pass one bound to an app in the same process).

    Raises ConfigError in production without a certificate: AUTH would carry API keys in
    the clear."""
    smtp = settings.submission
    if settings.env == "production" and not (smtp.tls_cert_file and smtp.tls_key_file):
        raise ConfigError(
            "SAFEDELIVR_SUBMISSION_TLS_CERT_FILE and SAFEDELIVR_SUBMISSION_TLS_KEY_FILE: "
            "production needs STARTTLS, or API keys would cross the network in the clear"
        )
    registry = new_registry()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        own = api is None
        client = api or httpx.AsyncClient(
            base_url=api_url(settings), follow_redirects=False, trust_env=False
        )
        cpu = CpuLane("mime")
        app.state.api = client
        _quiet_aiosmtpd()
        try:
            handler = Submissions(client, settings.submission, cpu)
            server = await serve(handler, settings.submission)
            app.state.smtp = server
            log.info(
                "SMTP submission on %s:%d (STARTTLS %s), batches to %s",
                settings.submission.host,
                settings.submission.smtp_port,
                "required" if settings.submission.tls_cert_file else "off: development only",
                client.base_url,
            )
            try:
                yield
            finally:
                server.close()
                await server.wait_closed()
        finally:
            await cpu.aclose()
            if own:
                await client.aclose()

    def checks(request: Request) -> dict[str, Check]:
        client: httpx.AsyncClient = request.app.state.api

        async def api_answers() -> None:
            (await client.get("/healthz", timeout=5.0)).raise_for_status()

        return {"api": api_answers}

    routes = health_routes("submission", registry, checks, settings.metrics_token)
    return Starlette(routes=routes, lifespan=lifespan)


def _quiet_aiosmtpd() -> None:
    """aiosmtpd logs every command of every session at INFO (``mail.log``), and warns of its
    own deprecated ``login_data`` at every AUTH: our log keeps its warnings and errors only."""
    logger = logging.getLogger("mail.log")
    logger.setLevel(logging.WARNING)
    if not any(isinstance(f, _OwnDeprecation) for f in logger.filters):
        logger.addFilter(_OwnDeprecation())


class _OwnDeprecation(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "deprecated" not in record.getMessage()
