"""Opens and clicks made by machines, not readers: mailbox image proxies that fetch every
pixel (Gmail, Yahoo, Apple Mail Privacy Protection) and link scanners that follow every link
before delivery (Microsoft Safe Links, Proofpoint, Mimecast, Barracuda). They still count in
totals, marked as such, so a sender sees how many of the opens are real.

Pure: a request's user agent (and, for Apple, whether it came from Apple's network) in, the
name of the machine out (None: probably a person).
"""

from __future__ import annotations

import ipaddress
from typing import Final

#: Substrings of user agents and the machine each one names (checked in order).
_AGENTS: Final = (
    ("googleimageproxy", "Gmail image proxy"),
    ("yahoomailproxy", "Yahoo Mail image proxy"),
    ("ymailproxy", "Yahoo Mail image proxy"),
    ("bingpreview", "Microsoft link preview"),
    ("safelinks", "Microsoft Safe Links"),
    ("proofpoint", "Proofpoint URL Defense"),
    ("mimecast", "Mimecast URL Protect"),
    ("barracuda", "Barracuda link protection"),
    ("python-requests", "a script"),
    ("curl/", "a script"),
    ("go-http-client", "a script"),
)
#: Apple's own network: Mail Privacy Protection fetches from it with a generic user agent.
_APPLE: Final = ipaddress.ip_network("17.0.0.0/8")


def machine(user_agent: str | None, ip: str | None = None) -> str | None:
    """The machine behind an open or click, or None."""
    agent = (user_agent or "").lower()
    for needle, name in _AGENTS:
        if needle in agent:
            return name
    if ip:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            address = None
        if address is not None and address in _APPLE:
            return "Apple Mail Privacy Protection"
    if not agent:
        return "no user agent"
    return None
