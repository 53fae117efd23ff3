"""Sending one event to a user's webhook endpoint over HTTP: the SSRF guard at delivery time
and the request itself.

The host is resolved here, every address it resolves to must pass ``shared.outbound.ssrf``, and the
connection goes to the first vetted address (the URL's host stays in ``Host`` and in TLS SNI,
and the certificate is checked against it), so a DNS answer that changes between the check
and the connection (rebinding) cannot send us elsewhere. The request is a POST of the JSON
body with the three Standard Webhooks headers; redirects are not followed, at most
:data:`MAX_ANSWER` bytes of the answer are read, and the whole exchange has ``timeout``.
Failures are data (:class:`Outcome`), never exceptions.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import httpx

from shared.outbound import outbound_signing, ssrf
from shared.outbound.ssrf import IPAddress, Network, Target, TargetError

#: Bytes of an endpoint's answer read (the rest is dropped unread).
MAX_ANSWER: Final = 4096
#: User-Agent of deliveries.
USER_AGENT: Final = "Safedelivr-Webhooks/1"

Resolve = Callable[[str, int], Awaitable[list[IPAddress]]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one attempt came to: a status, or an error (``status`` None)."""

    status: int | None
    error: str | None
    duration_ms: int


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (the system resolver)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for info in infos:
        address = ssrf.literal(str(info[4][0]).split("%")[0])
        if address is not None and address not in found:
            found.append(address)
    return found


async def vet(target: Target, allowed: Sequence[Network], resolver: Resolve = resolve) -> IPAddress:
    """The address to connect to, or TargetError saying why none may be (for a name, never
    what it resolved to, nor the resolver's error: see ``shared.outbound.ssrf``)."""
    literal = ssrf.literal(target.host)
    if literal is not None:
        problem = ssrf.address_problem(literal, allowed)
        if problem:
            raise TargetError(problem)
        return literal
    try:
        found = await resolver(target.host, target.port)
    except OSError:
        raise TargetError(ssrf.NAME_REFUSED) from None
    problem = ssrf.resolved_problem(found, allowed)
    if problem:
        raise TargetError(problem)
    return found[0]


def _unnamed(error: str, target: Target, address: IPAddress) -> str:
    """A transport error's text without the vetted address of a name (the connection went
    to it, so errors name it): the user sees the host they wrote instead."""
    if ssrf.literal(target.host) is not None:
        return error
    return error.replace(str(address), target.host)


def pinned_url(target: Target, address: IPAddress, url: str) -> str:
    """``url`` with its host replaced by the vetted ``address`` (pure)."""
    parsed = httpx.URL(url)
    return str(parsed.copy_with(host=str(address), port=target.port))


def host_header(target: Target) -> str:
    default = 443 if target.scheme == "https" else 80
    host = f"[{target.host}]" if ":" in target.host else target.host
    return host if target.port == default else f"{host}:{target.port}"


@dataclass
class Deliverer:
    """Sends signed events (one shared client, built and closed by the worker's lifespan)."""

    http: httpx.AsyncClient
    timeout: float = 10.0
    allow_http: bool = False
    allowed: Sequence[Network] = ()
    resolver: Resolve = resolve

    async def send(
        self, url: str, msg_id: str, body: bytes, secrets: Sequence[str], now: float
    ) -> Outcome:
        started = time.monotonic()

        def took() -> int:
            return int((time.monotonic() - started) * 1000)

        try:
            target = ssrf.parse_target(url, allow_http=self.allow_http)
            # Within the timeout: a user's slow name server must not hold the worker.
            async with asyncio.timeout(self.timeout):
                address = await vet(target, self.allowed, self.resolver)
        except TargetError as exc:
            return Outcome(None, f"refused: {exc}", took())
        except TimeoutError:
            return Outcome(None, f"{target.host} did not resolve within {self.timeout:g}s", took())
        headers = {
            **outbound_signing.headers(msg_id, int(now), body, secrets),
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "host": host_header(target),
        }
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        request = self.http.build_request(
            "POST",
            pinned_url(target, address, url),
            content=body,
            headers=headers,
            extensions=extensions,
            timeout=self.timeout,
        )
        try:
            async with asyncio.timeout(self.timeout):
                answer = await self.http.send(request, stream=True, follow_redirects=False)
                try:
                    read = 0
                    async for chunk in answer.aiter_bytes():
                        read += len(chunk)
                        if read >= MAX_ANSWER:
                            break
                finally:
                    await answer.aclose()
        except TimeoutError:
            return Outcome(None, f"no answer within {self.timeout:g}s", took())
        except httpx.HTTPError as exc:
            error = _unnamed(f"{type(exc).__name__}: {exc}", target, address)
            return Outcome(None, error[:300], took())
        return Outcome(answer.status_code, None, took())
