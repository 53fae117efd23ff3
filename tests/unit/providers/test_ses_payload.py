"""Amazon SES's requests (``shared.providers.ses``): the ``SendEmail`` calls a chunk becomes
(one shared, or one per personal copy), their SigV4 signature, and what SES's answers mean."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shared.core.errors import PermanentProviderError, ProviderMisconfigured, TransientProviderError
from shared.core.models import Address
from shared.providers.ses import build_calls, classify, error_type, message_id, signed_headers
from tests.unit.providers.fakes import BATCH_ID, chunk, recipient

URL = "https://email.eu-west-1.amazonaws.com/v2/email/outbound-emails"

PEOPLE = [
    recipient("ann@example.org", "Ann", {"-first-": "Ann", "-team-": "red"}),
    recipient("Bob@Example.org", "Doe, Bob", {"-first-": "Bob", "-team-": "red"}),
]


def _body(call: Any) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(call.body)
    return body


def test_a_shared_chunk_is_one_call_to_every_recipient_with_shared_substitutions() -> None:
    sample = chunk(PEOPLE, subject="Hi -first- of -team-", text="T -team-", html="<p>-team-</p>",
                   cc=[Address(email="boss@example.com", name="Boss")])  # fmt: skip
    (call,) = build_calls(sample, "safedelivr")
    body = _body(call)

    assert call.recipients == ("ann@example.org", "bob@example.org")
    assert body["Destination"] == {
        "ToAddresses": ["Ann <ann@example.org>", '"Doe, Bob" <Bob@Example.org>'],
        "CcAddresses": ["Boss <boss@example.com>"],
    }
    simple = body["Content"]["Simple"]
    assert simple["Subject"] == {"Data": "Hi -first- of red", "Charset": "UTF-8"}
    assert simple["Body"]["Text"]["Data"] == "T red"
    assert simple["Body"]["Html"]["Data"] == "<p>red</p>"
    assert body["ConfigurationSetName"] == "safedelivr"


def test_a_bulk_chunk_is_one_call_per_recipient_with_its_own_values_and_headers() -> None:
    own = recipient("ann@example.org", "Ann", {"-first-": "Ann"}).model_copy(
        update={"headers": {"List-Unsubscribe": "<https://t.example/u/abc>"}}
    )
    sample = chunk([own, PEOPLE[1]], bulk=True, subject="Hi -first-", headers={"X-Campaign": "s"})
    calls = build_calls(sample)

    assert [c.recipients for c in calls] == [("ann@example.org",), ("bob@example.org",)]
    first, second = (_body(c) for c in calls)
    assert first["Content"]["Simple"]["Subject"]["Data"] == "Hi Ann"
    assert second["Content"]["Simple"]["Subject"]["Data"] == "Hi Bob"
    assert first["Content"]["Simple"]["Headers"] == [
        {"Name": "X-Campaign", "Value": "s"},
        {"Name": "List-Unsubscribe", "Value": "<https://t.example/u/abc>"},
    ]
    assert second["Content"]["Simple"]["Headers"] == [{"Name": "X-Campaign", "Value": "s"}]
    assert {"Name": "log_id", "Value": str(own.log_id)} in first["EmailTags"]


def test_tags_carry_our_ids_in_the_characters_ses_allows() -> None:
    sample = chunk(PEOPLE, index=4, categories=["spring sale!", "news"]).model_copy(
        update={"attempt": "r.12"}
    )
    tags = {(t["Name"], t["Value"]) for t in _body(build_calls(sample)[0])["EmailTags"]}

    assert {("batch_id", str(BATCH_ID)), ("chunk", "4"), ("sd_attempt", "r-12")} <= tags
    assert {("category", "spring_sale_"), ("category", "news")} <= tags
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,256}", v) for _, v in tags)


def test_a_name_that_is_not_ascii_is_mime_encoded() -> None:
    sample = chunk([recipient("zoe@example.org", "Zoë")])
    (to,) = _body(build_calls(sample)[0])["Destination"]["ToAddresses"]
    assert to == "=?utf-8?q?Zo=C3=AB?= <zoe@example.org>"


def test_a_chunk_over_fifty_recipients_is_refused_before_any_call() -> None:
    many = [recipient(f"r{i}@example.org") for i in range(51)]
    with pytest.raises(PermanentProviderError):
        build_calls(chunk(many))


def test_the_signature_is_sigv4_for_ses_over_the_exact_body() -> None:
    body = b'{"FromEmailAddress": "a@example.org"}'
    headers = signed_headers(URL, body, region="eu-west-1", access_key_id="AKIDEXAMPLE",
                             secret_access_key="secret")  # fmt: skip

    authorization = headers["Authorization"]
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/ses/aws4_request" in authorization
    assert _recomputed(URL, body, headers, "secret") == authorization.rsplit("Signature=", 1)[1]
    assert _recomputed(URL, body + b" ", headers, "secret") != authorization.rsplit("=", 1)[1]


def _recomputed(url: str, body: bytes, headers: dict[str, str], secret: str) -> str:
    """The signature SES computes from what it received (botocore, with the request's date)."""
    request = AWSRequest(method="POST", url=url, data=body, headers=dict(headers))
    del request.headers["Authorization"]
    request.context["timestamp"] = headers["X-Amz-Date"]
    auth = SigV4Auth(Credentials("AKIDEXAMPLE", secret), "ses", "eu-west-1")
    return auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)


@pytest.mark.parametrize(
    ("status", "kind", "error"),
    [
        (429, "TooManyRequestsException", TransientProviderError),
        (400, "LimitExceededException", TransientProviderError),
        (400, "AccountSuspendedException", ProviderMisconfigured),
        (400, "SendingPausedException", ProviderMisconfigured),
        (400, "MailFromDomainNotVerifiedException", ProviderMisconfigured),
        (403, "SignatureDoesNotMatch", ProviderMisconfigured),
        (404, "NotFoundException", ProviderMisconfigured),
        (400, "MessageRejected", PermanentProviderError),
        (400, "BadRequestException", PermanentProviderError),
        (500, "InternalFailure", TransientProviderError),
    ],
)
def test_an_ses_error_is_judged_by_its_name(status: int, kind: str, error: type) -> None:
    headers = {"x-amzn-errortype": f"{kind}:http://internal.amazon.com/coral/"}
    found = classify(status, b'{"message": "no"}', headers, now=0.0)
    assert type(found) is error
    assert found is not None and kind in str(found)


def test_a_5xx_leaves_the_outcome_unknown_and_a_throttle_does_not() -> None:
    server = classify(503, b"", {}, now=0.0)
    throttled = classify(429, b'{"__type": "TooManyRequestsException"}', {}, now=0.0)
    assert isinstance(server, TransientProviderError) and server.outcome_unknown
    assert isinstance(throttled, TransientProviderError) and not throttled.outcome_unknown


def test_the_error_name_comes_from_the_body_when_the_header_is_absent() -> None:
    assert error_type(b'{"__type": "com.amazon#MessageRejected"}', {}) == "MessageRejected"
    assert error_type(b"<html>", {}) is None


def test_an_accepted_call_answers_its_message_id() -> None:
    assert classify(200, b'{"MessageId": "0100-abc"}', {}, now=0.0) is None
    assert message_id(b'{"MessageId": "0100-abc"}') == "0100-abc"
    assert message_id(b"{}") is None
