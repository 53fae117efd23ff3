"""The SES adapter (``shared.providers.ses.SesProvider``) against the sandbox's SES stand-in,
served by uvicorn on a random port: SigV4 checked for real, SES's answers and faults, and the
signed SNS notifications of the accepted mail."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest

from shared.core.errors import ProviderMisconfigured, ProviderSkipped, TransientProviderError
from shared.providers import ses_events
from shared.providers.ses import SesProvider
from tests.unit.providers.fakes import BATCH_ID
from tests.unit.providers.test_sandbox import FILES, PEOPLE, sample, served

EMAILS = {p.email for p in PEOPLE}


#: The sandbox's SES secret (``SAFEDELIVR_SANDBOX_SES_SECRET_ACCESS_KEY``'s default).
SECRET = "sandbox-ses-secret"


def provider(
    url: str,
    secret: str | None = None,
    *,
    key_id: str = "sandbox-ses-key-id",
    timeout: float = 5,
    **kwargs: object,
) -> SesProvider:
    return SesProvider(
        region="us-east-1",
        access_key_id=key_id,
        secret_access_key=secret or SECRET,
        base_url=f"{url}/ses",
        timeout=timeout,
        configuration_set="safedelivr",
        **kwargs,  # type: ignore[arg-type]
    )


@contextlib.asynccontextmanager
async def opened(ses: SesProvider) -> AsyncIterator[SesProvider]:
    """``ses``, closed on the way out whatever happened."""
    try:
        yield ses
    finally:
        await ses.aclose()


async def _fault(url: str, **fault: object) -> None:
    async with httpx.AsyncClient(base_url=url) as client:
        (
            await client.post("/_control/faults", json={"provider": "ses", **fault})
        ).raise_for_status()


async def _sends(url: str) -> dict[str, int]:
    async with httpx.AsyncClient(base_url=url) as client:
        found: dict[str, int] = (await client.get("/_control/sends")).json()["ses"]["by_recipient"]
    return found


async def test_personal_copies_are_accepted_recipient_by_recipient() -> None:
    async with served() as sandbox:
        async with opened(provider(sandbox.url)) as ses:
            receipt = await ses.send(sample(bulk=True))
        sends = await _sends(sandbox.url)

    assert receipt.recipients is not None
    assert {a.email: a.outcome for a in receipt.recipients} == dict.fromkeys(EMAILS, "accepted")
    assert all(a.message_id and a.code == 200 for a in receipt.recipients)
    assert len({a.message_id for a in receipt.recipients}) == 2  # one SendEmail each
    assert sends == dict.fromkeys(EMAILS, 1)


async def test_a_shared_chunk_is_one_call_answered_for_the_chunk() -> None:
    async with served() as sandbox:
        async with opened(provider(sandbox.url)) as ses:
            receipt = await ses.send(sample(bulk=False))
        sends = await _sends(sandbox.url)

    assert (receipt.provider, receipt.status, receipt.recipients) == ("ses", 200, None)
    assert receipt.message_id
    assert sends == {**dict.fromkeys(EMAILS, 1), "boss@example.com": 1}


async def test_throttling_is_a_clean_transient_refusal() -> None:
    async with served() as sandbox:
        await _fault(sandbox.url, status=429)
        async with opened(provider(sandbox.url)) as ses:
            with pytest.raises(TransientProviderError) as caught:
                await ses.send(sample(bulk=True))
        sends = await _sends(sandbox.url)

    assert (caught.value.status, caught.value.outcome_unknown) == (429, False)
    assert "TooManyRequests" in caught.value.message
    assert sends == {}


async def test_a_wrong_secret_is_refused_as_misconfiguration() -> None:
    async with served() as sandbox:
        async with opened(provider(sandbox.url, secret="not-the-secret")) as ses:
            with pytest.raises(ProviderMisconfigured) as caught:
                await ses.send(sample(bulk=False))
        sends = await _sends(sandbox.url)

    assert caught.value.status == 403
    assert "InvalidSignature" in caught.value.message
    assert sends == {}


async def test_an_unknown_key_id_is_refused_as_misconfiguration() -> None:
    async with served() as sandbox, opened(provider(sandbox.url, key_id="AKIDSTRANGER")) as ses:
        with pytest.raises(ProviderMisconfigured) as caught:
            await ses.send(sample(bulk=True))

    assert "UnrecognizedClient" in caught.value.message


async def test_a_5xx_after_accepting_leaves_the_outcome_unknown() -> None:
    async with served() as sandbox:
        await _fault(sandbox.url, status=500, accept=True)
        async with opened(provider(sandbox.url)) as ses:
            with pytest.raises(TransientProviderError) as caught:
                await ses.send(sample(bulk=True))
        sends = await _sends(sandbox.url)

    assert (caught.value.status, caught.value.outcome_unknown) == (500, True)
    assert sends == dict.fromkeys(EMAILS, 1)  # accepted indeed: only events can tell


async def test_no_answer_within_the_timeout_after_sending_leaves_the_outcome_unknown() -> None:
    async with served() as sandbox:
        await _fault(sandbox.url, latency_ms=1500, accept=True)
        async with opened(provider(sandbox.url, timeout=0.3)) as ses:
            with pytest.raises(TransientProviderError) as caught:
                await ses.send(sample(bulk=False))
        sends = await _sends(sandbox.url)

    assert caught.value.outcome_unknown
    assert set(sends) >= EMAILS  # it was accepted: only its events can tell


async def test_one_unknown_call_among_accepted_ones_is_answered_per_recipient() -> None:
    async with served() as sandbox:
        await _fault(sandbox.url, status=503, accept=True, count=1)
        async with opened(provider(sandbox.url, concurrency=1)) as ses:
            receipt = await ses.send(sample(bulk=True))

    assert receipt.recipients is not None
    assert sorted(a.outcome for a in receipt.recipients) == ["accepted", "unknown"]
    unknown = next(a for a in receipt.recipients if a.outcome == "unknown")
    assert unknown.code == 503


async def test_accepted_mail_is_reported_by_signed_sns_notifications() -> None:
    async with served() as sandbox:
        async with httpx.AsyncClient(base_url=sandbox.url) as client:
            pem = (await client.get("/_control/ses/certificate")).content
        async with opened(provider(sandbox.url)) as ses:
            await ses.send(sample(bulk=True).model_copy(update={"attempt": "c.2"}))
        await sandbox.posted()
        posts = [r for r in sandbox.receiver.received if r.path == "/webhooks/ses"]

    key = ses_events.signing_key(pem)
    assert key is not None
    kinds: dict[str, set[str]] = {}
    for post in posts:
        envelope = ses_events.parse_envelope(post.body)
        assert post.headers["x-amz-sns-message-type"] == "Notification"
        assert ses_events.verify_signature(envelope, key)
        assert ses_events.cert_url_allowed(envelope.signing_cert_url, envelope.topic_arn)
        for event in ses_events.parse_events(envelope).events:
            assert (event.batch_id, event.attempt) == (BATCH_ID, "c.2")
            kinds.setdefault(event.email, set()).add(event.kind)
    assert kinds == {email: {"sent", "delivered"} for email in EMAILS}


async def test_a_subscription_confirmation_names_the_sandboxs_subscribe_url() -> None:
    async with served() as sandbox, httpx.AsyncClient(base_url=sandbox.url) as client:
        answer = (await client.post("/_control/ses/subscribe")).json()
        (post,) = [r for r in sandbox.receiver.received if r.path == "/webhooks/ses"]
        envelope = ses_events.parse_envelope(post.body)
        assert envelope.subscribe_url is not None
        confirmed = await client.get(envelope.subscribe_url)

    assert answer == {"taken": True, "error": None, "confirmed": 0}
    assert envelope.type == "SubscriptionConfirmation"
    assert confirmed.status_code == 200
    assert b"SubscriptionArn" in confirmed.content


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "shared"])
async def test_a_chunks_files_reach_ses_by_name_and_size(bulk: bool) -> None:
    """Each file travels in ``Simple.Attachments`` as base64 (said so: SES's default 7bit
    would break it), an inline one with its Content-ID; SES records each one's size."""
    files = sample(bulk).message.model_copy(update={"attachments": FILES})
    async with served() as sandbox:
        async with opened(provider(sandbox.url)) as ses:
            await ses.send(sample(bulk).model_copy(update={"message": files}))
        async with httpx.AsyncClient(base_url=sandbox.url) as client:
            recent = (await client.get("/_control/sends")).json()["ses"]["recent"][-1]

    recorded = [
        (a["filename"], a["content_type"], a["disposition"], a["content_id"], a["size"])
        for a in recent["attachments"]
    ]
    assert recorded == [
        ('Zoë "final", v2.pdf', "application/pdf", "attachment", None, 9 + 256 * 40),
        ("logo.png", "image/png", "inline", "logo@example.com", 6),
    ]


async def test_each_personal_copy_takes_a_rate_limit_slot_and_one_refused_goes_on() -> None:
    """SES's sending rate counts messages: the gate is asked once per call, and the copy it
    skips is refused for now (handed on), while the others are sent."""
    asked: list[int] = []

    async def gate() -> None:
        asked.append(1)
        if len(asked) == 2:
            raise ProviderSkipped("ses", "at its rate limit: spilled over", retry_after=1.0)

    async with served() as sandbox:
        async with opened(provider(sandbox.url, concurrency=1)) as ses:
            receipt = await ses.send(sample(bulk=True), gate)
        sends = await _sends(sandbox.url)

    assert len(asked) == len(EMAILS)
    assert sorted(a.outcome for a in receipt.recipients or ()) == ["accepted", "refused_transient"]
    assert sum(sends.values()) == 1


async def test_every_copy_skipped_at_the_rate_limit_is_the_chunks_spill_over() -> None:
    async def gate() -> None:
        raise ProviderSkipped("ses", "at its rate limit: spilled over", retry_after=1.0)

    async with served() as sandbox:
        async with opened(provider(sandbox.url)) as ses:
            with pytest.raises(ProviderSkipped):
                await ses.send(sample(bulk=True), gate)
        assert await _sends(sandbox.url) == {}
