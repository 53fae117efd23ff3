"""HTTP status classification and error messages shared by every provider."""

from __future__ import annotations

import pytest

from shared.core.errors import (
    PermanentProviderError,
    ProviderError,
    ProviderMisconfigured,
    TransientProviderError,
)
from shared.providers import responses

NOW = 1_700_000_000.0


def classify(status: int, body: bytes = b"", **headers: str) -> ProviderError | None:
    return responses.classify("sg", status, body, headers, now=NOW)


def classify_with(status: int, headers: dict[str, str]) -> ProviderError | None:
    return responses.classify("sg", status, b"", headers, now=NOW)


@pytest.mark.parametrize("status", [200, 202, 204])
def test_success_is_not_an_error(status: int) -> None:
    """Any 2xx means accepted."""
    assert classify(status) is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, PermanentProviderError),
        (413, PermanentProviderError),
        (422, PermanentProviderError),
        (401, ProviderMisconfigured),
        (402, ProviderMisconfigured),
        (403, ProviderMisconfigured),
        (404, ProviderMisconfigured),
        (405, ProviderMisconfigured),
        (415, ProviderMisconfigured),
        (408, TransientProviderError),
        (425, TransientProviderError),
        (429, TransientProviderError),
        (500, TransientProviderError),
        (502, TransientProviderError),
        (503, TransientProviderError),
        (504, TransientProviderError),
        (307, ProviderMisconfigured),
        (418, ProviderMisconfigured),
    ],
)
def test_status_table(status: int, kind: type[ProviderError]) -> None:
    """Each status maps to the error kind in the module's table, carrying the status."""
    error = classify(status)

    assert type(error) is kind
    assert error.status == status
    assert error.provider == "sg"


@pytest.mark.parametrize("status", [500, 501, 502, 503, 504, 599])
def test_every_5xx_leaves_the_outcome_unknown(status: int) -> None:
    """A 5xx comes after the whole request was written and does not prove it was not
    processed (Mailgun accepts and answers 504): transient, outcome unknown, status kept."""
    error = classify_with(status, {"retry-after": "9"})

    assert type(error) is TransientProviderError
    assert (error.outcome_unknown, error.status, error.retry_after) == (True, status, 9.0)


@pytest.mark.parametrize(
    "status", [400, 401, 402, 403, 404, 405, 408, 413, 415, 418, 422, 425, 429, 307]
)
def test_a_refusal_says_the_request_was_not_processed(status: int) -> None:
    """Every non-5xx error is a refusal the provider documents as "not processed": a clean
    failure that may move the chunk on at once."""
    error = classify(status)

    assert error is not None
    assert error.outcome_unknown is False


def test_permanent_error_is_not_retryable() -> None:
    """A 400 tells the failover logic that no provider will take the request."""
    error = classify(400)

    assert error is not None
    assert error.retryable is False


def test_sendgrid_error_list_becomes_the_message() -> None:
    """SendGrid's errors[] become 'field: message' pairs after the status."""
    body = (
        b'{"errors":[{"message":"Does not contain a valid address.",'
        b'"field":"personalizations.0.to.0.email","help":null},'
        b'{"message":"The subject is required.","field":null}]}'
    )

    error = classify(400, body)

    assert error is not None
    assert error.message == (
        "HTTP 400: personalizations.0.to.0.email: Does not contain a valid address.; "
        "The subject is required."
    )


def test_mailgun_message_becomes_the_message() -> None:
    """Mailgun's {"message": ...} is quoted after the status."""
    error = responses.classify("mg", 404, b'{"message":"Domain not found: x.org"}', {}, now=NOW)

    assert error is not None
    assert error.message == "HTTP 404: Domain not found: x.org"


def test_plain_text_body_is_kept_on_one_line() -> None:
    """A non-JSON body is quoted with its whitespace collapsed."""
    error = classify(502, b"<html>\n  Bad   gateway\n</html>")

    assert error is not None
    assert error.message == "HTTP 502: <html> Bad gateway </html>"


def test_empty_body_gives_the_status_alone() -> None:
    """Without a body the message is just the status."""
    error = classify(503)

    assert error is not None
    assert error.message == "HTTP 503"


def test_long_message_is_truncated() -> None:
    """Messages are cut to MAX_MESSAGE_CHARS with an ellipsis."""
    error = classify(400, b'{"message":"' + b"x" * 2000 + b'"}')

    assert error is not None
    assert len(error.message) == responses.MAX_MESSAGE_CHARS
    assert error.message.endswith("\u2026")


def test_redirect_names_its_target() -> None:
    """An unexpected redirect says where to, pointing at the base URL setting."""
    error = classify(308, location="https://api.sendgrid.com/v3/mail/send")

    assert error is not None
    assert "redirected to https://api.sendgrid.com/v3/mail/send" in error.message


def test_429_reads_retry_after_seconds() -> None:
    """Retry-After in seconds becomes retry_after."""
    error = classify_with(429, {"retry-after": "7"})

    assert error is not None
    assert error.retry_after == 7.0


def test_429_reads_ratelimit_reset_epoch() -> None:
    """SendGrid's X-RateLimit-Reset (Unix time) becomes seconds from now."""
    error = classify_with(429, {"x-ratelimit-reset": str(int(NOW) + 42)})

    assert error is not None
    assert error.retry_after == 42.0


def test_503_reads_retry_after_too() -> None:
    """Retry-After on a 5xx is honoured as on a 429."""
    error = classify_with(503, {"retry-after": "3"})

    assert error is not None
    assert error.retry_after == 3.0


def test_misconfigured_ignores_retry_after() -> None:
    """A 401 carries no retry_after even if the header is present."""
    error = classify_with(401, {"retry-after": "3"})

    assert error is not None
    assert error.retry_after is None


def test_retry_after_prefers_retry_after_header() -> None:
    """Retry-After wins over X-RateLimit-Reset."""
    headers = {"retry-after": "5", "x-ratelimit-reset": str(int(NOW) + 60)}

    assert responses.retry_after(headers, now=NOW) == 5.0


def test_retry_after_http_date() -> None:
    """An HTTP-date Retry-After becomes seconds from now."""
    headers = {"retry-after": "Tue, 14 Nov 2023 22:15:00 GMT"}  # NOW + 100 s

    assert responses.retry_after(headers, now=NOW) == 100.0


def test_retry_after_in_the_past_is_zero() -> None:
    """A reset time already passed means retry now, never a negative delay."""
    assert responses.retry_after({"x-ratelimit-reset": str(int(NOW) - 5)}, now=NOW) == 0.0


@pytest.mark.parametrize("value", ["soon", "nan", "inf", ""])
def test_unparseable_retry_after_is_ignored(value: str) -> None:
    """Garbage in Retry-After means no delay hint."""
    assert responses.retry_after({"retry-after": value}, now=NOW) is None


def test_lower_headers_keeps_first_value() -> None:
    """Header names are lower-cased; a repeated header keeps its first value."""
    headers = responses.lower_headers([("Retry-After", "1"), ("retry-after", "2")])

    assert headers == {"retry-after": "1"}


def test_retry_after_http_date_without_zone_is_gmt() -> None:
    """An HTTP-date with "-0000" (parsed without a zone) is read as GMT."""
    headers = {"retry-after": "Tue, 14 Nov 2023 22:15:00 -0000"}

    assert responses.retry_after(headers, now=NOW) == 100.0
