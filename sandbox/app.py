"""The sandbox application: ``create_app`` wires state, routes and the lifespan.

One Starlette app serves the SendGrid (``/sendgrid``), Mailgun (``/mailgun``), Amazon SES
(``/ses``) and GitHub (``/github``) stand-ins, the control API (``/_control``) and
``/healthz``. The lifespan opens the HTTP client that posts webhooks (unless one is
injected), runs the webhook tasks and listens as the SMTP relay stand-in (``sandbox.relay``,
on its own port); tests that use ``httpx.ASGITransport`` enter it with
``app.router.lifespan_context(app)``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from starlette.applications import Starlette
from starlette.routing import Mount, Route

from sandbox import control, dns, endpoints, github, receiver, relay, ses, signing
from sandbox.state import SandboxState
from sandbox.tuning import Tuning
from sandbox.webhooks import WebhookDispatcher
from shared.core.errors import ConfigError
from shared.infra.config import SandboxSettings

_log = logging.getLogger(__name__)


def create_app(
    settings: SandboxSettings,
    *,
    http: httpx.AsyncClient | None = None,
    tuning: Tuning | None = None,
) -> Starlette:
    """Build a sandbox app.

    Args:
        settings: where to post webhooks, the signing keys and the webhook delay.
        http: the client that posts webhooks; the caller keeps ownership. When None the
            lifespan opens (and closes) its own.
        tuning: batching, retry and memory bounds; defaults suit ``make run`` and benchmarks.
    """
    tuning = tuning or Tuning()
    key = _sendgrid_key(settings)
    state = SandboxState(
        settings=settings,
        tuning=tuning,
        sendgrid_key=key,
        dispatcher=WebhookDispatcher(
            base_url=settings.webhook_url,
            sendgrid_key=key,
            mailgun_signing_key=settings.mailgun_signing_key.get_secret_value(),
            delay=settings.webhook_delay,
            tuning=tuning,
            ses_key=_ses_key(settings),
            ses_topic_arn=settings.ses_topic_arn,
        ),
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        posters = tuning.sendgrid_workers + tuning.mailgun_workers + tuning.ses_workers
        client = http or httpx.AsyncClient(
            limits=httpx.Limits(max_connections=posters, max_keepalive_connections=posters)
        )
        state.dispatcher.start(client)
        app.state.relay = await relay.start(state, settings.host, settings.smtp_port)
        _log.info(
            "sandbox posting webhooks to %s; SendGrid verification key %s",
            settings.webhook_url,
            state.sendgrid_public_key,
        )
        try:
            yield
        finally:
            await app.state.relay.close()
            await state.dispatcher.stop()
            if http is None:
                await client.aclose()

    app = Starlette(
        routes=[
            Route("/healthz", control.healthz, methods=["GET"]),
            Mount("/sendgrid", routes=endpoints.sendgrid_routes()),
            Mount("/mailgun", routes=endpoints.mailgun_routes()),
            Mount("/ses", routes=ses.routes()),
            *ses.sns_routes(),
            Mount("/github", routes=github.routes()),
            *dns.routes(),
            Mount("/_receiver", routes=receiver.routes()),
            Mount(
                "/_control",
                routes=[
                    *control.routes(),
                    *dns.control_routes(),
                    *receiver.control_routes(),
                    *relay.control_routes(),
                    *ses.control_routes(),
                ],
            ),
        ],
        lifespan=lifespan,
    )
    app.state.sandbox = state
    app.state.received = receiver.Received()
    return app


def _sendgrid_key(settings: SandboxSettings) -> ec.EllipticCurvePrivateKey:
    if settings.sendgrid_private_key is None:
        return signing.generate_private_key()
    try:
        return signing.load_private_key(settings.sendgrid_private_key.get_secret_value())
    except ValueError as exc:
        raise ConfigError(
            f"SAFEDELIVR_SANDBOX_SENDGRID_PRIVATE_KEY: not a PEM ECDSA P-256 private key ({exc})"
        ) from exc


def _ses_key(settings: SandboxSettings) -> rsa.RSAPrivateKey | None:
    if settings.ses_signing_key is None:
        return None
    try:
        return signing.load_sns_key(settings.ses_signing_key.get_secret_value())
    except ValueError as exc:
        raise ConfigError(
            f"SAFEDELIVR_SANDBOX_SES_SIGNING_KEY: not a PEM RSA private key ({exc})"
        ) from exc
