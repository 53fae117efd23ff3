"""Amazon SNS, as the SES receiver talks to it: the signing certificates that verify its
notifications (fetched over https and cached, or pinned in development), and the GET that
confirms a subscription.

Every address here has already passed ``shared.providers.ses_events.cert_url_allowed`` or
``subscribe_url_allowed`` (https, SNS's own host in the topic's region). The client follows
no redirect (a redirect could lead anywhere), waits at most :data:`TIMEOUT` seconds and reads
at most :data:`MAX_CERT_BYTES` of a certificate, so a hostile or broken answer costs little.
Certificates are kept :data:`CACHE_SECONDS` per URL (SNS signs with a handful), at most
:data:`CACHE_SIZE` of them.
"""

from __future__ import annotations

import logging
import time
from typing import Final

import httpx
from cryptography.hazmat.primitives.asymmetric import rsa

from shared.core.errors import ConfigError
from shared.infra.http import ApiError
from shared.providers import ses_events

log = logging.getLogger(__name__)

#: Seconds a fetch (of a certificate, of a confirmation) may take.
TIMEOUT: Final = 5.0
#: Largest certificate read (SNS's are about 2 KB).
MAX_CERT_BYTES: Final = 16 * 1024
#: Seconds a fetched certificate is kept.
CACHE_SECONDS: Final = 24 * 3600
#: Certificates kept at once.
CACHE_SIZE: Final = 16


class SnsCertificates:
    """The RSA keys that verify SNS notifications, by certificate URL."""

    def __init__(self, *, pinned: str | None = None, client: httpx.AsyncClient | None = None):
        """Args:
        pinned: a PEM certificate used for every URL instead of fetching (development:
            the sandbox's); refused in production.
        client: the HTTP client to fetch with (default: our own, made on first use).
        """
        self._pinned: rsa.RSAPublicKey | None = None
        if pinned:
            self._pinned = ses_events.signing_key(pinned.encode())
            if self._pinned is None:
                raise ConfigError("SAFEDELIVR_WEBHOOKS_SES_CERT_PEM: not a PEM RSA certificate")
        self._client = client
        self._owns_client = client is None
        self._cache: dict[str, tuple[float, rsa.RSAPublicKey]] = {}

    async def key(self, url: str) -> rsa.RSAPublicKey | None:
        """The key of the certificate at ``url`` (an allowed SNS address); None when what is
        there is no RSA certificate. Raises ApiError 503 when it cannot be fetched now (SNS
        retries the notification)."""
        if self._pinned is not None:
            return self._pinned
        now = time.monotonic()
        cached = self._cache.get(url)
        if cached is not None and cached[0] > now:
            return cached[1]
        pem = await self._fetch_certificate(url)
        key = ses_events.signing_key(pem)
        if key is not None:
            if len(self._cache) >= CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[url] = (now + CACHE_SECONDS, key)
        return key

    async def confirm(self, url: str) -> None:
        """GET ``url`` (an allowed ``ConfirmSubscription`` address); raises ApiError 503
        when SNS does not answer 200, so that SNS posts the confirmation again."""
        try:
            response = await self._http().get(url, timeout=TIMEOUT)
        except httpx.HTTPError as exc:
            raise ApiError(503, "sns_unavailable", f"could not confirm: {exc!r}") from exc
        if response.status_code != 200:
            raise ApiError(
                503, "sns_unavailable", f"SNS answered {response.status_code} to the confirmation"
            )

    async def aclose(self) -> None:
        if self._owns_client and self._client is not None:
            await self._client.aclose()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False)
        return self._client

    async def _fetch_certificate(self, url: str) -> bytes:
        try:
            async with self._http().stream("GET", url, timeout=TIMEOUT) as response:
                if response.status_code != 200:
                    raise ApiError(
                        503,
                        "sns_unavailable",
                        f"the signing certificate answered {response.status_code}",
                    )
                body = bytearray()
                async for part in response.aiter_bytes():
                    body += part
                    if len(body) > MAX_CERT_BYTES:
                        raise ApiError(401, "bad_signature", "the signing certificate is too large")
                return bytes(body)
        except httpx.HTTPError as exc:
            log.warning("could not fetch the SNS signing certificate %s: %r", url, exc)
            raise ApiError(
                503, "sns_unavailable", "could not fetch the SNS signing certificate"
            ) from exc
