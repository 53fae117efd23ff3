"""The SMTP relay adapter (``shared.providers.smtp``): its reading of SMTP replies (pure),
and its transactions against the sandbox's real relay (``sandbox.relay``, aiosmtpd)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from shared.core.errors import (
    PermanentProviderError,
    ProviderMisconfigured,
    TransientProviderError,
)
from shared.core.models import Chunk
from shared.infra.config import SandboxSettings
from shared.providers import smtp as smtp_module
from shared.providers.base import RecipientAnswer
from shared.providers.smtp import (
    SmtpProvider,
    advertised_size,
    mail_refused,
    rcpt_answer,
    relay_denied,
)
from tests.unit.providers.fakes import chunk, recipient
from tests.unit.providers.test_sandbox import FILES
from tests.unit.sandbox.conftest import Harness, running, sandbox_settings

PASSWORD = SandboxSettings().smtp_password.get_secret_value()


@pytest.mark.parametrize(
    ("code", "text", "outcome", "suppress"),
    [
        (250, "2.1.5 OK", "accepted", False),
        (451, "4.2.1 mailbox busy", "refused_transient", False),
        (550, "5.1.1 no such user", "refused_permanent", True),
        (550, "5.2.2 mailbox full", "refused_permanent", False),
        (554, "no enhanced status", "refused_permanent", False),
    ],
)
def test_rcpt_reply_is_the_recipients_answer(
    code: int, text: str, outcome: str, suppress: bool
) -> None:
    """2xx accepted, 4xx refused for now, 5xx refused for good (suppressed when 5.1.x)."""
    answer = rcpt_answer("ann@example.org", code, text)

    assert (answer.outcome, answer.code, answer.text, answer.suppress) == (
        outcome,
        code,
        text,
        suppress,
    )


def test_every_recipient_refused_with_5_7_means_relay_denied() -> None:
    """Only when all are 5.7.x: one 5.1.1 among them is about that address."""
    denied = [rcpt_answer(f"{n}@example.org", 550, "5.7.1 relaying denied") for n in "ab"]
    mixed = [*denied, rcpt_answer("c@example.org", 550, "5.1.1 no such user")]

    assert relay_denied(denied)
    assert not relay_denied(mixed)


@pytest.mark.parametrize(
    ("code", "kind"),
    [(535, ProviderMisconfigured), (530, ProviderMisconfigured), (550, ProviderMisconfigured),
     (421, TransientProviderError), (451, TransientProviderError)],
)  # fmt: skip
def test_refusal_before_recipients(code: int, kind: type[Exception]) -> None:
    """AUTH/MAIL refusals: 5xx is our configuration, 4xx is for now."""
    error = mail_refused(code, "refused")

    assert type(error) is kind
    assert not error.outcome_unknown


@dataclass
class Relay:
    sandbox: Harness
    provider: SmtpProvider

    async def fault(self, **fields: Any) -> None:
        answer = await self.sandbox.client.post(
            "/_control/faults", json={"provider": "smtp", **fields}
        )
        assert answer.status_code == 201, answer.text

    async def accepted(self, address: str) -> int:
        sends = (await self.sandbox.client.get("/_control/sends")).json()
        count: int = sends["smtp"]["by_recipient"].get(address, 0)
        return count

    async def info(self) -> dict[str, Any]:
        found: dict[str, Any] = (await self.sandbox.client.get("/_control/smtp")).json()
        return found


def adapter(
    port: int, password: str = PASSWORD, pool_size: int = 2, timeout: float = 5
) -> SmtpProvider:
    return SmtpProvider(
        host="127.0.0.1",
        port=port,
        tls="none",
        username="sandbox-smtp-user",
        password=password,
        helo_name="test.example",
        timeout=timeout,
        pool_size=pool_size,
    )


@asynccontextmanager
async def _relay_of(settings: SandboxSettings | None = None) -> AsyncIterator[Relay]:
    async with running(settings) as sandbox:
        port = (await sandbox.client.get("/_control/smtp")).json()["port"]
        provider = adapter(port)
        try:
            yield Relay(sandbox, provider)
        finally:
            await provider.aclose()


@pytest.fixture
async def relay() -> AsyncIterator[Relay]:
    async with _relay_of() as made:
        yield made


@pytest.fixture
async def small_relay() -> AsyncIterator[Relay]:
    """A relay whose EHLO says ``SIZE 4096``."""
    async with _relay_of(sandbox_settings(smtp_max_bytes=4096)) as made:
        yield made


def tagged(*emails: str, **fields: Any) -> Chunk:
    made = chunk([recipient(e, e.split("@")[0].title()) for e in emails], **fields)
    return made.model_copy(update={"attempt": "c.0"})


def outcomes(answers: tuple[RecipientAnswer, ...] | None) -> dict[str, str]:
    assert answers is not None
    return {a.email: a.outcome for a in answers}


async def test_accepted_chunk_is_final_evidence(relay: Relay) -> None:
    """The relay's 250 makes every recipient accepted, and the receipt final."""
    receipt = await relay.provider.send(tagged("ann@example.org", "bob@example.org"))

    assert receipt.final
    assert outcomes(receipt.recipients) == {
        "ann@example.org": "accepted",
        "bob@example.org": "accepted",
    }
    assert receipt.message_id is not None and receipt.message_id.endswith("@test.example")
    assert await relay.accepted("ann@example.org") == 1
    assert await relay.accepted("bob@example.org") == 1


async def test_bulk_chunk_sends_each_recipient_their_copy(relay: Relay) -> None:
    """Bulk: one transaction per recipient, each answered on its own."""
    receipt = await relay.provider.send(tagged("ann@example.org", "bob@example.org", bulk=True))

    assert outcomes(receipt.recipients) == {
        "ann@example.org": "accepted",
        "bob@example.org": "accepted",
    }
    assert len({a.message_id for a in receipt.recipients or ()}) == 2
    sends = (await relay.sandbox.client.get("/_control/sends")).json()["smtp"]
    assert sends["requests"] == 2


async def test_rcpt_refusals_are_per_recipient(relay: Relay) -> None:
    """rcpt4xx is refused for now, rcpt5xx for good and suppressed; ann still gets it."""
    receipt = await relay.provider.send(
        tagged("ann@example.org", "rcpt4xx.bob@example.org", "rcpt5xx.cy@example.org")
    )

    answers = {a.email: a for a in receipt.recipients or ()}
    assert answers["ann@example.org"].outcome == "accepted"
    assert answers["rcpt4xx.bob@example.org"].outcome == "refused_transient"
    assert answers["rcpt4xx.bob@example.org"].code == 451
    assert answers["rcpt5xx.cy@example.org"].outcome == "refused_permanent"
    assert answers["rcpt5xx.cy@example.org"].suppress
    assert await relay.accepted("ann@example.org") == 1


async def test_every_recipient_refused_sends_no_message(relay: Relay) -> None:
    """With no recipient accepted there is no DATA, and the answers are still given."""
    receipt = await relay.provider.send(tagged("rcpt4xx.a@example.org"))

    assert outcomes(receipt.recipients) == {"rcpt4xx.a@example.org": "refused_transient"}
    sends = (await relay.sandbox.client.get("/_control/sends")).json()["smtp"]
    assert sends["requests"] == 0


async def test_relay_denied_is_misconfigured(relay: Relay) -> None:
    """Every recipient refused with 5.7.x: the relay will not take our mail."""
    with pytest.raises(ProviderMisconfigured):
        await relay.provider.send(tagged("rcpt57x.a@example.org", "rcpt57x.b@example.org"))


async def test_refused_mail_is_a_clean_transient_failure(relay: Relay) -> None:
    """A 421 to MAIL: nothing was taken, the chunk may go elsewhere at once."""
    await relay.fault(status=421, count=1)

    with pytest.raises(TransientProviderError) as failed:
        await relay.provider.send(tagged("ann@example.org"))

    assert not failed.value.outcome_unknown
    assert await relay.accepted("ann@example.org") == 0


async def test_lost_after_data_is_unknown(relay: Relay) -> None:
    """The relay took the message and dropped the connection: the outcome is unknown."""
    await relay.fault(accept=True, reset=True, count=1)

    with pytest.raises(TransientProviderError) as failed:
        await relay.provider.send(tagged("ann@example.org"))

    assert failed.value.outcome_unknown
    assert await relay.accepted("ann@example.org") == 1


async def test_no_answer_to_the_message_in_time_is_unknown(relay: Relay) -> None:
    """The relay took the message but answers after our timeout: the outcome is unknown."""
    # Each command has 2 s (a loaded loop may pause one for a few hundred ms), and the
    # relay answers the message 5 s late.
    await relay.fault(latency_ms=5000, count=1)
    provider = adapter((await relay.info())["port"], timeout=2)
    try:
        with pytest.raises(TransientProviderError) as failed:
            await provider.send(tagged("ann@example.org"))
    finally:
        await provider.aclose()

    assert failed.value.outcome_unknown
    assert await relay.accepted("ann@example.org") == 1


async def test_lost_after_data_keeps_known_refusals(relay: Relay) -> None:
    """Recipients refused at RCPT keep their answer; the accepted ones become unknown."""
    await relay.fault(accept=True, reset=True, count=1)

    receipt = await relay.provider.send(tagged("ann@example.org", "rcpt5xx.b@example.org"))

    assert outcomes(receipt.recipients) == {
        "ann@example.org": "unknown",
        "rcpt5xx.b@example.org": "refused_permanent",
    }


async def test_wrong_password_is_misconfigured(relay: Relay) -> None:
    """AUTH 535: our credentials are wrong."""
    port = (await relay.info())["port"]
    provider = adapter(port, password="wrong")
    try:
        with pytest.raises(ProviderMisconfigured) as failed:
            await provider.send(tagged("ann@example.org"))
    finally:
        await provider.aclose()

    assert failed.value.status == 535


async def test_pool_reuses_connections(relay: Relay) -> None:
    """Chunks one after another go through the same connection."""
    for _ in range(3):
        await relay.provider.send(tagged("ann@example.org"))

    assert (await relay.info())["connections"] == 1
    assert await relay.accepted("ann@example.org") == 3


async def test_a_connection_that_failed_is_not_reused(relay: Relay) -> None:
    """After a dropped connection the next chunk opens a new one, and is accepted."""
    await relay.fault(accept=True, reset=True, count=1)
    with pytest.raises(TransientProviderError):
        await relay.provider.send(tagged("ann@example.org"))

    receipt = await relay.provider.send(tagged("bob@example.org"))

    assert outcomes(receipt.recipients) == {"bob@example.org": "accepted"}
    assert (await relay.info())["connections"] == 2


async def test_close_quits_every_connection(relay: Relay) -> None:
    """aclose says QUIT to the pooled connections: the relay sees none left open."""
    await relay.provider.send(tagged("ann@example.org", "bob@example.org", bulk=True))
    await relay.provider.aclose()

    for _ in range(100):
        if (await relay.info())["open"] == 0:
            break
        await asyncio.sleep(0.01)
    assert (await relay.info())["open"] == 0


@pytest.mark.parametrize("idle_check", [0.0, 30.0], ids=["checked-with-noop", "unchecked"])
async def test_a_connection_the_relay_closed_is_not_reused(
    relay: Relay, monkeypatch: pytest.MonkeyPatch, idle_check: float
) -> None:
    """After the relay dropped its connections (a restart), the next chunk opens a new one."""
    monkeypatch.setattr(smtp_module, "IDLE_CHECK", idle_check)
    await relay.provider.send(tagged("ann@example.org"))
    dropped = await relay.sandbox.client.delete("/_control/smtp/connections")
    assert dropped.json() == {"dropped": 1}
    await asyncio.sleep(0.05)  # the client sees its connection end

    receipt = await relay.provider.send(tagged("bob@example.org"))

    assert outcomes(receipt.recipients) == {"bob@example.org": "accepted"}
    assert (await relay.info())["connections"] == 2


async def test_an_idle_connection_is_checked_and_kept(
    relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle connection that answers NOOP is used again."""
    monkeypatch.setattr(smtp_module, "IDLE_CHECK", 0.0)
    for _ in range(2):
        await relay.provider.send(tagged("ann@example.org"))

    assert (await relay.info())["connections"] == 1


@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "shared"])
async def test_a_chunks_files_reach_the_relay_by_name_and_size(relay: Relay, bulk: bool) -> None:
    """The relay records each file of the message it took: an attachment and an inline
    image (in the html's related part), with their decoded sizes."""
    sent = tagged("ann@example.org", bulk=bulk, html='<img src="cid:logo@example.com">')
    await relay.provider.send(
        sent.model_copy(update={"message": sent.message.model_copy(update={"attachments": FILES})})
    )

    sends = (await relay.sandbox.client.get("/_control/sends")).json()
    recorded = [
        (a["filename"], a["content_type"], a["disposition"], a["content_id"], a["size"])
        for a in sends["smtp"]["recent"][-1]["attachments"]
    ]
    assert sorted(recorded) == [
        ('Zoë "final", v2.pdf', "application/pdf", "attachment", None, 9 + 256 * 40),
        ("logo.png", "image/png", "inline", "logo@example.com", 6),
    ]


@pytest.mark.parametrize(
    ("extensions", "limit"),
    [
        ({"size": "10240000"}, 10_240_000),
        ({"size": ""}, None),  # SIZE with no number: the relay names no limit
        ({"size": "0"}, None),  # RFC 1870: no fixed maximum
        ({"size": "lots"}, None),
        ({"size": "\u00b2"}, None),  # a Unicode digit: isdigit() says yes, int() refuses
        ({"size": "9" * 40}, None),
        ({"8bitmime": ""}, None),
    ],
)
def test_the_relays_size_limit_is_read_from_its_ehlo(
    extensions: dict[str, str], limit: int | None
) -> None:
    assert advertised_size(extensions) == limit


async def test_a_message_over_the_relays_size_is_refused_for_good_before_it_is_sent(
    small_relay: Relay,
) -> None:
    """The relay says SIZE 4096 in its EHLO: a larger message is this relay's permanent
    refusal (the next provider may take it), and the relay never receives it."""
    big = "x" * 8000
    with pytest.raises(PermanentProviderError) as caught:
        await small_relay.provider.send(tagged("ann@example.org", text=big))
    small = await small_relay.provider.send(tagged("bob@example.org"))
    sends = (await small_relay.sandbox.client.get("/_control/sends")).json()

    assert caught.value.status == 552
    assert "SIZE 4096" in caught.value.message
    assert outcomes(small.recipients) == {"bob@example.org": "accepted"}
    assert set(sends["smtp"]["by_recipient"]) == {"bob@example.org"}


async def test_bulk_copies_all_over_the_relays_size_are_the_chunks_refusal_for_good(
    small_relay: Relay,
) -> None:
    """Every personal copy too large: the chunk is refused by this relay as a whole (the
    next provider takes it), not each recipient failed."""
    big = "x" * 8000
    with pytest.raises(PermanentProviderError) as caught:
        await small_relay.provider.send(
            tagged("ann@example.org", "bob@example.org", bulk=True, text=big)
        )

    assert "SIZE 4096" in caught.value.message
