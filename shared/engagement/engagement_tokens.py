"""The signed tokens in the URLs we put into mail: a tracked link, the open pixel and the
one-click unsubscribe link.

A token is ``<kid>.<payload>.<mac>``, all URL-safe base64 without padding: ``payload`` is
what the URL stands for (packed binary: purpose, batch id, log id, chunk, link index, the
scope's length, the scope, then a personal link's URL if any; about 80 characters in all,
because a message carries one per link and SendGrid caps each recipient's substitutions at
10 kB), ``mac`` an HMAC-SHA256 of ``kid.payload`` truncated to 16 bytes under the key
``kid`` names. Keys rotate: the first key of the ring signs, every key verifies, so mail
sent before a rotation keeps working while its key stays in the ring. A token that is
malformed, names an unknown key or fails its MAC reads as None: the endpoint answers 404 and
redirects nowhere.

A link token names the recipient and the link's place in the message as sent, never
the URL itself: the redirect goes to the URL stored with the message, so no token can make
us redirect anywhere else (no open redirect). The one exception is a personal link (one that
holds a substitution key, so it differs per recipient) to a host the operator allows: its
token carries the recipient's own URL, and the redirect goes there only while the host is
still allowed (:func:`redirect_target`).

Pure; the keys come from settings.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from shared.core.keyring import KeyRing

#: MAC bytes kept (128 bits: forging one is out of reach; URLs stay short).
MAC_BYTES: Final = 16
#: Longest token read (anything longer is not ours).
MAX_TOKEN: Final = 2048

Purpose = Literal["click", "open", "unsubscribe"]


@dataclass(frozen=True, slots=True)
class Claim:
    """What a token stands for."""

    purpose: Purpose
    batch_id: uuid.UUID
    log_id: uuid.UUID
    chunk: int = 0
    """The recipient's chunk (their row's place in the batch)."""
    link: int | None = None
    """Click tokens: the link's index among the message's links."""
    scope: str | None = None
    """Unsubscribe tokens: the list or campaign the address leaves (None: all the sender's
    mail)."""
    url: str | None = None
    """Click tokens of a personal link: the recipient's own URL (None: the stored link)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, kid: str, payload: str) -> str:
    digest = hmac.new(key, f"{kid}.{payload}".encode(), hashlib.sha256).digest()
    return _b64(digest[:MAC_BYTES])


#: purpose, batch id, log id, chunk, link index (NO_LINK: none), scope length; the scope and
#: the URL follow.
_LAYOUT: Final = struct.Struct(">c16s16sIHB")
NO_LINK: Final = 0xFFFF
#: Longest scope a token carries (bytes of UTF-8).
MAX_SCOPE: Final = 200


def sign(claim: Claim, ring: KeyRing) -> str:
    kid, key = ring.signing
    link = NO_LINK if claim.link is None else claim.link
    if not 0 <= link <= NO_LINK or not 0 <= claim.chunk < 2**32:
        raise ValueError("link index or chunk out of range")
    scope = (claim.scope or "").encode()
    if len(scope) > MAX_SCOPE:
        raise ValueError("scope too long")
    head = _LAYOUT.pack(
        claim.purpose[0].encode(),
        claim.batch_id.bytes,
        claim.log_id.bytes,
        claim.chunk,
        link,
        len(scope),
    )
    payload = _b64(head + scope + (claim.url or "").encode())
    return f"{kid}.{payload}.{_mac(key, kid, payload)}"


_PURPOSES: Mapping[bytes, Purpose] = {b"c": "click", b"o": "open", b"u": "unsubscribe"}


def read(token: str, ring: KeyRing) -> Claim | None:
    """The claim of an authentic token; None for anything else."""
    if len(token) > MAX_TOKEN or token.count(".") != 2:
        return None
    kid, payload, mac = token.split(".")
    key = ring.get(kid)
    if key is None or not hmac.compare_digest(_mac(key, kid, payload), mac):
        return None
    try:
        raw = _unb64(payload)
        purpose, batch, log_id, chunk, link, length = _LAYOUT.unpack_from(raw)
        scope = raw[_LAYOUT.size : _LAYOUT.size + length].decode()
        url = raw[_LAYOUT.size + length :].decode()
        return Claim(
            purpose=_PURPOSES[purpose],
            batch_id=uuid.UUID(bytes=batch),
            log_id=uuid.UUID(bytes=log_id),
            chunk=chunk,
            link=None if link == NO_LINK else link,
            scope=scope or None,
            url=url or None,
        )
    except (binascii.Error, struct.error, KeyError, UnicodeDecodeError, ValueError):
        return None  # signed by us, so only a bug could get here: still no redirect


def redirect_target(
    claim: Claim, links: Sequence[str], allowed_hosts: frozenset[str] = frozenset()
) -> str | None:
    """Where a click goes: the link the message was sent with, or a personal link's own URL
    on a host the operator allows; never anything else."""
    if claim.purpose != "click" or claim.link is None or claim.link >= len(links):
        return None
    if claim.url is None:
        return links[claim.link]
    return claim.url if host_of(claim.url) in allowed_hosts else None


def host_of(url: str) -> str | None:
    """The host of an absolute http(s) URL, lower case (None for anything else)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    return parts.hostname.lower()
