"""The adapters' query-API lookups (which recipients of an ambiguous attempt did the provider
accept?) against the sandbox's Mailgun Events and SendGrid Email Activity, on accounts whose
call window holds far more events than one page: the answer and its cost depend on the
attempt, never on the account's traffic, and a lookup that cannot finish concludes nothing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from sandbox.activity import Indexed
from shared.core.errors import TransientProviderError
from shared.core.models import ATTEMPT_ARG, Chunk
from shared.providers import mailgun
from shared.providers.base import LookupQuery
from shared.providers.mailgun import MailgunProvider
from shared.providers.sendgrid import SendGridProvider
from tests.unit.providers.fakes import BATCH_ID, FakeProviderServer, Reply, chunk, recipient
from tests.unit.sandbox.conftest import Harness, running, sandbox_settings

DOMAIN = "mg.example.com"
TAG = "c.2"
TIMEOUT = 5.0
ANN, BOB, CAT, DAN = "ann@example.org", "bob@example.org", "cat@example.org", "dan@example.org"


@dataclass
class Account:
    """The sandbox, and a client to it that counts the requests the adapters make."""

    sandbox: Harness
    client: httpx.AsyncClient
    requests: int = 0

    def mailgun(self) -> MailgunProvider:
        return MailgunProvider(
            api_key="key-test",
            domain=DOMAIN,
            base_url="http://sandbox/mailgun",
            timeout=TIMEOUT,
            client=self.client,
        )

    def sendgrid(self) -> SendGridProvider:
        return SendGridProvider(
            api_key="SG.test-key",
            base_url="http://sandbox/sendgrid",
            timeout=TIMEOUT,
            client=self.client,
        )

    def index(self, entries: Iterator[Indexed]) -> None:
        """Accepted recipients straight into the provider's index, as if sent before."""
        self.sandbox.state.index.add(entries)


@pytest.fixture
async def account() -> AsyncIterator[Account]:
    async with running(sandbox_settings(query_delay=0.0)) as sandbox:

        async def count(request: httpx.Request) -> None:
            holder.requests += 1

        transport = httpx.ASGITransport(app=sandbox.app)
        async with httpx.AsyncClient(transport=transport, event_hooks={"request": [count]}) as c:
            holder = Account(sandbox, c)
            yield holder


def attempt(*emails: str, tag: str = TAG) -> Chunk:
    """Chunk 0 of the test batch to ``emails``, sent as the attempt ``tag``."""
    return chunk([recipient(e) for e in emails]).model_copy(update={"attempt": tag})


def query(*emails: str, since: datetime) -> LookupQuery:
    return LookupQuery(batch_id=BATCH_ID, chunk=0, tag=TAG, since=since, emails=frozenset(emails))


def noise(
    provider: str,
    count: int,
    at: float,
    *,
    to: str | None = None,
    args: dict[str, str] | None = None,
) -> Iterator[Indexed]:
    """``count`` accepted recipients, each its own address (or all ``to``), with ``args``
    (by default another batch's)."""
    for n in range(count):
        yield Indexed(
            provider,
            f"other-{n}",
            to or f"someone-{n}@elsewhere.example",
            at,
            args if args is not None else {"batch_id": "another", "chunk": "0"},
            "Other news",
            "news@example.com",
            DOMAIN if provider == "mailgun" else "",
        )


# -- Mailgun Events -------------------------------------------------------------------------


async def test_a_busy_mailgun_account_still_shows_exactly_the_attempts_recipients(
    account: Account,
) -> None:
    """With 50,000 other events in the call's window (the old lookup gave up past 30,000),
    the lookup finds the attempt's accepted recipients and no one else, in a few requests
    per recipient: Ann's own page is behind 400 events of other attempts to her, and Dan
    was sent an earlier attempt of the same chunk, never this one."""
    since = datetime.now(UTC)
    now = time.time()
    provider = account.mailgun()
    account.index(noise("mailgun", 50_000, now))
    earlier = {"batch_id": str(BATCH_ID), "chunk": "0", ATTEMPT_ARG: "c.1"}
    account.index(noise("mailgun", 400, now, to=ANN, args=earlier))
    account.index(noise("mailgun", 1, now, to=DAN, args=earlier))
    await provider.send(attempt(ANN, BOB, CAT))
    account.requests = 0

    found = await provider.lookup(query(ANN, BOB, CAT, DAN, since=since))

    assert found == frozenset({ANN, BOB, CAT})
    # Ann: two pages; Bob, Cat: one each; Dan: his page, then the empty one that ends it.
    assert account.requests == 6


async def test_recipients_without_events_cost_one_request_each(account: Account) -> None:
    """An attempt Mailgun never accepted is proven so by one empty page per recipient,
    however many events the account has."""
    since = datetime.now(UTC)
    account.index(noise("mailgun", 10_000, time.time()))
    emails = [f"r{n}@example.org" for n in range(25)]

    found = await account.mailgun().lookup(query(*emails, since=since))

    assert (found, account.requests) == (frozenset(), len(emails))


async def test_an_address_with_too_many_events_in_the_window_is_an_error_not_an_answer(
    account: Account,
) -> None:
    """Past its request cap the lookup raises a TransientProviderError (the resolver looks
    again later) rather than concluding that the recipient was not accepted."""
    since = datetime.now(UTC)
    provider = account.mailgun()
    busy = {"batch_id": "another", "chunk": "0"}
    account.index(noise("mailgun", 300 * mailgun.lookup_budget(1), time.time(), to=ANN, args=busy))
    await provider.send(attempt(ANN))
    account.requests = 0

    cap = f"cap of {mailgun.lookup_budget(1)} requests for 1 recipient"
    with pytest.raises(TransientProviderError, match=cap):
        await provider.lookup(query(ANN, since=since))

    assert account.requests == mailgun.lookup_budget(1)


async def test_events_outside_the_calls_window_are_not_evidence(account: Account) -> None:
    """The attempt's own variables on an event an hour before the call prove nothing."""
    since = datetime.now(UTC)
    ours = {"batch_id": str(BATCH_ID), "chunk": "0", ATTEMPT_ARG: TAG}
    account.index(noise("mailgun", 1, time.time() - 3600, to=ANN, args=ours))

    assert await account.mailgun().lookup(query(ANN, since=since)) == frozenset()


async def test_a_lookup_of_no_one_asks_nothing(account: Account) -> None:
    """No pending recipient, no request."""
    found = await account.mailgun().lookup(query(since=datetime.now(UTC)))

    assert (found, account.requests) == (frozenset(), 0)


@pytest.mark.parametrize(
    "body",
    [
        b'{"items": [{"event": "accepted", "recipient": "ann@example.org"}], "paging": {}}',
        b'{"items": [{"event": "accepted", "recipient": "ann@example.org"}], "paging": '
        b'{"next": "https://elsewhere.example/v3/mg.example.com/events/abc"}}',
        b'{"paging": {}}',
    ],
    ids=["no next link", "foreign next link", "no items"],
)
async def test_a_page_that_neither_shows_the_attempt_nor_ends_the_range_is_an_error(
    body: bytes,
) -> None:
    """Only an empty page proves there is nothing more: a malformed one concludes nothing."""
    server = FakeProviderServer(default=Reply(status=200, body=body))
    await server.start()
    provider = MailgunProvider(
        api_key="key-test", domain=DOMAIN, base_url=server.url, timeout=TIMEOUT
    )
    try:
        with pytest.raises(TransientProviderError, match="Events"):
            await provider.lookup(query(ANN, since=datetime.now(UTC) - timedelta(seconds=1)))
    finally:
        await provider.aclose()
        await server.stop()


# -- SendGrid Email Activity ----------------------------------------------------------------


async def test_a_busy_sendgrid_account_answers_the_attempt_in_one_request(
    account: Account,
) -> None:
    """Email Activity filters on our custom args, so 50,000 other messages cost nothing."""
    since = datetime.now(UTC)
    provider = account.sendgrid()
    account.index(noise("sendgrid", 50_000, time.time()))
    await provider.send(attempt(ANN, BOB))
    account.requests = 0

    found = await provider.lookup(query(ANN, BOB, CAT, since=since))

    assert (found, account.requests) == (frozenset({ANN, BOB}), 1)


async def test_a_full_activity_answer_missing_recipients_is_an_error_not_an_answer(
    account: Account,
) -> None:
    """An answer listing its most (1,000) messages may be cut short: a pending recipient
    missing from it is not proven unaccepted."""
    since = datetime.now(UTC)
    ours = {"batch_id": str(BATCH_ID), "chunk": "0", ATTEMPT_ARG: TAG}
    account.index(noise("sendgrid", 1, time.time() - 1, to=ANN, args=ours))
    account.index(noise("sendgrid", 1_000, time.time(), args=ours))

    with pytest.raises(TransientProviderError, match="cut short"):
        await account.sendgrid().lookup(query(ANN, since=since))
