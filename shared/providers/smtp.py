"""Any SMTP relay as a provider (code ``smtp``): a small pool of ``aiosmtplib`` connections,
and the relay's answers recipient by recipient.

* **Transactions** come from :mod:`shared.providers.mime`: one per chunk in shared mode, one
  per recipient in bulk mode (their own copy), at most ``pool_size`` at once.
* **The pool** (aiosmtplib has none): an ``asyncio.Queue`` of idle connected clients, at
  most ``pool_size`` clients in use; an idle client is checked with NOOP after
  :data:`IDLE_CHECK` seconds, a client that raised anything is closed and never reused, and
  :meth:`SmtpProvider.aclose` says QUIT to every idle one.
* **Low-level calls** (``mail``, ``rcpt``, ``data``), not ``sendmail``, so the failure point
  is known:

  - a message larger than the relay's EHLO ``SIZE`` is refused for good by this relay
    before MAIL (:func:`advertised_size`; the next provider may take it), and MAIL names
    its size (``SIZE=n``) whenever the relay advertises the extension;
  - connect, EHLO, STARTTLS or MAIL failing: nothing was sent; a 4xx (421 too) or a lost
    connection is transient for the chunk, AUTH 535 (or 530) or a 5xx to MAIL is
    :class:`ProviderMisconfigured` (another provider may take it);
  - each RCPT answer is that recipient's (:func:`rcpt_answer`): 2xx accepted once DATA is
    answered 250, 4xx ``refused_transient``, 5xx ``refused_permanent`` (suppressed when its
    enhanced status is ``5.1.x``: no such mailbox); every recipient refused with ``5.7.x``
    (relaying denied) is :class:`ProviderMisconfigured`;
  - a 4xx/5xx answer to DATA or to the end of data refuses the message (nothing accepted);
  - a lost connection or a timeout inside DATA leaves the recipients RCPT accepted
    ``unknown``: aiosmtplib does not say whether the body had been written, so it is taken
    as written (a needless wait at worst, never a loss).

* **"Accepted by relay"**: the relay has no events and no query API (:meth:`lookup` is None,
  :meth:`lookup_available` False), so its 250 is all the evidence there will ever be: the
  receipt is ``final`` and its recipients end delivered with the reason "accepted by relay
  (no delivery report)" (``shared.delivery.recipient_answers``).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime
from typing import Final, Literal

import aiosmtplib

from shared.core.addresses import address_key
from shared.core.catalog import CATALOG
from shared.core.digits import natural
from shared.core.errors import (
    PermanentProviderError,
    ProviderError,
    ProviderMisconfigured,
    TransientProviderError,
)
from shared.core.models import Chunk
from shared.infra.config import ProviderSettings
from shared.infra.gil import CpuLane
from shared.providers import mime, transport
from shared.providers.base import Gate, LookupQuery, Receipt, RecipientAnswer

#: Our code for an SMTP relay in routing keys and errors.
CODE: Final = "smtp"
INFO = CATALOG[CODE]
MAX_RECIPIENTS = INFO.max_recipients
#: Seconds a pooled connection may sit idle before it is checked with NOOP.
IDLE_CHECK: Final = 30.0
#: Seconds QUIT may take per connection when closing.
QUIT_TIMEOUT: Final = 5.0
#: How the connection is protected: STARTTLS, TLS from the first byte, or not at all.
Tls = Literal["starttls", "implicit", "none"]

_ENHANCED = re.compile(r"^\s*([245])\.(\d{1,3})\.(\d{1,3})\b")


def enhanced_status(text: str) -> tuple[int, int, int] | None:
    """The RFC 3463 enhanced status code an SMTP reply's text starts with, if any."""
    found = _ENHANCED.match(text)
    if found is None:
        return None
    return int(found[1]), int(found[2]), int(found[3])


def rcpt_answer(email: str, code: int, text: str) -> RecipientAnswer:
    """A recipient's answer from the relay's reply to its RCPT (pure)."""
    text = " ".join(text.split())
    if 200 <= code < 300:
        return RecipientAnswer(email, "accepted", code, text)
    if 400 <= code < 500:
        return RecipientAnswer(email, "refused_transient", code, text)
    status = enhanced_status(text)
    suppress_it = status is not None and status[:2] == (5, 1)
    return RecipientAnswer(email, "refused_permanent", code, text, suppress=suppress_it)


def relay_denied(answers: Sequence[RecipientAnswer]) -> bool:
    """Whether every recipient was refused with ``5.7.x``: the relay will not take our mail
    at all (our credentials or its relaying rules), not a verdict on these addresses."""
    return bool(answers) and all(
        a.outcome == "refused_permanent" and (enhanced_status(a.text) or (0,))[:2] == (5, 7)
        for a in answers
    )


def mail_refused(code: int, text: str) -> ProviderError:
    """Our error for a refusal before any recipient (AUTH, MAIL)."""
    said = f"{code} {' '.join(text.split())}"
    if 500 <= code < 600:  # 530/535 (AUTH), 550 5.7.1 (sender not allowed): ours to fix
        return ProviderMisconfigured(CODE, f"the relay refused us: {said}", status=code)
    return TransientProviderError(CODE, f"the relay refused mail for now: {said}", status=code)


class _Pool:
    """Connected, authenticated clients of one relay: idle ones in a queue, at most ``size``
    in use at once."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        tls: Tls,
        username: str,
        password: str,
        helo: str,
        timeout: float,
        size: int,
    ) -> None:
        self._host, self._port, self._tls = host, port, tls
        self._username, self._password = username, password
        self._helo, self._timeout = helo, timeout
        self._slots = asyncio.Semaphore(size)
        self._idle: asyncio.Queue[tuple[aiosmtplib.SMTP, float]] = asyncio.Queue()

    @asynccontextmanager
    async def client(self) -> AsyncIterator[aiosmtplib.SMTP]:
        """A ready client for one transaction; it goes back to the pool only if the
        transaction raised nothing."""
        async with self._slots:
            smtp = await self._take()
            try:
                yield smtp
            except BaseException:
                smtp.close()
                raise
            if smtp.is_connected:
                self._idle.put_nowait((smtp, time.monotonic()))

    async def _take(self) -> aiosmtplib.SMTP:
        while not self._idle.empty():
            smtp, since = self._idle.get_nowait()
            if not smtp.is_connected:
                continue
            if time.monotonic() - since < IDLE_CHECK:
                return smtp
            try:
                await smtp.noop()
            except aiosmtplib.SMTPException:
                smtp.close()
                continue
            return smtp
        return await self._connect()

    async def _connect(self) -> aiosmtplib.SMTP:
        smtp = aiosmtplib.SMTP(
            hostname=self._host,
            port=self._port,
            local_hostname=self._helo,
            timeout=self._timeout,
            use_tls=self._tls == "implicit",
            start_tls=self._tls == "starttls",
            validate_certs=True,
        )
        try:
            await smtp.connect()
            if self._username:
                await smtp.login(self._username, self._password)
        except aiosmtplib.SMTPAuthenticationError as exc:
            smtp.close()
            raise mail_refused(exc.code, exc.message) from exc
        except aiosmtplib.SMTPNotSupported as exc:
            smtp.close()
            raise ProviderMisconfigured(CODE, f"the relay cannot do what we ask: {exc}") from exc
        except ssl.SSLError as exc:
            smtp.close()
            raise ProviderMisconfigured(CODE, f"TLS with the relay failed: {exc}") from exc
        except aiosmtplib.SMTPResponseException as exc:
            smtp.close()
            raise TransientProviderError(
                CODE, f"the relay refused the session: {exc.code} {exc.message}", status=exc.code
            ) from exc
        except (aiosmtplib.SMTPException, OSError) as exc:
            smtp.close()
            raise TransientProviderError(CODE, f"could not reach the relay: {exc!r}") from exc
        return smtp

    async def aclose(self) -> None:
        while not self._idle.empty():
            smtp, _ = self._idle.get_nowait()
            with suppress(aiosmtplib.SMTPException, OSError, TimeoutError):
                await smtp.quit(timeout=QUIT_TIMEOUT)
            smtp.close()


class SmtpProvider:
    """Sends chunks through an SMTP relay."""

    code: str = CODE
    name: str = INFO.name
    max_recipients: int = MAX_RECIPIENTS

    def __init__(
        self,
        *,
        host: str,
        port: int,
        tls: Tls,
        username: str,
        password: str,
        helo_name: str,
        timeout: float,
        pool_size: int = 4,
        cpu: CpuLane | None = None,
    ) -> None:
        """Args:
        tls: ``starttls``, ``implicit`` or ``none`` (the settings refuse none in production).
        helo_name: the name we give in EHLO, also the domain of our Message-IDs.
        cpu: the process's CPU lane, where messages are built (default: one of its own).
        """
        self._helo = helo_name
        self._seconds = timeout
        self._pool_size = pool_size
        self._pool = _Pool(
            host=host,
            port=port,
            tls=tls,
            username=username,
            password=password,
            helo=helo_name,
            timeout=timeout,
            size=pool_size,
        )
        self._cpu = cpu or CpuLane()
        self._owns_cpu = cpu is None
        self._calls = transport.Calls()

    @classmethod
    def from_settings(cls, settings: ProviderSettings, cpu: CpuLane | None = None) -> SmtpProvider:
        return cls(
            host=settings.smtp_host,
            port=settings.smtp_port,
            tls=settings.smtp_tls,
            username=settings.smtp_username,
            password=settings.smtp_password.get_secret_value(),
            helo_name=settings.smtp_helo_name,
            timeout=settings.timeout,
            pool_size=settings.smtp_pool_size,
            cpu=cpu,
        )

    async def send(self, chunk: Chunk, gate: Gate | None = None) -> Receipt:
        now = datetime.now(UTC)
        # A bulk chunk is up to 100 messages to build: off the loop, like the HTTP payloads.
        transactions = await self._cpu.run(
            mime.transactions, CODE, chunk, max_recipients=MAX_RECIPIENTS, helo=self._helo, now=now
        )
        if gate is not None:
            await gate()
        wanted = {address_key(r.email) for r in chunk.recipients}
        with self._calls:
            if len(transactions) == 1:
                answers = await self._transact(transactions[0])
            else:
                answers = await self._each(transactions)
        # Only the chunk's own recipients have rows to answer for (cc and bcc have none).
        mine = tuple(a for a in answers if address_key(a.email) in wanted)
        if mine and all(a.outcome == "unknown" for a in mine):
            raise TransientProviderError(
                CODE,
                "connection lost or no answer after the message was sent (the relay may "
                "have accepted it)",
                outcome_unknown=True,
            )
        return Receipt(
            CODE, 250, transactions[0].message_id if len(transactions) == 1 else None,
            recipients=mine, final=True,
        )  # fmt: skip

    async def _each(self, transactions: Sequence[mime.Transaction]) -> list[RecipientAnswer]:
        """Bulk: every recipient's own transaction (the pool bounds how many at once); a
        transaction that failed as a whole answers for its recipient."""
        results = await asyncio.gather(
            *(self._transact(t) for t in transactions), return_exceptions=True
        )
        answers: list[RecipientAnswer] = []
        failures: list[ProviderError] = []
        for t, result in zip(transactions, results, strict=True):
            if isinstance(result, ProviderError):
                failures.append(result)
                answers += [_failed(email, result) for email in t.recipients]
            elif isinstance(result, BaseException):
                raise result
            else:
                answers += result
        if failures and not any(
            a.outcome in ("accepted", "unknown", "refused_permanent") for a in answers
        ):
            # Nothing taken, nothing in doubt: the chunk failed as a whole (the relay is down,
            # or refuses us), which the usual failover handles.
            raise failures[0]
        return answers

    async def _transact(self, t: mime.Transaction) -> list[RecipientAnswer]:
        """One transaction; raises when it failed as a whole before anything could be taken."""
        async with self._pool.client() as smtp:
            size = len(t.data)
            limit = advertised_size(smtp.esmtp_extensions)
            if limit is not None and size > limit:
                # Refused before a byte is sent: the next provider may take it (RFC 1870).
                raise PermanentProviderError(
                    CODE,
                    f"the message ({size} bytes) is larger than the relay takes (SIZE {limit})",
                    status=552,
                )
            try:
                await smtp.mail(t.sender, options=[f"SIZE={size}"] if limit is not None else None)
            except aiosmtplib.SMTPSenderRefused as exc:
                raise mail_refused(exc.code, exc.message) from exc
            except (aiosmtplib.SMTPException, OSError) as exc:
                raise TransientProviderError(CODE, f"lost the relay at MAIL: {exc!r}") from exc
            answers: list[RecipientAnswer] = []
            for email in t.recipients:
                try:
                    reply = await smtp.rcpt(email)
                except aiosmtplib.SMTPRecipientRefused as exc:
                    answers.append(rcpt_answer(email, exc.code, exc.message))
                    continue
                except (aiosmtplib.SMTPException, OSError) as exc:
                    raise TransientProviderError(CODE, f"lost the relay at RCPT: {exc!r}") from exc
                answers.append(rcpt_answer(email, reply.code, reply.message))
            if relay_denied(answers):
                raise ProviderMisconfigured(
                    CODE, f"the relay denies relaying: {answers[0].code} {answers[0].text}"
                )
            if not any(a.outcome == "accepted" for a in answers):
                await _reset(smtp)
                return answers
            try:
                await smtp.data(t.data)
            except aiosmtplib.SMTPDataError as exc:
                # An answer to DATA or to the end of data: the relay took nothing.
                raise _data_refused(exc.code, exc.message) from exc
            except (aiosmtplib.SMTPException, OSError) as exc:
                # Never back to the pool: a late reply would answer the next transaction.
                smtp.close()
                return [
                    RecipientAnswer(a.email, "unknown", None, f"no answer to the message: {exc!r}")
                    if a.outcome == "accepted"
                    else a
                    for a in answers
                ]
            return [
                RecipientAnswer(a.email, "accepted", a.code, a.text, message_id=t.message_id)
                if a.outcome == "accepted"
                else a
                for a in answers
            ]

    async def lookup(self, query: LookupQuery) -> frozenset[str] | None:
        return None  # a relay has no query API

    async def lookup_available(self) -> bool:
        return False

    async def aclose(self) -> None:
        """Close once the transactions in flight ended, saying QUIT to each idle connection."""
        await self._calls.drained(2 * self._seconds + 5)
        await self._pool.aclose()
        if self._owns_cpu:
            await self._cpu.aclose()


def advertised_size(extensions: Mapping[str, str]) -> int | None:
    """The largest message the relay said (EHLO ``SIZE n``, RFC 1870) it takes; ``None``
    when it said nothing, or ``SIZE`` with no number or 0 (no fixed limit)."""
    said = natural(extensions.get("size", "").strip())  # a relay's text: ASCII digits only
    return said or None


def _failed(email: str, error: ProviderError) -> RecipientAnswer:
    """The answer for a recipient whose own transaction failed as a whole: unknown when the
    relay may have taken it, otherwise refused for now. A whole transaction refused (the
    relay down or refusing us, her copy larger than it takes) says nothing of her address:
    another provider may take her."""
    if error.outcome_unknown:
        return RecipientAnswer(email, "unknown", error.status, error.message)
    return RecipientAnswer(email, "refused_transient", error.status, error.message)


def _data_refused(code: int, text: str) -> ProviderError:
    said = f"{code} {' '.join(text.split())}"
    if 400 <= code < 500:
        return TransientProviderError(CODE, f"the relay refused the message for now: {said}")
    return ProviderMisconfigured(CODE, f"the relay refused the message: {said}", status=code)


async def _reset(smtp: aiosmtplib.SMTP) -> None:
    """End a transaction no recipient of which was accepted, keeping the connection."""
    try:
        await smtp.rset()
    except (aiosmtplib.SMTPException, OSError):
        smtp.close()
