"""The configured provider chain: which adapters exist, built in failover order, and closed.

Adding a provider is one adapter module plus one line in :data:`FACTORIES` (and its code in
``shared.infra.config``'s list of known codes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from shared.core.errors import ConfigError
from shared.infra.config import ProviderSettings
from shared.infra.gil import CpuLane
from shared.providers.base import Provider
from shared.providers.mailgun import MailgunProvider
from shared.providers.sendgrid import SendGridProvider
from shared.providers.ses import SesProvider
from shared.providers.smtp import SmtpProvider

#: How to build each provider from the settings, by code.
FACTORIES: Mapping[str, Callable[[ProviderSettings, CpuLane | None], Provider]] = {
    SendGridProvider.code: SendGridProvider.from_settings,
    MailgunProvider.code: MailgunProvider.from_settings,
    SmtpProvider.code: SmtpProvider.from_settings,
    SesProvider.code: SesProvider.from_settings,
}


def build_providers(settings: ProviderSettings, cpu: CpuLane | None = None) -> dict[str, Provider]:
    """One provider per code in ``settings.chain_codes``, keyed by code, in that order,
    building their payloads on ``cpu`` (the process's CPU lane; default: one each)."""
    providers: dict[str, Provider] = {}
    for code in settings.chain_codes:
        factory = FACTORIES.get(code)
        if factory is None:
            raise ConfigError(
                f"SAFEDELIVR_PROVIDERS_CHAIN: unknown provider code {code!r}; "
                f"known: {sorted(FACTORIES)}"
            )
        providers[code] = factory(settings, cpu)
    return providers


async def close_all(providers: Mapping[str, Provider]) -> None:
    """Close every provider, even if some fail; then raise the first failure, if any."""
    results = await asyncio.gather(
        *(provider.aclose() for provider in providers.values()), return_exceptions=True
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result
