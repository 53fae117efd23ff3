"""What each httpx failure of a provider call means: clean (nothing can have been accepted)
or unknown (the request was sent), or a misconfigured base URL."""

from __future__ import annotations

import httpx
import pytest

from shared.core.errors import ProviderMisconfigured, TransientProviderError
from shared.providers.transport import translate


@pytest.mark.parametrize(
    ("exc", "unknown"),
    [
        (httpx.ConnectError("refused"), False),
        (httpx.ConnectTimeout("slow"), False),
        (httpx.PoolTimeout("busy"), False),
        (httpx.WriteError("reset"), False),
        (httpx.WriteTimeout("stuck"), False),
        (httpx.ReadTimeout("silent"), True),
        (httpx.ReadError("reset"), True),
        (httpx.RemoteProtocolError("truncated"), True),
    ],
)
def test_only_failures_after_the_request_was_sent_leave_the_outcome_unknown(
    exc: Exception, unknown: bool
) -> None:
    error = translate("sg", "SendGrid", exc, 30)
    assert isinstance(error, TransientProviderError)
    assert error.outcome_unknown is unknown
    assert error.provider == "sg"


@pytest.mark.parametrize("exc", [httpx.UnsupportedProtocol("ftp"), httpx.InvalidURL("bad")])
def test_an_unusable_base_url_is_misconfiguration(exc: Exception) -> None:
    error = translate("mg", "Mailgun", exc, 30)
    assert isinstance(error, ProviderMisconfigured)
    assert "Mailgun base URL" in error.message


def test_a_read_timeout_names_the_timeout() -> None:
    assert "within 2.5s" in translate("sg", "SendGrid", httpx.ReadTimeout("x"), 2.5).message
