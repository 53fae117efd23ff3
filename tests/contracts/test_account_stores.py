"""The account-side store contract: users and API keys, dashboard sessions, Idempotency-Key
claims and the suppression list, asserted identically of the in-memory twins
(``tests/fakes/accounts.py``, ``tests/fakes/api.py``, ``tests/fakes/audience.py``) and of the
real stores on Cassandra."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.api.idempotency import Claimed, Existing, IdempotencyStore
from services.api.session_store import SessionStore, session_hash
from shared.accounts import accounts, apikeys
from shared.accounts.accounts import ApiKeyRecord, StoredKey, UserProfile
from shared.audience.suppressions import LOOKUP_CHUNK, SuppressionStore
from shared.infra.db import Database
from tests.conftest import unique
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.accounts import FakeAccounts
from tests.fakes.api import FakeIdempotencyStore, FakeSessionStore
from tests.fakes.audience import FakeSuppressionStore
from tests.fakes.cassandra import Clock, FakeCassandra

BODY = hashlib.sha256(b"the first body").digest()
OTHER_BODY = hashlib.sha256(b"another body").digest()


class RealAccounts:
    """:mod:`shared.accounts.accounts` bound to one database, shaped as :class:`FakeAccounts`."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def ensure_user(self, login: str) -> uuid.UUID:
        return await accounts.ensure_user(self.db, login)

    async def upsert_github_user(self, **profile: Any) -> uuid.UUID:
        return await accounts.upsert_github_user(self.db, **profile)

    async def get_user(self, user_id: uuid.UUID) -> UserProfile | None:
        return await accounts.get_user(self.db, user_id)

    async def create_key(self, user_id: uuid.UUID, name: str, **options: Any) -> str:
        return await accounts.create_key(self.db, user_id, name, **options)

    async def end_sessions(self, user_id: uuid.UUID) -> None:
        await accounts.end_sessions(self.db, user_id)

    async def authenticate(self, presented: str) -> ApiKeyRecord | None:
        return await accounts.authenticate(self.db, presented)

    async def read_key(self, key_id: str) -> StoredKey | None:
        return await accounts.read_key(self.db, key_id)

    async def list_keys(self, user_id: uuid.UUID) -> list[ApiKeyRecord]:
        return await accounts.list_keys(self.db, user_id)

    async def revoke_key(self, user_id: uuid.UUID, key_id: str) -> bool:
        return await accounts.revoke_key(self.db, user_id, key_id)

    async def touch_key(self, key_id: str) -> None:
        await accounts.touch_key(self.db, key_id)


@dataclass
class AccountSide:
    """The stores under contract, and what a test does to time on either side."""

    accounts: Any
    suppressions: Any
    db: Database | None
    tables: FakeCassandra | None
    clock: Clock | None

    def sessions(self, **limits: int) -> Any:
        if self.db is None:
            return FakeSessionStore(self.tables, **limits)
        return SessionStore(self.db, **limits)

    def idempotency(self, *, lease: float = 30.0) -> Any:
        if self.db is None:
            return FakeIdempotencyStore(self.tables, lease=lease)
        return IdempotencyStore(self.db, lease=lease)

    async def age_session(self, session_id: str, seconds: float) -> None:
        """Let ``seconds`` pass for one session: its stored times move that far back (the
        stores read the wall clock), and its row's TTL becomes an hour, so only
        ``expires_at`` decides whether it lives."""
        key, shift = session_hash(session_id), timedelta(seconds=seconds)
        if self.tables is not None:
            row = self.tables.sessions[key]
            for column in ("created_at", "refreshed_at", "expires_at"):
                row.cells[column].value -= shift
            for cell in (*row.cells.values(), row.marker):
                assert cell is not None
                cell.expires = self.tables.now() + timedelta(hours=1)
            return
        assert self.db is not None
        stored_row = await self.db.one("SELECT * FROM sessions WHERE session_hash = ?", (key,))
        assert stored_row is not None, "no such session"
        await self.db.execute(
            "UPDATE sessions USING TTL 3600 SET user_id = ?, csrf_token = ?, created_at = ?, "
            "refreshed_at = ?, expires_at = ? WHERE session_hash = ? IF EXISTS",
            (
                stored_row["user_id"],
                stored_row["csrf_token"],
                stored_row["created_at"] - shift,
                stored_row["refreshed_at"] - shift,
                stored_row["expires_at"] - shift,
                key,
            ),
        )

    async def claimed_long_ago(self, user_id: uuid.UUID, key: str, *, remaining: int) -> None:
        """Make a fresh claim as if it had been written a day ago, less ``remaining`` seconds:
        every cell it wrote now expires ``remaining`` seconds from now."""
        if self.tables is not None:
            FakeIdempotencyStore(self.tables).age(user_id, key, remaining=remaining)
            return
        assert self.db is not None
        row = await self.db.one(
            "SELECT * FROM idempotency_keys WHERE user_id = ? AND key = ?", (user_id, key)
        )
        assert row is not None and row["response"] is None, "no fresh claim"
        await self.db.execute(
            "INSERT INTO idempotency_keys (user_id, key, body_hash, batch_id, owner, "
            "lease_until, created_at) VALUES (?, ?, ?, ?, ?, ?, ?) USING TTL ?",
            (
                user_id,
                key,
                row["body_hash"],
                row["batch_id"],
                row["owner"],
                row["lease_until"],
                row["created_at"],
                remaining,
            ),
        )

    async def wait(self, seconds: float) -> None:
        """Let server time pass (instantly for the twins)."""
        if self.clock is not None:
            self.clock.advance(seconds)
        else:
            await asyncio.sleep(seconds)


@pytest.fixture(params=IMPLEMENTATIONS)
def side(request: pytest.FixtureRequest) -> AccountSide:
    if request.param == "fake":
        clock = Clock()
        tables = FakeCassandra(now=clock.now)
        return AccountSide(FakeAccounts(tables), FakeSuppressionStore(), None, tables, clock)
    db: Database = request.getfixturevalue("db")
    return AccountSide(RealAccounts(db), SuppressionStore(db), db, None, None)


def _near_now(value: datetime) -> bool:
    """A stored timestamp (naive UTC) within a few seconds of now."""
    aware = value if value.tzinfo else value.replace(tzinfo=UTC)
    return abs(datetime.now(UTC) - aware) < timedelta(seconds=5)


def _key_id(plaintext: str) -> str:
    parsed = apikeys.parse(plaintext)
    assert parsed is not None
    return parsed[0]


def _secret(plaintext: str) -> str:
    """A key's secret (which may itself hold ``_``: never split a key by hand)."""
    parsed = apikeys.parse(plaintext)
    assert parsed is not None
    return parsed[1]


# -- users ---------------------------------------------------------------------------------


async def test_a_login_names_one_user_however_often_it_is_ensured(side: AccountSide) -> None:
    login = unique("cli")
    first = await side.accounts.ensure_user(login)
    again = await side.accounts.ensure_user(login)
    other = await side.accounts.ensure_user(unique("cli"))

    assert first == again != other
    assert await side.accounts.get_user(first) == UserProfile(first, login, None, None, None)


async def test_racing_ensures_of_one_login_agree_on_one_user(side: AccountSide) -> None:
    """The login is claimed with a lightweight transaction: one winner, everyone adopts it."""
    login = unique("race")

    ids = await asyncio.gather(*(side.accounts.ensure_user(login) for _ in range(6)))

    assert len(set(ids)) == 1
    profile = await side.accounts.get_user(ids[0])
    assert profile is not None and profile.login == login


async def test_an_unknown_user_has_no_profile(side: AccountSide) -> None:
    assert await side.accounts.get_user(uuid.uuid4()) is None


async def test_a_github_user_keeps_its_id_across_a_rename_and_its_profile_follows(
    side: AccountSide,
) -> None:
    """Users are keyed by the GitHub id, which the profile carries; login, name, e-mail and
    avatar are GitHub's latest."""
    github_id = 60_000_000 + uuid.uuid4().int % 10_000_000
    first = await side.accounts.upsert_github_user(
        github_id=github_id,
        login=unique("old"),
        name="Ann",
        email="ann@example.org",
        avatar_url="https://avatars.example/1",
    )
    new_login = unique("new")

    again = await side.accounts.upsert_github_user(
        github_id=github_id, login=new_login, name=None, email=None, avatar_url=None
    )

    assert again == first
    assert await side.accounts.get_user(first) == UserProfile(
        first, new_login, None, None, None, github_id=github_id
    )


async def test_distinct_github_accounts_are_distinct_users(side: AccountSide) -> None:
    base = 70_000_000 + uuid.uuid4().int % 10_000_000
    login = unique("same")
    profile = {"login": login, "name": None, "email": None, "avatar_url": None}

    one = await side.accounts.upsert_github_user(github_id=base, **profile)
    two = await side.accounts.upsert_github_user(github_id=base + 1, **profile)

    assert one != two


async def test_a_github_login_never_takes_over_a_cli_account_of_that_name(
    side: AccountSide,
) -> None:
    """Logins change hands on GitHub, so a GitHub user is never matched to a CLI-made account
    by name, and the CLI's account for the name stays its own."""
    login = unique("taken")
    cli_user = await side.accounts.ensure_user(login)
    cli_key = await side.accounts.create_key(cli_user, "cli")

    github_user = await side.accounts.upsert_github_user(
        github_id=80_000_000 + uuid.uuid4().int % 10_000_000,
        login=login,
        name=None,
        email=None,
        avatar_url=None,
    )

    assert github_user != cli_user
    assert await side.accounts.ensure_user(login) == cli_user
    assert await side.accounts.list_keys(github_user) == []
    record = await side.accounts.authenticate(cli_key)
    assert record is not None and record.user_id == cli_user


async def test_racing_first_github_logins_leave_one_complete_profile(side: AccountSide) -> None:
    """Whichever login wins the claim, the user ends with a profile, never a bare row."""
    github_id = 90_000_000 + uuid.uuid4().int % 10_000_000
    logins = [unique("racer") for _ in range(5)]

    ids = await asyncio.gather(
        *(
            side.accounts.upsert_github_user(
                github_id=github_id, login=login, name=login, email=None, avatar_url=None
            )
            for login in logins
        )
    )

    assert len(set(ids)) == 1
    profile = await side.accounts.get_user(ids[0])
    assert profile is not None and profile.login in logins and profile.name == profile.login


# -- API keys ------------------------------------------------------------------------------


async def test_a_new_key_authenticates_as_its_user(side: AccountSide) -> None:
    user = await side.accounts.ensure_user(unique("keys"))

    plaintext = await side.accounts.create_key(user, "deploy bot")
    record = await side.accounts.authenticate(plaintext)

    assert record is not None
    assert (record.key_id, record.user_id, record.name) == (_key_id(plaintext), user, "deploy bot")
    assert (record.revoked_at, record.last_used_at) == (None, None)
    assert _near_now(record.created_at)


async def test_a_key_keeps_the_scopes_it_was_made_with(side: AccountSide) -> None:
    user = await side.accounts.ensure_user(unique("scopes"))

    narrow = await side.accounts.create_key(user, "sender", scopes=["send"])
    usual = await side.accounts.create_key(user, "usual")

    narrow_record = await side.accounts.authenticate(narrow)
    usual_record = await side.accounts.authenticate(usual)
    assert narrow_record is not None and narrow_record.scopes == {"send"}
    assert usual_record is not None and usual_record.scopes == apikeys.DEFAULT_SCOPES
    listed = {r.name: r.scopes for r in await side.accounts.list_keys(user)}
    assert listed == {"sender": {"send"}, "usual": apikeys.DEFAULT_SCOPES}


async def test_a_key_authenticates_only_until_it_expires(side: AccountSide) -> None:
    user = await side.accounts.ensure_user(unique("expiry"))
    now = datetime.now(UTC)

    expired = await side.accounts.create_key(user, "old", expires_at=now - timedelta(minutes=1))
    current = await side.accounts.create_key(user, "new", expires_at=now + timedelta(days=1))

    assert await side.accounts.authenticate(expired) is None
    record = await side.accounts.authenticate(current)
    assert record is not None and record.expires_at is not None
    assert abs(record.expires_at - (now + timedelta(days=1))) < timedelta(seconds=1)


async def test_logging_out_everywhere_marks_the_moment_on_the_profile(
    side: AccountSide,
) -> None:
    user = await side.accounts.ensure_user(unique("everywhere"))
    before = await side.accounts.get_user(user)

    await side.accounts.end_sessions(user)

    after = await side.accounts.get_user(user)
    assert before is not None and before.sessions_after is None
    assert after is not None and after.sessions_after is not None
    assert after.sessions_after.tzinfo is not None


def _mutations(plaintext: str) -> list[str]:
    """The key with one thing wrong: each must fail."""
    key_id, secret = _key_id(plaintext), _secret(plaintext)
    flipped = "A" if secret[-1] != "A" else "B"
    return [
        f"sd_live_{key_id}_{secret[:-1]}{flipped}",  # one character of the secret
        f"sd_live_{key_id}_{secret[:-1]}",  # truncated
        f"{plaintext}A",  # one character too many
        plaintext.upper(),
        f" {plaintext}",
        plaintext.replace("sd_live_", "sd_test_"),
        f"Bearer {plaintext}",
        f"sd_live_{key_id}_{_secret(apikeys.generate().plaintext)}",  # another key's secret
    ]


async def test_a_key_authenticates_only_exactly_as_issued(side: AccountSide) -> None:
    user = await side.accounts.ensure_user(unique("exact"))
    plaintext = await side.accounts.create_key(user, "k")

    for wrong in _mutations(plaintext):
        assert await side.accounts.authenticate(wrong) is None, wrong
    assert await side.accounts.authenticate(plaintext) is not None


async def test_a_key_followed_by_a_newline_does_not_authenticate(side: AccountSide) -> None:
    """Anything after the secret makes a different string, which is not the key."""
    user = await side.accounts.ensure_user(unique("newline"))
    plaintext = await side.accounts.create_key(user, "k")

    assert await side.accounts.authenticate(plaintext + "\n") is None


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "sd_live_",
        "sd_live_abcdefghijkl_",
        "' OR '1'='1",
        "sd_live_abcdefghijkl_' OR ''='" + "A" * 30,
        "sd_live_" + "a" * 12 + "_" + "A" * 43,  # well-formed, never issued
        "sd_live_\u0430bcdefghijkl_" + "A" * 43,  # Cyrillic a: not the key alphabet
        "sd_live_abcdefghijkl_" + "A" * 42 + "\x00",
        "sd_live_" + "x" * 100_000,
    ],
)
async def test_malformed_hostile_and_unknown_keys_never_authenticate(
    side: AccountSide, presented: str
) -> None:
    assert await side.accounts.authenticate(presented) is None


async def test_a_revoked_key_stops_authenticating_but_stays_listed(side: AccountSide) -> None:
    user = await side.accounts.ensure_user(unique("revoke"))
    plaintext = await side.accounts.create_key(user, "old")
    key_id = _key_id(plaintext)

    assert await side.accounts.revoke_key(user, key_id) is True

    assert await side.accounts.authenticate(plaintext) is None
    [listed] = await side.accounts.list_keys(user)
    assert listed.key_id == key_id and listed.revoked_at is not None
    assert _near_now(listed.revoked_at)
    assert accounts.key_view(listed)["revoked"] is True


async def test_reading_a_key_gives_its_record_and_digest_revoked_or_not(
    side: AccountSide,
) -> None:
    user = await side.accounts.ensure_user(unique("readkey"))
    plaintext = await side.accounts.create_key(user, "cached")
    key_id, secret = apikeys.parse(plaintext) or ("", "")

    live = await side.accounts.read_key(key_id)
    await side.accounts.revoke_key(user, key_id)
    revoked = await side.accounts.read_key(key_id)

    assert live is not None and live.record.key_id == key_id and live.record.user_id == user
    assert live.secret_hash == apikeys.hash_secret(secret) and live.record.revoked_at is None
    assert revoked is not None and revoked.record.revoked_at is not None
    assert await side.accounts.read_key("abcdefghijkl") is None


async def test_a_user_cannot_revoke_another_users_key(side: AccountSide) -> None:
    owner = await side.accounts.ensure_user(unique("owner"))
    intruder = await side.accounts.ensure_user(unique("intruder"))
    plaintext = await side.accounts.create_key(owner, "mine")

    assert await side.accounts.revoke_key(intruder, _key_id(plaintext)) is False

    record = await side.accounts.authenticate(plaintext)
    assert record is not None and record.revoked_at is None


@pytest.mark.parametrize("key_id", ["abcdefghijkl", "x" * 500, "' OR 1=1 --", "ABCDEFGHIJKL"])
async def test_revoking_an_unknown_key_is_refused(side: AccountSide, key_id: str) -> None:
    user = await side.accounts.ensure_user(unique("nokey"))

    assert await side.accounts.revoke_key(user, key_id) is False
    assert await side.accounts.list_keys(user) == []


async def test_each_user_lists_only_its_own_keys_in_key_id_order(side: AccountSide) -> None:
    ann = await side.accounts.ensure_user(unique("ann"))
    bob = await side.accounts.ensure_user(unique("bob"))
    anns = [await side.accounts.create_key(ann, f"k{i}") for i in range(3)]
    bobs = [await side.accounts.create_key(bob, "only")]

    listed = await side.accounts.list_keys(ann)

    assert [r.key_id for r in listed] == sorted(_key_id(k) for k in anns)
    assert {r.user_id for r in listed} == {ann}
    assert [r.key_id for r in await side.accounts.list_keys(bob)] == [_key_id(bobs[0])]
    assert await side.accounts.list_keys(uuid.uuid4()) == []


async def test_touching_a_key_records_its_last_use(side: AccountSide) -> None:
    user = await side.accounts.ensure_user(unique("touch"))
    plaintext = await side.accounts.create_key(user, "used")

    await side.accounts.touch_key(_key_id(plaintext))

    record = await side.accounts.authenticate(plaintext)
    assert record is not None and record.last_used_at is not None
    assert record.last_used_at >= record.created_at and _near_now(record.last_used_at)
    assert accounts.key_view(record)["last_used_at"] is not None


async def test_a_keys_view_shows_neither_its_secret_nor_its_hash(side: AccountSide) -> None:
    user = await side.accounts.ensure_user(unique("view"))
    plaintext = await side.accounts.create_key(user, "shown")
    secret = _secret(plaintext)
    [record] = await side.accounts.list_keys(user)

    view = accounts.key_view(record)

    text = repr(view)
    assert secret not in text and apikeys.hash_secret(secret).hex() not in text
    assert view["prefix"] == f"sd_live_{record.key_id}_" and plaintext.startswith(view["prefix"])


async def test_a_keys_view_states_its_times_in_utc(side: AccountSide) -> None:
    """``/v1/keys`` times must say they are UTC, as ``/v1/suppressions``' times do."""
    user = await side.accounts.ensure_user(unique("utc"))
    plaintext = await side.accounts.create_key(user, "when")
    await side.accounts.touch_key(_key_id(plaintext))
    [record] = await side.accounts.list_keys(user)

    view = accounts.key_view(record)

    for field in ("created_at", "last_used_at"):
        assert datetime.fromisoformat(str(view[field])).utcoffset() == timedelta(0), field


# -- sessions ------------------------------------------------------------------------------


async def test_a_new_session_reads_back_with_its_user_token_and_idle_expiry(
    side: AccountSide,
) -> None:
    store = side.sessions(idle_ttl=100, max_age=1000)
    user = uuid.uuid4()

    session_id, csrf = await store.create(user)
    session = await store.get(session_id)

    assert session is not None
    assert (session.user_id, session.csrf_token) == (user, csrf)
    assert session.refreshed_at == session.created_at and _near_now(session.created_at)
    assert session.expires_at - session.created_at == timedelta(seconds=100)


async def test_every_session_gets_a_fresh_id_and_csrf_token(side: AccountSide) -> None:
    store = side.sessions()
    user = uuid.uuid4()

    made = [await store.create(user) for _ in range(3)]

    tokens = [t for pair in made for t in pair]
    assert len(set(tokens)) == len(tokens)
    assert all(len(t) >= 43 for t in tokens)


@pytest.mark.parametrize("session_id", ["", "x", "a" * 129, "\x00", "' OR 1=1 --"])
async def test_unknown_empty_and_oversized_ids_are_no_session(
    side: AccountSide, session_id: str
) -> None:
    store = side.sessions()

    assert await store.get(session_id) is None
    await store.delete(session_id)  # harmless
    assert await store.get(session_id) is None


async def test_the_stored_hash_of_an_id_is_not_a_usable_session_id(side: AccountSide) -> None:
    """A dump of the sessions table yields no cookie that works."""
    store = side.sessions()
    session_id, _ = await store.create(uuid.uuid4())

    assert await store.get(session_hash(session_id)) is None
    assert await store.get(session_id) is not None


async def test_deleting_a_session_ends_it_alone(side: AccountSide) -> None:
    store = side.sessions()
    user = uuid.uuid4()
    (gone, _), (kept, _) = await store.create(user), await store.create(user)

    await store.delete(gone)

    assert await store.get(gone) is None
    kept_session = await store.get(kept)
    assert kept_session is not None and kept_session.user_id == user


async def test_a_login_that_replaces_a_session_rotates_its_id(side: AccountSide) -> None:
    store = side.sessions()
    user = uuid.uuid4()
    old, old_csrf = await store.create(user)

    new, new_csrf = await store.create(user, replaces=old)

    assert await store.get(old) is None
    session = await store.get(new)
    assert session is not None and session.user_id == user
    assert (new, new_csrf) != (old, old_csrf) and new_csrf != old_csrf


async def test_replacing_an_unknown_session_still_starts_one(side: AccountSide) -> None:
    store = side.sessions()

    session_id, _ = await store.create(uuid.uuid4(), replaces="never-issued")

    assert await store.get(session_id) is not None


async def test_a_session_unused_past_its_idle_time_is_gone(side: AccountSide) -> None:
    """Expiry is checked on read, even while the row itself is still stored."""
    store = side.sessions(idle_ttl=60)
    session_id, _ = await store.create(uuid.uuid4())

    await side.age_session(session_id, 61)

    assert await store.get(session_id) is None


async def test_a_max_age_below_the_idle_time_caps_a_new_session(side: AccountSide) -> None:
    store = side.sessions(idle_ttl=100, max_age=50)
    session_id, _ = await store.create(uuid.uuid4())
    session = await store.get(session_id)
    assert session is not None and session.expires_at - session.created_at == timedelta(seconds=50)

    await side.age_session(session_id, 51)

    assert await store.get(session_id) is None


async def test_a_read_after_the_refresh_interval_slides_the_stored_expiry(
    side: AccountSide,
) -> None:
    store = side.sessions(idle_ttl=100)  # a read refreshes after 25 s
    session_id, csrf = await store.create(uuid.uuid4())
    await side.age_session(session_id, 30)

    returned = await store.get(session_id)
    persisted = await store.get(session_id)

    for session in (returned, persisted):
        assert session is not None and session.csrf_token == csrf
        assert _near_now(session.refreshed_at)
        assert session.refreshed_at - session.created_at >= timedelta(seconds=29)
        assert session.expires_at - session.refreshed_at == timedelta(seconds=100)


async def test_a_read_within_the_refresh_interval_changes_nothing(side: AccountSide) -> None:
    store = side.sessions(idle_ttl=100)
    session_id, _ = await store.create(uuid.uuid4())
    await side.age_session(session_id, 10)

    first = await store.get(session_id)
    again = await store.get(session_id)

    assert first is not None and first == again
    assert first.refreshed_at == first.created_at
    assert first.expires_at - first.created_at == timedelta(seconds=100)


async def test_a_refresh_never_extends_a_session_past_its_max_age(side: AccountSide) -> None:
    store = side.sessions(idle_ttl=100, max_age=130)
    session_id, _ = await store.create(uuid.uuid4())
    await side.age_session(session_id, 60)

    await store.get(session_id)
    session = await store.get(session_id)

    assert session is not None
    assert session.expires_at - session.created_at == timedelta(seconds=130)


async def test_a_read_racing_a_logout_never_resurrects_the_session(side: AccountSide) -> None:
    """The refresh a stale read writes is conditional, so a logout in between stays final."""
    store = side.sessions(idle_ttl=100)
    ids = [(await store.create(uuid.uuid4()))[0] for _ in range(5)]
    for session_id in ids:
        await side.age_session(session_id, 30)  # every read now writes a refresh

    await asyncio.gather(*(store.get(s) for s in ids), *(store.delete(s) for s in ids))

    assert [await store.get(s) for s in ids] == [None] * len(ids)


# -- idempotency keys ----------------------------------------------------------------------


async def test_the_first_claim_of_a_key_wins_and_fixes_its_batch_id(side: AccountSide) -> None:
    store = side.idempotency(lease=30.0)
    user, key, batch, owner = uuid.uuid4(), unique("idem"), uuid.uuid1(), uuid.uuid4()

    assert await store.claim(user, key, BODY, batch, owner) == Claimed(batch)
    repeat = await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())

    assert isinstance(repeat, Existing)
    assert (repeat.same_body, repeat.batch_id, repeat.response, repeat.owner) == (
        True,
        batch,
        None,
        owner,
    )
    assert repeat.lease_until is not None and not repeat.expired(datetime.now(UTC))
    assert repeat.lease_until - datetime.now(UTC) <= timedelta(seconds=30)


async def test_a_repeat_with_another_body_is_told_apart(side: AccountSide) -> None:
    store = side.idempotency()
    user, key, batch = uuid.uuid4(), unique("idem"), uuid.uuid1()
    await store.claim(user, key, BODY, batch, uuid.uuid4())

    repeat = await store.claim(user, key, OTHER_BODY, uuid.uuid1(), uuid.uuid4())

    assert isinstance(repeat, Existing)
    assert not repeat.same_body and repeat.batch_id == batch


async def test_keys_are_scoped_to_their_user(side: AccountSide) -> None:
    store = side.idempotency()
    key = unique("shared")
    ann_batch, bob_batch = uuid.uuid1(), uuid.uuid1()

    ann = await store.claim(uuid.uuid4(), key, BODY, ann_batch, uuid.uuid4())
    bob = await store.claim(uuid.uuid4(), key, OTHER_BODY, bob_batch, uuid.uuid4())

    assert (ann, bob) == (Claimed(ann_batch), Claimed(bob_batch))


async def test_racing_claims_of_one_key_have_exactly_one_winner(side: AccountSide) -> None:
    store = side.idempotency()
    user, key = uuid.uuid4(), unique("race")
    batches = [uuid.uuid1() for _ in range(6)]

    results = await asyncio.gather(
        *(store.claim(user, key, BODY, b, uuid.uuid4()) for b in batches)
    )

    [winner] = [r for r in results if isinstance(r, Claimed)]
    assert {r.batch_id for r in results} == {winner.batch_id}


async def test_a_completed_claim_answers_every_repeat_with_its_response(
    side: AccountSide,
) -> None:
    store = side.idempotency()
    user, key, batch = uuid.uuid4(), unique("done"), uuid.uuid1()
    await store.claim(user, key, BODY, batch, uuid.uuid4())

    await store.complete(user, key, b'{"batch_id": "first"}')

    for _ in range(2):
        repeat = await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())
        assert isinstance(repeat, Existing)
        assert (repeat.batch_id, repeat.response) == (batch, b'{"batch_id": "first"}')


async def test_completing_an_unclaimed_key_claims_nothing(side: AccountSide) -> None:
    store = side.idempotency()
    user, key, batch = uuid.uuid4(), unique("never"), uuid.uuid1()

    await store.complete(user, key, b"{}")

    assert await store.claim(user, key, BODY, batch, uuid.uuid4()) == Claimed(batch)


async def test_an_expired_lease_is_taken_over_by_one_new_owner(side: AccountSide) -> None:
    store = side.idempotency(lease=0.0)
    user, key, batch, first = uuid.uuid4(), unique("stale"), uuid.uuid1(), uuid.uuid4()
    await store.claim(user, key, BODY, batch, first)
    stale = await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())
    assert isinstance(stale, Existing) and stale.expired(datetime.now(UTC))
    owners = [uuid.uuid4() for _ in range(5)]

    won = await asyncio.gather(*(store.take_over(user, key, stale, o) for o in owners))

    assert won.count(True) == 1
    now_held = await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())
    assert isinstance(now_held, Existing)
    assert now_held.owner == owners[won.index(True)] and now_held.batch_id == batch
    assert await store.take_over(user, key, stale, uuid.uuid4()) is False  # stale view


async def test_a_completed_claim_cannot_be_taken_over(side: AccountSide) -> None:
    store = side.idempotency(lease=0.0)
    user, key = uuid.uuid4(), unique("final")
    await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())
    await store.complete(user, key, b"{}")
    stale = await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())
    assert isinstance(stale, Existing)

    assert await store.take_over(user, key, stale, uuid.uuid4()) is False


async def test_taking_over_a_released_key_fails(side: AccountSide) -> None:
    store = side.idempotency(lease=0.0)
    user, key, owner = uuid.uuid4(), unique("gone"), uuid.uuid4()
    await store.claim(user, key, BODY, uuid.uuid1(), owner)
    stale = await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())
    assert isinstance(stale, Existing)
    await store.release(user, key, owner)

    assert await store.take_over(user, key, stale, uuid.uuid4()) is False


async def test_its_owner_releasing_a_claim_frees_the_key(side: AccountSide) -> None:
    store = side.idempotency()
    user, key, owner = uuid.uuid4(), unique("free"), uuid.uuid4()
    await store.claim(user, key, BODY, uuid.uuid1(), owner)

    await store.release(user, key, owner)

    fresh = uuid.uuid1()
    assert await store.claim(user, key, OTHER_BODY, fresh, uuid.uuid4()) == Claimed(fresh)


async def test_only_the_current_owner_can_release_a_claim(side: AccountSide) -> None:
    """Neither a stranger nor a holder whose claim was taken over can free the key."""
    store = side.idempotency(lease=0.0)
    user, key, first, second = uuid.uuid4(), unique("held"), uuid.uuid4(), uuid.uuid4()
    batch = uuid.uuid1()
    await store.claim(user, key, BODY, batch, first)
    stale = await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())
    assert isinstance(stale, Existing)
    assert await store.take_over(user, key, stale, second)

    await store.release(user, key, uuid.uuid4())
    await store.release(user, key, first)

    held = await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())
    assert isinstance(held, Existing) and (held.owner, held.batch_id) == (second, batch)


async def test_a_key_is_free_again_once_its_claim_has_expired(side: AccountSide) -> None:
    """Claims live a day (the table's TTL): then the key may name a new batch."""
    store = side.idempotency()
    user, key = uuid.uuid4(), unique("day")
    await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())
    await side.claimed_long_ago(user, key, remaining=2)

    await side.wait(3)

    fresh = uuid.uuid1()
    assert await store.claim(user, key, OTHER_BODY, fresh, uuid.uuid4()) == Claimed(fresh)


async def test_a_taken_over_key_is_free_again_once_its_claim_has_expired(
    side: AccountSide,
) -> None:
    store = side.idempotency(lease=0.0)
    user, key = uuid.uuid4(), unique("ghost")
    await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())
    await side.claimed_long_ago(user, key, remaining=2)
    stale = await store.claim(user, key, BODY, uuid.uuid1(), uuid.uuid4())
    assert isinstance(stale, Existing)
    assert await store.take_over(user, key, stale, uuid.uuid4())

    await side.wait(3)

    fresh = uuid.uuid1()
    assert await store.claim(user, key, BODY, fresh, uuid.uuid4()) == Claimed(fresh)


# -- suppressions --------------------------------------------------------------------------


async def test_a_suppression_is_listed_with_its_reason_source_event_and_time(
    side: AccountSide,
) -> None:
    user = uuid.uuid4()
    at = datetime(2025, 3, 4, 5, 6, 7, 891_234, tzinfo=UTC)
    await side.suppressions.add(
        user, "Ann@Example.org", reason="bounce", source="sg", event_id="ev-1", at=at
    )
    await side.suppressions.add(user, "bob@example.org", reason="manual", source="api")

    rows = await side.suppressions.page(user, 10, None)

    assert rows[0] == {
        "email": "ann@example.org",
        "reason": "bounce",
        "source": "sg",
        "event_id": "ev-1",
        "created_at": at.replace(tzinfo=None, microsecond=891_000),  # naive UTC, in ms
        "by_recipient": None,
    }
    assert (rows[1]["email"], rows[1]["event_id"]) == ("bob@example.org", "")
    assert _near_now(rows[1]["created_at"]) and len(rows) == 2


async def test_suppressing_again_keeps_one_entry_with_the_newest_reason(
    side: AccountSide,
) -> None:
    user = uuid.uuid4()
    await side.suppressions.add(user, "ann@example.org", reason="bounce", source="sg")

    await side.suppressions.add(user, "ANN@example.ORG", reason="complaint", source="mg")

    rows = await side.suppressions.page(user, 10, None)
    assert [(r["email"], r["reason"], r["source"]) for r in rows] == [
        ("ann@example.org", "complaint", "mg")
    ]


async def test_removal_ignores_case_and_says_whether_the_address_was_listed(
    side: AccountSide,
) -> None:
    user = uuid.uuid4()
    await side.suppressions.add(user, "ann@example.org", reason="bounce", source="sg")

    assert await side.suppressions.remove(user, "ANN@Example.Org") is True
    assert await side.suppressions.remove(user, "ann@example.org") is False
    assert await side.suppressions.suppressed(user, ["ann@example.org"]) == {}
    assert await side.suppressions.remove(user, "never@example.org") is False


@pytest.mark.parametrize("scope", [None, "news"])
async def test_a_recipients_mark_survives_later_writes_without_one(
    side: AccountSide, scope: str | None
) -> None:
    """An unsubscribe's ``by_recipient`` stays through a sender's own write and a bounce
    (neither may turn the entry into one the sender can lift)."""
    user = uuid.uuid4()
    await side.suppressions.add(
        user,
        "ann@example.org",
        reason="unsubscribe",
        source="sg",
        scope=scope,
        by_recipient="unsubscribed",
    )
    await side.suppressions.add(user, "ann@example.org", reason="manual", source="api", scope=scope)
    await side.suppressions.add(user, "ann@example.org", reason="bounce", source="mg", scope=scope)

    found = await side.suppressions.entry(user, "ANN@example.org", scope)
    (listed,) = await side.suppressions.page(user, 10, None, scope)

    assert found is not None
    assert (found["reason"], found["source"], found["by_recipient"]) == (
        "bounce",
        "mg",
        "unsubscribed",
    )
    assert listed["by_recipient"] == "unsubscribed"
    assert await side.suppressions.entry(user, "bob@example.org", scope) is None


@pytest.mark.parametrize("scope", [None, "news"])
async def test_forgetting_the_version_read_deletes_it_but_not_a_newer_write(
    side: AccountSide, scope: str | None
) -> None:
    """A delete of what was read leaves a write made after the read (an unsubscribe landing
    between a sender's check and their delete) in place, mark and all."""
    user = uuid.uuid4()
    await side.suppressions.add(user, "ann@example.org", reason="manual", source="api", scope=scope)
    await side.suppressions.add(user, "bob@example.org", reason="manual", source="api", scope=scope)
    ann = await side.suppressions.entry(user, "ann@example.org", scope)
    bob = await side.suppressions.entry(user, "bob@example.org", scope)
    assert ann is not None and bob is not None
    await side.suppressions.add(
        user,
        "ann@example.org",
        reason="unsubscribe",
        source="tracking",
        scope=scope,
        by_recipient="unsubscribed",
    )

    await side.suppressions.forget(user, "ann@example.org", scope, version=ann["version"])
    await side.suppressions.forget(user, "bob@example.org", scope, version=bob["version"])

    kept = await side.suppressions.entry(user, "ann@example.org", scope)
    assert kept is not None and kept["by_recipient"] == "unsubscribed"
    assert kept["version"] > ann["version"]
    assert await side.suppressions.entry(user, "bob@example.org", scope) is None


async def test_a_suppression_list_belongs_to_one_user(side: AccountSide) -> None:
    ann, bob = uuid.uuid4(), uuid.uuid4()
    await side.suppressions.add(ann, "x@example.org", reason="bounce", source="sg")

    assert await side.suppressions.suppressed(bob, ["x@example.org"]) == {}
    assert await side.suppressions.page(bob, 10, None) == []
    assert await side.suppressions.remove(bob, "x@example.org") is False
    assert await side.suppressions.suppressed(ann, ["x@example.org"]) == {"x@example.org": "bounce"}


async def test_lookups_find_listed_addresses_across_query_chunks(side: AccountSide) -> None:
    user = uuid.uuid4()
    wanted = [f"r{i:04d}@example.org" for i in range(LOOKUP_CHUNK * 2 + 50)]
    listed = {wanted[0], wanted[LOOKUP_CHUNK + 1], wanted[-1]}
    for email in listed:
        await side.suppressions.add(user, email, reason=f"why {email}", source="api")

    found = await side.suppressions.suppressed(user, [e.upper() for e in wanted] + wanted)

    assert found == {e: f"why {e}" for e in listed}
    assert await side.suppressions.suppressed(user, []) == {}


async def test_pages_walk_the_list_in_address_order(side: AccountSide) -> None:
    """Addresses are ordered by their UTF-8 bytes; ``after`` is exclusive."""
    user = uuid.uuid4()
    emails = ["émile@example.org", "bob@example.org", "Carl@example.org", "ann@example.org"]
    for email in emails:
        await side.suppressions.add(user, email, reason="manual", source="api")
    expected = ["ann@example.org", "bob@example.org", "carl@example.org", "émile@example.org"]

    seen: list[str] = []
    after: str | None = None
    while page := await side.suppressions.page(user, 3, after):
        seen += [r["email"] for r in page]
        after = page[-1]["email"]

    assert seen == expected
    assert [r["email"] for r in await side.suppressions.page(user, 2, "b")] == expected[1:3]


@pytest.mark.parametrize("scope", [None, "news"])
async def test_a_whole_list_is_read_at_once_when_it_holds_at_most_the_most_asked(
    side: AccountSide, scope: str | None
) -> None:
    """``listed`` gives every entry of the list (or of ``scope``'s) with its reason, and an
    empty list as empty; another user's entries, or the other list's, are not in it."""
    user = uuid.uuid4()
    await side.suppressions.add(user, "Ann@example.org", reason="bounce", source="sg", scope=scope)
    await side.suppressions.add(user, "bob@example.org", reason="manual", source="api", scope=scope)
    await side.suppressions.add(user, "carl@example.org", reason="x", source="t", scope="other")
    await side.suppressions.add(
        uuid.uuid4(), "dan@example.org", reason="x", source="t", scope=scope
    )

    listed = await side.suppressions.listed(user, 2, scope)

    assert listed == {"ann@example.org": "bounce", "bob@example.org": "manual"}
    assert await side.suppressions.listed(uuid.uuid4(), 2, scope) == {}


async def test_a_list_longer_than_the_most_asked_is_not_read_whole(side: AccountSide) -> None:
    """``listed`` answers None for a list of more than ``most`` entries (the caller looks its
    addresses up instead)."""
    user = uuid.uuid4()
    for i in range(4):
        await side.suppressions.add(user, f"r{i}@example.org", reason="bounce", source="sg")

    assert await side.suppressions.listed(user, 3) is None
    assert await side.suppressions.listed(user, 4) is not None
