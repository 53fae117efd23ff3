"""The sandbox's SMTP relay (provider ``smtp``): a real aiosmtpd server, started in the
sandbox's lifespan on ``SAFEDELIVR_SANDBOX_SMTP_PORT`` (0: any free port, read back from
``GET /_control/smtp``), that the SMTP adapter (``shared.providers.smtp``) talks to.

* **AUTH** ``PLAIN`` or ``LOGIN`` with the sandbox's user and password (535 otherwise);
  ``MAIL`` before AUTH gets 530. No TLS: it listens on loopback for ``make run`` and tests.
* **Accepted transactions** are recorded in the sandbox ledger as provider ``smtp``, so
  ``GET /_control/sends`` counts them by recipient like the HTTP providers' mail.
* **Answers by address** (always on, like the HTTP stand-ins' address rules): a recipient
  whose local part starts with ``rcpt4xx`` gets ``451 4.2.1``, ``rcpt5xx`` gets
  ``550 5.1.1`` (no such user), ``rcpt57x`` gets ``550 5.7.1`` (relaying denied).
* **Faults** (``POST /_control/faults`` with provider ``smtp``), one per transaction:
  a ``status`` (400-599) is the answer to ``MAIL`` (``421``: the relay refuses mail now);
  ``reset`` drops the connection at ``MAIL``, accepting nothing; with ``accept`` the message
  is first recorded, then the relay answers ``status`` to the end of data instead of 250, or
  with ``reset`` drops the connection with no reply at all (the ambiguous case with a real
  accept); ``latency_ms`` delays the answer to the end of data.
* **Connections** are counted (``GET /_control/smtp``), so a test sees a pool reuse them,
  and ``DELETE /_control/smtp/connections`` drops the open ones (a relay that restarts).
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import hmac
import itertools
import logging
import weakref
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any, Final

from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sandbox.faults import Fault
from sandbox.state import SandboxState
from sandbox.wire import json_response

log = logging.getLogger(__name__)

#: Our provider name in the ledger and the fault book.
PROVIDER: Final = "smtp"
#: Local-part prefixes that get a fixed RCPT answer.
RCPT_ANSWERS: Final = {
    "rcpt4xx": "451 4.2.1 mailbox busy; try again later",
    "rcpt5xx": "550 5.1.1 no such user here",
    "rcpt57x": "550 5.7.1 relaying denied",
}


@dataclass(slots=True)
class RelayStats:
    """What the relay saw of its clients: connections opened, and those open now."""

    connections: int = 0
    sessions: set[SMTP] = field(default_factory=set)

    @property
    def open(self) -> int:
        return len(self.sessions)

    def drop_all(self) -> int:
        """Close every open connection at once, as a relay that restarts; return how many."""
        sessions = list(self.sessions)
        for session in sessions:
            _drop(session)
        return len(sessions)


@dataclass(slots=True)
class Relay:
    """The listening relay: its server, port and counters."""

    server: asyncio.Server
    stats: RelayStats = field(default_factory=RelayStats)

    @property
    def port(self) -> int:
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        self.server.close()
        # Sessions of pooled clients stay open until their client quits: do not wait for them.


class RelayHandler:
    """The aiosmtpd handler: MAIL, RCPT and DATA of every session of the relay."""

    def __init__(self, state: SandboxState) -> None:
        self._state = state
        self._ids = itertools.count(1)
        # The fault each transaction took at MAIL, for its DATA (aiosmtpd gives a handler no
        # per-transaction slot of its own; an abandoned envelope takes its entry with it).
        self._faults: weakref.WeakKeyDictionary[Envelope, Fault] = weakref.WeakKeyDictionary()

    async def handle_MAIL(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        mail_options: list[str],
    ) -> str:
        if not session.authenticated:
            return "530 5.7.0 authentication required"
        fault = self._state.faults.take(PROVIDER)
        if fault is not None and not fault.accept:
            if fault.reset:
                _drop(server)
                return "421 4.3.0 connection dropped"  # never heard: the connection is gone
            if fault.status is not None:
                return _reply(fault.status, "the relay refuses mail now")
        # The fault (with ``accept``) applies once the message is in: DATA reads it back.
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        if fault is not None:
            self._faults[envelope] = fault
        return "250 2.1.0 OK"

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        local = address.partition("@")[0].lower()
        for prefix, answer in RCPT_ANSWERS.items():
            if local.startswith(prefix):
                return answer
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        fault = self._faults.pop(envelope, None)
        raw = envelope.original_content or b""
        message_id = f"<sandbox.{next(self._ids)}@relay.sandbox>"
        self._state.ledger.record(
            PROVIDER,
            envelope.rcpt_tos,
            message_id=message_id,
            size=len(raw),
            request=_request(envelope, raw),
            attachments=_files(raw),
        )
        if fault is not None:
            if fault.latency_ms:
                await asyncio.sleep(fault.latency_ms / 1000)
            if fault.reset:
                _drop(server)
                return "250 2.0.0 never heard"  # the connection is gone
            if fault.status is not None:
                return _reply(fault.status, "the relay failed after taking the message")
        return f"250 2.0.0 queued as {message_id}"


def _reply(status: int, text: str) -> str:
    klass = status // 100
    return f"{status} {klass}.3.0 {text}"


def _drop(server: SMTP) -> None:
    """Close the connection at once, with no reply."""
    transport = server.transport
    if isinstance(transport, asyncio.Transport):
        transport.abort()


def _files(raw: bytes) -> list[dict[str, object]]:
    """Each file the message carries (every part that is not a body): its name, type,
    disposition, Content-ID and decoded size, as the ledger keeps them for every provider."""
    parsed = email.parser.BytesParser(policy=email.policy.SMTP).parsebytes(raw)
    if not isinstance(parsed, EmailMessage) or not parsed.is_multipart():
        return []
    bodies = {id(p) for p in (parsed.get_body(("plain",)), parsed.get_body(("html",))) if p}
    files: list[dict[str, object]] = []
    for part in parsed.walk():
        if part.is_multipart() or id(part) in bodies:
            continue
        data = part.get_payload(decode=True)
        cid = part.get("Content-ID")
        files.append(
            {
                "filename": part.get_filename(),
                "content_type": part.get_content_type(),
                "disposition": part.get_content_disposition() or "attachment",
                "content_id": str(cid).strip("<>") if cid else None,
                "size": len(data) if isinstance(data, bytes) else 0,
            }
        )
    return files


def _request(envelope: Envelope, raw: bytes) -> dict[str, Any]:
    """What the ledger keeps of a transaction: the envelope and the message's headers."""
    parsed = email.parser.BytesParser(policy=email.policy.SMTP).parsebytes(raw, headersonly=True)
    return {
        "mail_from": envelope.mail_from,
        "rcpt_to": list(envelope.rcpt_tos),
        "headers": {name: str(value) for name, value in parsed.items()},
    }


class _Counted(SMTP):
    """A relay session that counts its connection."""

    def __init__(self, handler: RelayHandler, stats: RelayStats, **options: Any) -> None:
        super().__init__(handler, **options)
        self._stats = stats

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._stats.connections += 1
        self._stats.sessions.add(self)
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        self._stats.sessions.discard(self)
        super().connection_lost(error)


def authenticator(user: str, password: str) -> Any:
    """The aiosmtpd authenticator that admits ``user`` with ``password`` only."""

    def check(
        server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        if not isinstance(data, LoginPassword):
            return AuthResult(success=False)
        ok = hmac.compare_digest(data.login, user.encode()) and hmac.compare_digest(
            data.password, password.encode()
        )
        return AuthResult(success=ok, handled=False)

    return check


async def start(state: SandboxState, host: str, port: int) -> Relay:
    """Listen for SMTP clients on ``host``:``port`` (0: any free port)."""
    settings = state.settings
    stats = RelayStats()
    handler = RelayHandler(state)
    options: dict[str, Any] = {
        "hostname": "relay.sandbox",
        "ident": "Safedelivr sandbox relay",
        "data_size_limit": settings.smtp_max_bytes,
        "enable_SMTPUTF8": True,
        "authenticator": authenticator(
            settings.smtp_user, settings.smtp_password.get_secret_value()
        ),
        # Loopback and tests only: AUTH in the clear is what this stand-in is for.
        "auth_require_tls": False,
        "timeout": 300,
    }
    _quiet()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Counted(handler, stats, **options), host, port)
    relay = Relay(server, stats)
    log.info("sandbox SMTP relay on %s:%d", host, relay.port)
    return relay


def _quiet() -> None:
    """aiosmtpd logs every command at INFO and warns at each session that AUTH goes in the
    clear: the sandbox keeps its errors only."""
    logging.getLogger("mail.log").setLevel(logging.ERROR)


def control_routes() -> list[BaseRoute]:
    """Routes mounted at ``/_control``: ``GET /smtp`` the relay's port and counters;
    ``DELETE /smtp/connections`` drops every open connection (a relay restart)."""
    return [
        Route("/smtp", relay_info, methods=["GET"]),
        Route("/smtp/connections", drop_connections, methods=["DELETE"]),
    ]


def _relay(request: Request) -> Relay | None:
    relay: Relay | None = getattr(request.app.state, "relay", None)
    return relay


async def drop_connections(request: Request) -> Response:
    relay = _relay(request)
    if relay is None:
        return json_response({"error": "the SMTP relay is not running"}, 404)
    return json_response({"dropped": relay.stats.drop_all()})


async def relay_info(request: Request) -> Response:
    relay = _relay(request)
    if relay is None:
        return json_response({"error": "the SMTP relay is not running"}, 404)
    stats = relay.stats
    return json_response(
        {
            "port": relay.port,
            "connections": stats.connections,
            "open": stats.open,
        }
    )
