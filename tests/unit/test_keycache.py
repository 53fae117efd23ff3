"""Each API process's key cache (services.api.keycache) over the account twins and the broker twin:
revocation by broadcast, the TTL bound without it, what is and is not remembered."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from services.api.keycache import TTL, KeyCache, Revocations, revocation, revoked_in
from shared.accounts import apikeys
from shared.accounts.accounts import StoredKey
from tests.fakes.accounts import FakeAccounts
from tests.fakes.broker import FakeBroker
from tests.fakes.cassandra import FakeCassandra


class Clock:
    """Monotonic seconds the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def accounts() -> FakeAccounts:
    return FakeAccounts(FakeCassandra())


@pytest.fixture
def clock() -> Clock:
    return Clock()


def key_id(plaintext: str) -> str:
    parsed = apikeys.parse(plaintext)
    assert parsed is not None
    return parsed[0]


async def admitted(cache: KeyCache, presented: str) -> bool:
    return await cache.authenticate(presented, datetime.now(UTC)) is not None


async def new_key(accounts: FakeAccounts, **options: object) -> tuple[str, str]:
    user = await accounts.ensure_user("ann")
    plaintext = await accounts.create_key(user, "k", **options)  # type: ignore[arg-type]
    return plaintext, key_id(plaintext)


async def test_a_key_revoked_by_one_process_is_refused_by_anothers_cache_on_the_broadcast(
    accounts: FakeAccounts, clock: Clock
) -> None:
    """After the store write and the broadcast, a second process's warm cache refuses the key
    at once, with no time passing."""
    broker = FakeBroker()
    first, second = (
        KeyCache(accounts.read_key, clock=clock),
        KeyCache(accounts.read_key, clock=clock),
    )
    await broker.listen(first.hear)
    await broker.listen(second.hear)
    plaintext, kid = await new_key(accounts)
    assert await admitted(first, plaintext)
    assert await admitted(second, plaintext)

    await accounts.revoke_key(await accounts.ensure_user("ann"), kid)
    announced = await Revocations(broker, first).announce([kid])

    assert announced is True
    assert not await admitted(second, plaintext)
    assert not await admitted(first, plaintext)


async def test_without_the_broadcast_a_revoked_key_is_refused_once_its_read_is_ttl_old(
    accounts: FakeAccounts, clock: Clock
) -> None:
    """A process that missed the broadcast accepts a revoked key only until TTL seconds after
    it read the key's row, then refuses it."""
    cache = KeyCache(accounts.read_key, clock=clock)
    plaintext, kid = await new_key(accounts)
    assert await admitted(cache, plaintext)

    await accounts.revoke_key(await accounts.ensure_user("ann"), kid)
    clock.t += TTL * 0.9
    still = await admitted(cache, plaintext)
    clock.t += TTL * 0.1

    assert still is True  # the bound, not better: no broadcast reached this process
    assert not await admitted(cache, plaintext)


async def test_requests_within_the_ttl_share_one_store_read(
    accounts: FakeAccounts, clock: Clock
) -> None:
    """A hundred requests with one key within TTL read its row once; the next after TTL
    reads it again."""
    cache = KeyCache(accounts.read_key, clock=clock)
    plaintext, _ = await new_key(accounts)

    for _ in range(100):
        assert await admitted(cache, plaintext)
        clock.t += TTL / 200
    reads_within = cache.reads
    clock.t += TTL
    assert await admitted(cache, plaintext)

    assert (reads_within, cache.reads) == (1, 2)


async def test_concurrent_requests_with_a_key_not_held_share_one_store_read(
    accounts: FakeAccounts, clock: Clock
) -> None:
    """Sixteen requests with one key arriving together, none held, read its row once."""
    cache = KeyCache(accounts.read_key, clock=clock)
    plaintext, _ = await new_key(accounts)

    results = await asyncio.gather(*(admitted(cache, plaintext) for _ in range(16)))

    assert all(results)
    assert cache.reads == 1


async def test_a_request_after_the_broadcast_does_not_join_a_read_sent_before_it(
    accounts: FakeAccounts, clock: Clock
) -> None:
    """A request that began before the revocation may still be admitted by its read; one that
    began after the broadcast reads the store itself and is refused."""
    plaintext, kid = await new_key(accounts)
    gate = asyncio.Event()

    async def held_open(wanted: str) -> StoredKey | None:
        found = await accounts.read_key(wanted)
        await gate.wait()
        return found

    cache = KeyCache(held_open, clock=clock)
    early = asyncio.ensure_future(admitted(cache, plaintext))
    await asyncio.sleep(0.01)
    await accounts.revoke_key(await accounts.ensure_user("ann"), kid)
    cache.hear(revocation([kid]))
    late = asyncio.ensure_future(admitted(cache, plaintext))
    await asyncio.sleep(0.01)
    gate.set()

    assert list(await asyncio.gather(early, late)) == [True, False]
    assert cache.reads == 2


async def test_an_unknown_key_is_not_remembered_so_it_is_accepted_once_it_exists(
    accounts: FakeAccounts, clock: Clock
) -> None:
    """A key refused because its row was not there yet is accepted as soon as the row is
    written, with no time passing."""
    cache = KeyCache(accounts.read_key, clock=clock)
    plaintext, kid = await new_key(accounts)
    row = accounts.tables.api_keys.pop(kid)
    refused = await admitted(cache, plaintext)

    accounts.tables.api_keys[kid] = row

    assert refused is False
    assert await admitted(cache, plaintext)


async def test_guessed_key_ids_take_no_room(accounts: FakeAccounts, clock: Clock) -> None:
    """A thousand well-formed keys that do not exist are all refused and none is held."""
    cache = KeyCache(accounts.read_key, clock=clock)

    results = [await admitted(cache, apikeys.generate().plaintext) for _ in range(1000)]

    assert not any(results)
    assert len(cache) == 0


async def test_the_cache_holds_at_most_max_keys_the_least_recently_used_leaving(
    accounts: FakeAccounts, clock: Clock
) -> None:
    """With room for three keys, five keys in use leave three held: the most recently used."""
    cache = KeyCache(accounts.read_key, clock=clock, max_keys=3)
    keys = [await new_key(accounts) for _ in range(5)]

    for plaintext, _ in keys:
        assert await admitted(cache, plaintext)
    assert await admitted(cache, keys[2][0])  # used again: the most recent

    assert len(cache) == 3
    assert [kid in cache for _, kid in keys] == [False, False, True, True, True]


async def test_a_read_in_flight_when_the_broadcast_arrives_is_not_kept(
    accounts: FakeAccounts, clock: Clock
) -> None:
    """A row read before a revocation but landing after its broadcast is not cached: the next
    request reads the store again and is refused."""
    plaintext, kid = await new_key(accounts)
    first = True

    async def read_then_revoked(wanted: str) -> StoredKey | None:
        nonlocal first
        before = await accounts.read_key(wanted)
        if first:
            first = False
            await accounts.revoke_key(await accounts.ensure_user("ann"), wanted)
            cache.hear(revocation([wanted]))
        return before

    cache = KeyCache(read_then_revoked, clock=clock)
    await cache.authenticate(plaintext, datetime.now(UTC))

    assert kid not in cache
    assert not await admitted(cache, plaintext)


async def test_a_wrong_secret_for_a_cached_key_is_refused(
    accounts: FakeAccounts, clock: Clock
) -> None:
    """The secret is checked on every request: a cached key's id with another secret fails."""
    cache = KeyCache(accounts.read_key, clock=clock)
    plaintext, kid = await new_key(accounts)
    assert await admitted(cache, plaintext)
    other = apikeys.generate().plaintext.split("_", 3)[3]

    assert not await admitted(cache, f"{apikeys.PREFIX}{kid}_{other}")


async def test_a_cached_key_is_refused_once_it_expires(
    accounts: FakeAccounts, clock: Clock
) -> None:
    """Expiry is judged at each request, not when the row was read."""
    cache = KeyCache(accounts.read_key, clock=clock)
    expires = datetime.now(UTC) + timedelta(minutes=1)
    plaintext, _ = await new_key(accounts, expires_at=expires)

    before = await cache.authenticate(plaintext, expires - timedelta(seconds=1))
    after = await cache.authenticate(plaintext, expires)

    assert before is not None and after is None


@pytest.mark.parametrize("body", [b'{"changed": ["providers.chain"]}', b"not json", b"[1]"])
async def test_other_announcements_drop_nothing(
    accounts: FakeAccounts, clock: Clock, body: bytes
) -> None:
    """A settings nudge or a malformed announcement leaves cached keys in place."""
    cache = KeyCache(accounts.read_key, clock=clock)
    plaintext, kid = await new_key(accounts)
    assert await admitted(cache, plaintext)

    cache.hear(body)

    assert kid in cache


def test_the_broadcast_names_the_key_id_never_its_secret() -> None:
    """A revocation carries key ids only, and reads back as those ids."""
    new = apikeys.generate()
    secret = new.plaintext.removeprefix(f"{apikeys.PREFIX}{new.key_id}_")

    body = revocation([new.key_id])

    assert revoked_in(body) == (new.key_id,)
    assert secret.encode() not in body and new.secret_hash not in body
