"""Which URLs users' webhook endpoints may have: the guard against server-side request
forgery (a user making our servers call into our own network).

A target is refused when it is not ``https`` (``http`` only where an operator allows it),
carries credentials, or names or resolves to an address that is not globally routable:
private, loopback, link-local (cloud metadata at 169.254.169.254), carrier-grade NAT,
multicast, reserved, unspecified, or an IPv6 form of one of those (IPv4-mapped, 6to4,
NAT64's well-known prefix). Every address a name resolves to must pass, and the connection
is then made to a vetted address (no second lookup a rebinding DNS could answer
differently). Operators may allow networks explicitly (``allowed``), e.g. for an internal
receiver.

A refusal says why in words the user may see (the API's 422, the delivery log), so it
never tells what a *name* resolved to: naming the address, or even its kind (loopback,
private, link-local), would let anyone with an API key map our internal DNS one name at a
time. A name is refused with the one :data:`NAME_REFUSED`, whether it does not resolve or
resolves to an address we may not call; an address the user typed (an IP literal) may be
named, since it tells them nothing they did not write.

Pure: resolving is the caller's (an adapter); this decides on what it found.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
#: Longest endpoint URL we store.
MAX_URL = 2000
#: Why a host *name* may not be a target: the same words for every reason, and no address.
NAME_REFUSED = "the host does not resolve, or resolves to an address that is not publicly routable"


@dataclass(frozen=True, slots=True)
class Target:
    """A URL taken apart: where to connect."""

    scheme: str
    host: str
    port: int


class TargetError(ValueError):
    """The URL may not be an endpoint; the message says why."""


def parse_target(url: str, *, allow_http: bool = False) -> Target:
    """The parts of an endpoint URL, or TargetError."""
    if len(url) > MAX_URL or any(c.isspace() or ord(c) < 0x20 for c in url):
        raise TargetError(f"must be a URL of at most {MAX_URL} characters, without spaces")
    parts = urlsplit(url)
    schemes = ("https", "http") if allow_http else ("https",)
    if parts.scheme not in schemes:
        raise TargetError("must be an https URL" if not allow_http else "must be http(s)")
    if parts.username is not None or parts.password is not None:
        raise TargetError("must not carry credentials (use the signing secret)")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise TargetError("must name a host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise TargetError("has an invalid port") from exc
    return Target(parts.scheme, host, port)


def embedded(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64), else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def address_problem(address: IPAddress, allowed: Sequence[Network] = ()) -> str | None:
    """Why we may not connect to ``address`` (None: we may)."""
    if any(address in net for net in allowed):
        return None
    inner = embedded(address)
    if inner is not address and any(inner in net for net in allowed):
        return None
    for candidate in (address, inner):
        if candidate.is_loopback:
            return f"{address} is a loopback address"
        if candidate.is_link_local:
            return f"{address} is a link-local address"
        if candidate.is_private or not candidate.is_global:
            return f"{address} is not a public address"
        if candidate.is_multicast or candidate.is_reserved or candidate.is_unspecified:
            return f"{address} is not a unicast public address"
    return None


def resolved_problem(addresses: Iterable[IPAddress], allowed: Sequence[Network] = ()) -> str | None:
    """Why a host name that resolved to ``addresses`` may not be a target (None: every one
    passes): :data:`NAME_REFUSED`, naming none of them. No address at all is a problem too."""
    found = list(addresses)
    if not found or any(address_problem(a, allowed) for a in found):
        return NAME_REFUSED
    return None


def literal(host: str) -> IPAddress | None:
    """The address a host part spells, if it is an IP literal."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
