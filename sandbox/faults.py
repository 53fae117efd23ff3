"""Injected provider faults: what the next send calls to a provider answer instead of mail.

A fault names a provider, a status, a latency and how many calls it lasts (``None`` until
cleared). A fault without a status only delays the call, which is then handled normally.

With ``accept`` the provider first accepts the request as usual (it is recorded, indexed for
the query APIs and, unless ``webhooks`` is false, reported by webhooks) and only then
misbehaves: it waits ``latency_ms`` before answering (a client with a shorter timeout never
hears that its request was accepted), answers ``status`` instead of success, or with
``reset`` breaks the connection after the answer's headers. ``reset`` without ``accept``
breaks the connection having accepted nothing.

The SMTP relay (``smtp``) reads the same fields per transaction: see ``sandbox.relay``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, TypeGuard

import orjson

#: Providers whose send endpoints take faults.
PROVIDERS = ("sendgrid", "mailgun", "ses", "smtp")
#: Longest latency a fault may add (ms), so a typo cannot hang a test for hours.
MAX_LATENCY_MS = 600_000

_SENDGRID_MESSAGES = {
    400: "Bad Request",
    401: "authorization required",
    403: "access forbidden",
    404: "not found",
    413: "content too large",
    429: "too many requests",
    500: "An internal server error occurred.",
    502: "bad gateway",
    503: "service unavailable",
    504: "gateway timeout",
}
_MAILGUN_MESSAGES = {
    400: "Bad request",
    402: "Payment required",
    404: "Not found",
    413: "Request entity too large",
    429: "Too many requests",
    500: "Internal server error",
    502: "Bad gateway",
    503: "Service unavailable",
    504: "Gateway timeout",
}
#: SES v2's error names (``x-amzn-ErrorType``) and messages by status.
_SES_ERRORS = {
    400: ("BadRequestException", "Bad request"),
    403: ("AccessDeniedException", "User is not authorized to perform: ses:SendEmail"),
    404: ("NotFoundException", "Configuration set does not exist"),
    429: ("TooManyRequestsException", "Maximum sending rate exceeded."),
    500: ("InternalFailure", "The request processing has failed because of an unknown error"),
    503: ("ServiceUnavailable", "Service is unavailable"),
}


@dataclass(slots=True)
class Fault:
    """One injected fault; ``count`` is how many calls it still applies to."""

    provider: str
    status: int | None
    latency_ms: int = 0
    count: int | None = None
    body: Any = None
    """Answer body: a string is sent as text, anything else as JSON; None for the default."""
    retry_after: int = 1
    """Seconds announced by 429 answers (``X-RateLimit-Reset`` / ``Retry-After``)."""
    accept: bool = False
    """Accept the request first, then misbehave."""
    reset: bool = False
    """Break the connection instead of answering."""
    webhooks: bool = True
    """Whether mail accepted under this fault is reported by webhooks."""
    share: float = 1.0
    """The fraction of calls the fault applies to, spread evenly (0.3: 3 calls in 10)."""
    seen: int = 0
    """Calls to the provider since the fault was set."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def applies_to_next(self) -> bool:
        """Count one more call; whether the fault applies to it."""
        self.seen += 1
        return int(self.seen * self.share) > int((self.seen - 1) * self.share)


@dataclass(frozen=True, slots=True)
class FaultAnswer:
    """The HTTP answer a fault produces."""

    status: int
    body: bytes
    media_type: str
    headers: dict[str, str]


def parse_fault(payload: object) -> Fault | str:
    """The fault described by a ``POST /_control/faults`` body, or why it is invalid."""
    if not isinstance(payload, dict):
        return "the body must be a JSON object"
    provider = payload.get("provider")
    if provider not in PROVIDERS:
        return f"provider must be one of {list(PROVIDERS)}"
    status = payload.get("status")
    if status is not None and not (_is_int(status) and 200 <= status <= 599):
        return "status must be an HTTP status between 200 and 599, or null for latency only"
    latency = payload.get("latency_ms", 0)
    if not (_is_int(latency) and 0 <= latency <= MAX_LATENCY_MS):
        return f"latency_ms must be an integer between 0 and {MAX_LATENCY_MS}"
    count = payload.get("count")
    if count is not None and not (_is_int(count) and count >= 1):
        return "count must be a positive integer, or null for until cleared"
    retry_after = payload.get("retry_after", 1)
    if not (_is_int(retry_after) and retry_after >= 0):
        return "retry_after must be a non-negative integer"
    share = payload.get("share", 1.0)
    if not (isinstance(share, int | float) and not isinstance(share, bool) and 0 < share <= 1):
        return "share must be a number above 0 and at most 1"
    flags = {name: payload.get(name, default) for name, default in _FLAGS.items()}
    if not all(isinstance(v, bool) for v in flags.values()):
        return f"{', '.join(_FLAGS)} must be true or false"
    if provider == "smtp" and status is not None and status < 400:
        return "an smtp fault's status is an SMTP reply code between 400 and 599"
    if status is None and latency == 0 and not flags["reset"] and flags["webhooks"]:
        return "a fault needs a status, a latency, a reset or webhooks off"
    return Fault(
        str(provider), status, latency, count, payload.get("body"), retry_after, **flags,
        share=float(share),
    )  # fmt: skip


#: Boolean fault options and their defaults.
_FLAGS = {"accept": False, "reset": False, "webhooks": True}


def fault_answer(fault: Fault, *, now: float) -> FaultAnswer:
    """What the provider answers under ``fault`` (which must have a status)."""
    status = fault.status if fault.status is not None else 500
    headers = _rate_limit_headers(fault, status, now)
    if isinstance(fault.body, str):
        return FaultAnswer(status, fault.body.encode(), "text/plain", headers)
    if fault.body is not None:
        return FaultAnswer(status, orjson.dumps(fault.body), "application/json", headers)
    if fault.provider == "ses":
        kind, message = _SES_ERRORS.get(status, ("InternalFailure", "Error"))
        body = orjson.dumps({"message": message})
        return FaultAnswer(status, body, "application/json", {**headers, "x-amzn-ErrorType": kind})
    if fault.provider == "sendgrid":
        message = _SENDGRID_MESSAGES.get(status, "error")
        body = orjson.dumps({"errors": [{"field": None, "message": message, "help": None}]})
        return FaultAnswer(status, body, "application/json", headers)
    if status == 401:
        return FaultAnswer(status, b"Forbidden", "text/plain", headers)
    message = _MAILGUN_MESSAGES.get(status, "Error")
    return FaultAnswer(status, orjson.dumps({"message": message}), "application/json", headers)


class FaultBook:
    """The active fault of each provider."""

    def __init__(self) -> None:
        self._faults: dict[str, Fault] = {}

    def set(self, fault: Fault) -> None:
        """Make ``fault`` the provider's active fault, replacing any earlier one."""
        self._faults[fault.provider] = fault

    def take(self, provider: str) -> Fault | None:
        """The fault that applies to this call, counting the call against it."""
        fault = self._faults.get(provider)
        if fault is None or not fault.applies_to_next():
            return None
        if fault.count is not None:
            fault.count -= 1
            if fault.count <= 0:
                del self._faults[provider]
        return fault

    def clear(self, provider: str | None = None) -> int:
        """Remove the faults of ``provider`` (every provider when None); return how many."""
        if provider is None:
            cleared = len(self._faults)
            self._faults.clear()
            return cleared
        return 1 if self._faults.pop(provider, None) is not None else 0

    def active(self) -> list[Fault]:
        return list(self._faults.values())


def _rate_limit_headers(fault: Fault, status: int, now: float) -> dict[str, str]:
    if status != 429:
        return {}
    if fault.provider == "ses":
        return {}  # SES's 429 says nothing of when to try again
    if fault.provider == "sendgrid":
        return {
            "X-RateLimit-Limit": "600",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": str(int(now) + fault.retry_after),
        }
    return {"Retry-After": str(fault.retry_after)}


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
