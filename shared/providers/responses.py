"""How a provider's HTTP answer becomes one of our errors, the same way for every provider.

==================  ========================  ==============================================
status              error                     why
==================  ========================  ==============================================
2xx                 none: accepted
400, 413, 422       PermanentProviderError    our payload is wrong; other providers refuse it too
401, 402, 403,      ProviderMisconfigured     key, plan, sending domain or base URL is wrong;
404, 405, 415                                 the next provider may work
408, 425, 429       TransientProviderError    busy: nothing was processed; ``retry_after``
                                              from ``Retry-After`` or ``X-RateLimit-Reset``
5xx                 TransientProviderError    unhealthy, and ``outcome_unknown``: the whole
                    (``outcome_unknown``)     request was written, and a 5xx does not prove
                                              it was not processed (Mailgun accepts and
                                              answers 504), so evidence decides a re-send
anything else       ProviderMisconfigured     unexpected (a redirect, an odd 4xx): the
                                              endpoint we talk to is suspect
==================  ========================  ==============================================

Every answer below 500 that is not a success is a refusal (the providers document their 4xx
as "not processed"; a redirect is never followed): the chunk moves on at once. A 5xx leaves
the attempt ambiguous (``services.consumers.resolution``): its recipients move on only once
the provider's webhooks or query API show it did not accept them.

Error messages quote what the provider said (SendGrid's ``errors[].field/message``, Mailgun's
``message``), cut to :data:`MAX_MESSAGE_CHARS`, because they end up in the reason users see.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Iterable, Mapping
from datetime import UTC

import orjson

from shared.core.errors import (
    PermanentProviderError,
    ProviderError,
    ProviderMisconfigured,
    TransientProviderError,
)

#: Longest provider message we keep in an error.
MAX_MESSAGE_CHARS = 500

_PERMANENT = frozenset({400, 413, 422})
_MISCONFIGURED = frozenset({401, 402, 403, 404, 405, 415})
_TRANSIENT = frozenset({408, 425, 429})


def classify(
    provider: str,
    status: int,
    body: bytes,
    headers: Mapping[str, str],
    *,
    now: float,
) -> ProviderError | None:
    """The error a response means, or ``None`` if the provider accepted the request.

    Args:
        provider: our provider code, carried by the error.
        status: the HTTP status.
        body: the raw response body.
        headers: response headers with lower-case names (see :func:`lower_headers`).
        now: the current Unix time, to turn ``X-RateLimit-Reset`` into a delay.
    """
    if 200 <= status < 300:
        return None
    message = describe(status, body)
    if status in _PERMANENT:
        return PermanentProviderError(provider, message, status=status)
    if status in _TRANSIENT or status >= 500:
        delay = retry_after(headers, now=now)
        return TransientProviderError(
            provider, message, status=status, retry_after=delay, outcome_unknown=status >= 500
        )
    if status in _MISCONFIGURED:
        return ProviderMisconfigured(provider, message, status=status)
    location = headers.get("location")
    if location:
        message = truncate(f"{message} (redirected to {location}; check the base URL)")
    return ProviderMisconfigured(provider, message, status=status)


def describe(status: int, body: bytes) -> str:
    """``HTTP <status>: <what the provider said>``, at most MAX_MESSAGE_CHARS long."""
    said = _provider_said(body)
    return truncate(f"HTTP {status}: {said}" if said else f"HTTP {status}")


def retry_after(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds the provider asked us to wait, from ``Retry-After`` or ``X-RateLimit-Reset``.

    ``Retry-After`` is delay-seconds or an HTTP date (RFC 9110 section 10.2.3); SendGrid's
    ``X-RateLimit-Reset`` is the Unix time the window resets. Unparseable values are ignored.
    """
    value = headers.get("retry-after", "").strip()
    if value:
        seconds = _float(value)
        if seconds is None:
            seconds = _http_date_delay(value, now)
        if seconds is not None:
            return seconds
    reset = _float(headers.get("x-ratelimit-reset", "").strip())
    return None if reset is None else max(0.0, reset - now)


def lower_headers(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Response headers as a dict with lower-case names (the first value of a repeated one)."""
    headers: dict[str, str] = {}
    for name, value in items:
        headers.setdefault(name.lower(), value)
    return headers


def truncate(text: str) -> str:
    """Cut ``text`` to MAX_MESSAGE_CHARS, marking the cut."""
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return text[: MAX_MESSAGE_CHARS - 1] + "\u2026"


def _provider_said(body: bytes) -> str:
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        errors = data.get("errors")
        if isinstance(errors, list) and errors:
            return "; ".join(_one_error(e) for e in errors)
        if isinstance(data.get("message"), str):
            return str(data["message"])
    # Not JSON (a proxy's HTML page, Mailgun's plain "Forbidden"): keep the text, on one line.
    return " ".join(body[: MAX_MESSAGE_CHARS * 4].decode("utf-8", "replace").split())


def _one_error(error: object) -> str:
    if not isinstance(error, dict):
        return str(error)
    message = str(error.get("message") or "")
    field = error.get("field")
    return f"{field}: {message}" if field else message


def _float(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return max(0.0, number) if math.isfinite(number) else None


def _http_date_delay(value: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        # RFC 9110 dates are always GMT; "-0000" parses naive.
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)
