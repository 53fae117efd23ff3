"""The SMTP side of submission: sessions (aiosmtpd), AUTH with an API key, and the answer to
each message, given once the API has the batch.

* **AUTH** ``PLAIN`` or ``LOGIN``: the password is an API key (the user name is not used);
  the key is checked with the API (``GET /v1/keys/current``) and must hold the ``send`` scope.
  Nothing is accepted before AUTH (``530``), and outside development AUTH is refused before
  STARTTLS, so a key never crosses the network in the clear.
* **A message** becomes a batch (:mod:`services.submission.message`, off the event loop) and is
  posted to ``POST /v1/batches`` with the sender's key: the same use case as any batch
  (validation, verified sending domains, suppressions, quota, idempotency by Message-ID).
  ``250`` is answered only once the API answered ``202``, that is once the batch is durable;
  an API that cannot take it now gets the client a ``451`` (try again: its retry, with the
  same Message-ID, makes the same batch), and a batch the API refuses a ``5xx`` with the
  API's reason.
* **Limits**: SIZE (larger messages get ``552``), recipients per message (``452`` past the
  limit), sessions per process (``421`` past the limit).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import ssl
from dataclasses import dataclass
from typing import Any, Final

import httpx
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, Session

from services.submission.message import Refused, batch_of
from shared.infra.config import SubmissionSettings
from shared.infra.gil import CpuLane

log = logging.getLogger(__name__)

#: The scope an API key needs to submit mail.
SEND_SCOPE: Final = "send"
#: Longest API reason quoted in an SMTP reply.
_MAX_REASON: Final = 300


@dataclass(frozen=True, slots=True)
class Sender:
    """Who authenticated a session: their API key and its id (for logs)."""

    key: str
    key_id: str


class Submissions:
    """The aiosmtpd handler: AUTH, RCPT and DATA of every session of one process."""

    def __init__(
        self,
        api: httpx.AsyncClient,
        settings: SubmissionSettings,
        cpu: CpuLane,
    ) -> None:
        """Args:
        api: a client whose base URL is the API's; the caller owns it.
        """
        self._api = api
        self._settings = settings
        self._cpu = cpu

    # ------------------------------------------------------------------- AUTH (aiosmtpd hooks)

    async def auth_PLAIN(self, server: SMTP, args: list[str]) -> AuthResult:
        if len(args) == 1:
            answer = await server.challenge_auth("")
            if not isinstance(answer, bytes):
                return AuthResult(success=False)
        else:
            decoded = _base64(args[1])
            if decoded is None:
                await server.push("501 5.5.2 cannot decode the credentials")
                return AuthResult(success=False, handled=True)
            answer = decoded
        parts = answer.split(b"\x00")
        if len(parts) != 3:
            await server.push("501 5.5.2 cannot split the credentials")
            return AuthResult(success=False, handled=True)
        return await self._admit(server, parts[2])

    async def auth_LOGIN(self, server: SMTP, args: list[str]) -> AuthResult:
        if len(args) == 1:
            login = await server.challenge_auth(server.AuthLoginUsernameChallenge)
            if not isinstance(login, bytes):
                return AuthResult(success=False)
        elif _base64(args[1]) is None:
            await server.push("501 5.5.2 cannot decode the user name")
            return AuthResult(success=False, handled=True)
        password = await server.challenge_auth(server.AuthLoginPasswordChallenge)
        if not isinstance(password, bytes):
            return AuthResult(success=False)
        return await self._admit(server, password)

    async def _admit(self, server: SMTP, password: bytes) -> AuthResult:
        """Whether the password is an API key that may send (the API decides)."""
        try:
            key = password.decode("ascii")
            response = await self._api.get(
                "/v1/keys/current",
                headers={"Authorization": f"Bearer {key}"},
                timeout=self._settings.timeout,
            )
        except UnicodeDecodeError:
            return AuthResult(success=False, handled=False)
        except httpx.HTTPError as exc:
            log.warning("could not check an SMTP login with the API: %r", exc)
            await server.push("454 4.7.0 cannot check the credentials now; try again later")
            return AuthResult(success=False, handled=True)
        if response.status_code in (401, 403):
            return AuthResult(success=False, handled=False)  # 535, as for any wrong password
        if response.status_code != 200:
            await server.push("454 4.7.0 cannot check the credentials now; try again later")
            return AuthResult(success=False, handled=True)
        found = response.json()
        if SEND_SCOPE not in found.get("scopes", ()):
            await server.push("535 5.7.8 this API key lacks the send scope")
            return AuthResult(success=False, handled=True)
        return AuthResult(success=True, auth_data=Sender(key, str(found.get("key_id", ""))))

    # ------------------------------------------------------------------- the envelope and DATA

    async def handle_MAIL(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        mail_options: list[str],
    ) -> str:
        # Ours rather than aiosmtpd's ``auth_required``, which without TLS (development) warns
        # at every session; the answer is the same.
        if not session.authenticated:
            return "530 5.7.0 authentication required"
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 2.1.0 OK"

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        if len(envelope.rcpt_tos) >= self._settings.max_recipients:
            return f"452 4.5.3 at most {self._settings.max_recipients} recipients per message"
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        sender: Any = session.auth_data
        if not isinstance(sender, Sender):  # pragma: no cover - MAIL refuses first
            return "530 5.7.0 authentication required"
        raw = envelope.original_content or b""
        try:
            # Parsing is linear in the message (up to SIZE): off the event loop.
            submission = await self._cpu.run(batch_of, raw, list(envelope.rcpt_tos))
        except Refused as refused:
            log.info("SMTP message refused (key %s): %s", sender.key_id, refused.reply)
            return refused.reply
        headers = {"Authorization": f"Bearer {sender.key}"}
        if submission.idempotency_key:
            headers["Idempotency-Key"] = submission.idempotency_key
        try:
            response = await self._api.post(
                "/v1/batches",
                json=submission.body,
                headers=headers,
                timeout=self._settings.timeout,
            )
        except httpx.HTTPError as exc:
            log.warning("the API did not take an SMTP message: %r", exc)
            return "451 4.3.0 the message could not be stored now; try again later"
        return reply_to(response.status_code, _json(response))


def reply_to(status: int, answer: dict[str, Any]) -> str:
    """The SMTP reply for the API's answer to a message's batch (pure)."""
    if 200 <= status < 300:
        return f"250 2.0.0 queued as {answer.get('batch_id', '?')}"
    found = answer.get("error")
    reason = _reason(found if isinstance(found, dict) else {})
    if status == 401:
        return "535 5.7.8 the API key was refused"
    if status == 403:
        return f"550 5.7.1 {reason}"
    if status == 409:
        return f"550 5.7.0 {reason}"
    if status == 413:
        return f"552 5.3.4 {reason}"
    if status == 429:
        return f"451 4.7.1 {reason}; try again later"
    if 400 <= status < 500:
        return f"550 5.6.0 {reason}"
    return "451 4.3.0 the message could not be stored now; try again later"


def _reason(error: dict[str, Any]) -> str:
    """The API's reason on one line of printable ASCII, with the fields it names."""
    message = str(error.get("message") or error.get("code") or "refused")
    fields = error.get("fields")
    if isinstance(fields, dict) and fields:
        message += " (" + "; ".join(f"{k}: {v}" for k, v in list(fields.items())[:5]) + ")"
    printable = "".join(c if " " <= c <= "~" else "?" for c in " ".join(message.split()))
    return printable[:_MAX_REASON]


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        found = response.json()
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _base64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text.encode(), validate=True)
    except (binascii.Error, ValueError):
        return None


class _Limited(SMTP):
    """An SMTP session that counts itself among the process's, and says ``421`` past the
    limit instead of serving."""

    def __init__(self, handler: Submissions, sessions: Sessions, **options: Any) -> None:
        super().__init__(handler, **options)
        self._sessions = sessions
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._sessions.open >= self._sessions.limit:
            if isinstance(transport, asyncio.WriteTransport):
                transport.write(b"421 4.3.2 too many connections; try again later\r\n")
            transport.close()
            return
        self._sessions.open += 1
        self._counted = True
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        if self._counted:
            self._sessions.open -= 1
            self._counted = False
            super().connection_lost(error)


@dataclass(slots=True)
class Sessions:
    """The SMTP sessions a process has open, and how many it may."""

    limit: int
    open: int = 0


def tls_context(settings: SubmissionSettings) -> ssl.SSLContext | None:
    """The STARTTLS context of the configured certificate, or None without one."""
    if not settings.tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    return context


async def serve(
    handler: Submissions, settings: SubmissionSettings, *, port: int | None = None
) -> asyncio.Server:
    """Listen for SMTP sessions (on ``port``, default the configured one; 0: any free port)."""
    context = tls_context(settings)
    sessions = Sessions(settings.max_sessions)
    options: dict[str, Any] = {
        "hostname": settings.hostname,
        "ident": "Safedelivr submission",
        "data_size_limit": settings.max_message_bytes,
        "enable_SMTPUTF8": True,
        # Outside development there is a certificate, and AUTH waits for STARTTLS (MAIL
        # waits for AUTH: :meth:`Submissions.handle_MAIL`).
        "auth_require_tls": context is not None,
        "tls_context": context,
        "require_starttls": context is not None,
        "timeout": 300,
    }
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: _Limited(handler, sessions, **options),
        settings.host,
        settings.smtp_port if port is None else port,
        reuse_port=True,  # the workers of one host share the port
    )
