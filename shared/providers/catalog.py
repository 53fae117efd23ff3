"""Every provider we can send through, declared once: its code (in routing keys, settings and
errors), its name, and what one request to it may carry. The settings, the topology, chunk
sizing, the adapters, the webhook intake and the dashboard all read it here (pure data; no
adapter is imported)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProviderInfo:
    code: str
    name: str
    max_recipients: int
    """Recipients (to + cc + bcc) one request may carry."""


CATALOG: dict[str, ProviderInfo] = {
    "sg": ProviderInfo("sg", "SendGrid", 1000),
    "mg": ProviderInfo("mg", "Mailgun", 1000),
}

#: Every provider code, in the default failover order.
CODES: tuple[str, ...] = tuple(CATALOG)


def name_of(code: str) -> str:
    """A provider's name, or the code itself for one we do not know (old rows)."""
    info = CATALOG.get(code)
    return info.name if info else code
