"""Amazon SES (API v2) as the sandbox imitates it: ``POST /ses/v2/email/outbound-emails``
(``SendEmail``) with its SigV4 check, its request rules and answers, and the SES event records
(``Send``, ``Delivery``, ``Bounce``...) of accepted mail, as SES publishes them to SNS.

* Signature: the ``Authorization`` header's SigV4 signature is computed again with botocore
  from the sandbox's access key and secret, over the headers it names and the body as
  received. A missing one, an unknown key id, a wrong signature or a ``X-Amz-Date`` more than
  5 minutes off get SES's 403 (``MissingAuthenticationTokenException``,
  ``UnrecognizedClientException``, ``InvalidSignatureException``).
* Answers: 200 ``{"MessageId": ...}``; errors as SES v2 writes them: the name in
  ``x-amzn-ErrorType`` and ``{"message": ...}`` (``BadRequestException`` 400 for a request
  SES would refuse, ``NotFoundException`` 404 for a configuration set named ``unknown…``).
* Events (:func:`event_records`): one ``Send`` record per message (``mail.destination`` is
  every recipient), then each recipient's records by its sandbox fate
  (``sandbox.events.outcome_at``), ``mail.tags`` built from the request's ``EmailTags`` as
  SES does. The dispatcher wraps each in a signed SNS ``Notification``
  (``sandbox.webhooks``).
* ``GET /?Action=ConfirmSubscription&TopicArn=…&Token=…`` (at the sandbox's root, as at SNS's
  endpoint): the stand-in for SNS's confirmation address (``POST /_control/ses/subscribe``
  posts a ``SubscriptionConfirmation`` naming it); confirmations are counted. And
  ``GET /SimpleNotificationService-<serial>.pem``: the certificate that verifies the
  notifications, where SNS keeps its own.
"""

from __future__ import annotations

import hmac
import re
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parseaddr
from typing import Any, Final

import orjson
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sandbox import signing
from sandbox.endpoints import fault_after, fault_before
from sandbox.sendgrid import is_valid_address
from sandbox.ses_feed import accepted
from sandbox.state import state_of
from sandbox.webhooks import SesJob
from sandbox.wire import json_response, read_body

#: SES's largest message (40 MB, raw).
MAX_BODY_BYTES: Final = 40 * 1024 * 1024
#: Recipients (to + cc + bcc) of one ``SendEmail``.
MAX_RECIPIENTS: Final = 50
#: Seconds a request's ``X-Amz-Date`` may be off.
CLOCK_SKEW: Final = 300

_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[a-z0-9-]+)/"
    r"(?P<service>[a-z0-9-]+)/aws4_request, ?SignedHeaders=(?P<headers>[a-z0-9;-]+), ?"
    r"Signature=(?P<signature>[0-9a-f]{64})"
)
_TAG = re.compile(r"[A-Za-z0-9_-]{1,256}")
_BAD_SIGNATURE = (
    "The request signature we calculated does not match the signature you provided. Check "
    "your AWS Secret Access Key and signing method. Consult the service documentation for "
    "details."
)


def routes() -> list[BaseRoute]:
    """Routes mounted at ``/ses`` (SES's API root)."""
    return [Route("/v2/email/outbound-emails", send_email, methods=["POST"])]


def sns_routes() -> list[BaseRoute]:
    """Routes at the sandbox's root, where SNS has them: its ``ConfirmSubscription`` action
    and its signing certificate (a client that sends SNS's host here reaches them)."""
    return [
        Route("/", confirm_subscription, methods=["GET"]),
        Route("/SimpleNotificationService-{serial}.pem", certificate, methods=["GET"]),
    ]


def control_routes() -> list[BaseRoute]:
    """Routes mounted at ``/_control`` for SES."""
    return [
        Route("/ses/certificate", certificate, methods=["GET"]),
        Route("/ses/subscribe", subscribe, methods=["POST"]),
    ]


async def certificate(request: Request) -> Response:
    """``GET /_control/ses/certificate``: the PEM certificate that verifies the SNS
    notifications (for ``SAFEDELIVR_WEBHOOKS_SES_CERT_PEM``)."""
    key = state_of(request).dispatcher.ses_key
    return Response(signing.sns_certificate(key).encode(), media_type="application/x-pem-file")


async def subscribe(request: Request) -> Response:
    """``POST /_control/ses/subscribe``: post a signed ``SubscriptionConfirmation`` to the
    webhook service, its ``SubscribeURL`` this sandbox's root; answers whether it
    was taken and how many subscriptions were confirmed since the sandbox started."""
    dispatcher = state_of(request).dispatcher
    base = str(request.base_url).rstrip("/")
    taken, problem = await dispatcher.confirm_subscription(f"{base}/")
    return json_response(
        {"taken": taken, "error": problem, "confirmed": dispatcher.ses_confirmations}
    )


def files(payload: Mapping[str, Any]) -> list[dict[str, object]]:
    """The name, type, disposition, Content-ID and decoded size of each file of a request
    (``Content.Simple.Attachments``; never its bytes), as the ledger keeps them for every
    provider."""
    simple = (payload.get("Content") or {}).get("Simple") or {}
    found: list[dict[str, object]] = []
    for item in simple.get("Attachments") or ():
        content = str(item.get("RawContent") or "")
        found.append(
            {
                "filename": item.get("FileName"),
                "content_type": item.get("ContentType"),
                "disposition": str(item.get("ContentDisposition") or "ATTACHMENT").lower(),
                "content_id": item.get("ContentId"),
                "size": len(content) // 4 * 3 - content[-2:].count("="),
            }
        )
    return found


def error(status: int, kind: str, message: str) -> Response:
    """SES v2's error answer: the name in ``x-amzn-ErrorType``, the message in the body."""
    return json_response({"message": message}, status, headers={"x-amzn-ErrorType": kind})


async def send_email(request: Request) -> Response:
    """``POST /v2/email/outbound-emails``: 200 with the ``MessageId``, or SES's error."""
    state = state_of(request)
    fault = state.faults.take("ses")
    faulted = await fault_before(fault)
    if faulted is not None:
        return faulted
    raw = await read_body(request, MAX_BODY_BYTES)
    if raw is None:
        return error(400, "BadRequestException", "Message length is more than 40 MB")
    settings = state.settings
    problem = signature_problem(
        request.scope,
        request.headers,
        raw,
        key_id=settings.ses_access_key_id,
        secret=settings.ses_secret_access_key.get_secret_value(),
        now=time.time(),
    )
    if problem is not None:
        return error(403, *problem)
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return error(400, "BadRequestException", "The request body is not valid JSON")
    judged = judge(payload)
    if isinstance(judged, Response):
        return judged
    message = accepted(payload, judged, time.time())
    state.ledger.record(
        "ses",
        message.recipients,
        message_id=message.message_id,
        size=len(raw),
        request=payload,
        attachments=files(payload),
    )
    if fault is None or fault.webhooks:
        state.dispatcher.submit(SesJob(message))
    answer = json_response(
        {"MessageId": message.message_id}, headers={"x-amzn-RequestId": str(uuid.uuid4())}
    )
    return await fault_after(fault, answer)


async def confirm_subscription(request: Request) -> Response:
    """``GET /?Action=ConfirmSubscription&TopicArn=&Token=``: SNS's confirmation."""
    state = state_of(request)
    params = request.query_params
    if params.get("Action") != "ConfirmSubscription" or not params.get("Token"):
        return Response(b"<ErrorResponse>InvalidParameter</ErrorResponse>", 400)
    state.dispatcher.ses_confirmations += 1
    arn = f"{params.get('TopicArn', '')}:{uuid.uuid4()}"
    body = (
        "<ConfirmSubscriptionResponse><ConfirmSubscriptionResult><SubscriptionArn>"
        f"{arn}</SubscriptionArn></ConfirmSubscriptionResult></ConfirmSubscriptionResponse>"
    )
    return Response(body.encode(), 200, media_type="text/xml")


def signature_problem(
    scope: Mapping[str, Any],
    headers: Mapping[str, str],
    body: bytes,
    *,
    key_id: str,
    secret: str,
    now: float,
) -> tuple[str, str] | None:
    """SES's ``(error name, message)`` for a request whose SigV4 signature is not ours;
    None when it is (recomputed with botocore over the signed headers and ``body``)."""
    found = _AUTHORIZATION.fullmatch(headers.get("authorization", "").strip())
    stamp = headers.get("x-amz-date", "")
    if found is None or not stamp:
        return "MissingAuthenticationTokenException", "Missing Authentication Token"
    if not hmac.compare_digest(found["key"].encode(), key_id.encode()):
        return (
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    try:
        signed_at = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return "IncompleteSignatureException", "X-Amz-Date is not a valid date"
    if abs(now - signed_at) > CLOCK_SKEW or found["date"] != stamp[:8] or found["service"] != "ses":
        return "InvalidSignatureException", f"Signature expired or out of scope: {stamp}"
    names = found["headers"].split(";")
    if "host" not in names or any(name not in headers for name in names):
        return "InvalidSignatureException", _BAD_SIGNATURE
    raw_path = scope.get("raw_path") or scope.get("path", "").encode()
    query = scope.get("query_string", b"")
    url = f"http://{headers['host']}{raw_path.decode('latin-1')}"
    if query:
        url = f"{url}?{query.decode('latin-1')}"
    request = AWSRequest(
        method=str(scope.get("method", "POST")),
        url=url,
        data=body,
        headers={name: headers[name] for name in names},
    )
    request.context["timestamp"] = stamp
    signer = SigV4Auth(Credentials(key_id, secret), found["service"], found["region"])
    expected = signer.signature(
        signer.string_to_sign(request, signer.canonical_request(request)), request
    )
    if not hmac.compare_digest(expected.encode(), found["signature"].encode()):
        return "InvalidSignatureException", _BAD_SIGNATURE
    return None


def judge(payload: object) -> list[str] | Response:
    """The recipients (lower case, distinct) of a ``SendEmail`` SES would take, or its
    error answer."""
    if not isinstance(payload, dict):
        return error(400, "BadRequestException", "The request body must be a JSON object")
    source = payload.get("FromEmailAddress")
    if not isinstance(source, str) or not is_valid_address(parseaddr(source)[1]):
        return error(400, "BadRequestException", "FromEmailAddress is not a valid address")
    recipients = _destination(payload.get("Destination"))
    if isinstance(recipients, str):
        return error(400, "BadRequestException", recipients)
    problem = _content_problem(payload.get("Content")) or _tags_problem(payload.get("EmailTags"))
    if problem:
        return error(400, "BadRequestException", problem)
    configuration_set = payload.get("ConfigurationSetName")
    if isinstance(configuration_set, str) and configuration_set.startswith("unknown"):
        return error(
            404, "NotFoundException", f"Configuration set <{configuration_set}> does not exist."
        )
    return list(dict.fromkeys(recipients))


def _destination(destination: object) -> list[str] | str:
    """Every recipient of ``Destination`` (lower case), or what is wrong with it."""
    if not isinstance(destination, dict):
        return "Destination is required"
    recipients: list[str] = []
    for field in ("ToAddresses", "CcAddresses", "BccAddresses"):
        values = destination.get(field) or []
        if not isinstance(values, list):
            return f"Destination.{field} must be a list"
        for value in values:
            address = parseaddr(value)[1] if isinstance(value, str) else ""
            if not is_valid_address(address):
                return f"Illegal address in {field}"
            recipients.append(address.lower())
    if not recipients:
        return "Destination names no recipient"
    if len(recipients) > MAX_RECIPIENTS:
        return f"Recipient count exceeds {MAX_RECIPIENTS}."
    return recipients


def _content_problem(content: object) -> str | None:
    simple = content.get("Simple") if isinstance(content, dict) else None
    if not isinstance(simple, dict) or not isinstance(simple.get("Subject"), dict):
        return "Content.Simple.Subject is required"
    body = simple.get("Body")
    if not isinstance(body, dict) or not any(
        isinstance(body.get(k), dict) for k in ("Text", "Html")
    ):
        return "Content.Simple.Body needs Text or Html"
    return None


def _tags_problem(tags: object) -> str | None:
    if not isinstance(tags, list | None):
        return "EmailTags must be a list"
    for tag in tags or []:
        if not (
            isinstance(tag, dict)
            and _TAG.fullmatch(str(tag.get("Name", "")))
            and _TAG.fullmatch(str(tag.get("Value", "")))
        ):
            return "Tag names and values may hold only [A-Za-z0-9_-]"
    return None
