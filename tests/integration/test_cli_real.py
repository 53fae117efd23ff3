"""The operator commands of ``safedelivr`` (services/cli.py) and ``make run``'s set-up
(services/devrun.py) against the real Cassandra and RabbitMQ: what each prints, its exit
status, and what it leaves in the stores. Each test has its own user, batch and topology."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from services import cli, devrun
from shared.accounts import accounts
from shared.delivery.batchstore import BatchStore
from shared.delivery.recipients import log_id_for
from shared.delivery.stats import batch_day
from shared.infra.broker import Broker
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.infra.resources import topology_for
from shared.infra.topology import dispatch_key
from shared.ops.deadletters import DeadLetterStore, Letter, letter_of
from shared.ops.livesettings import SettingsStore
from tests.conftest import unique
from tests.fakes.world import new_batch
from tests.integration.test_reconcile import _delivered_batch, corrupt_rollup

#: A command function as ``main`` calls it.
Command = Callable[[Settings, object], int]

_UUID_EPOCH = 0x01B21DD213814000


def _time_uuid(at: dt.datetime) -> uuid.UUID:
    """A version-1 id whose time is ``at``: a batch accepted then."""
    ticks = int(at.timestamp() * 10_000_000) + _UUID_EPOCH
    seq = random.getrandbits(14)
    return uuid.UUID(
        fields=(
            ticks & 0xFFFFFFFF,
            (ticks >> 32) & 0xFFFF,
            ((ticks >> 48) & 0x0FFF) | 0x1000,
            0x80 | (seq >> 8),
            seq & 0xFF,
            random.getrandbits(48),
        )
    )


async def _run(settings: Settings, *argv: str) -> int:
    """Run one command as ``main`` would after loading settings (off the event loop)."""
    args = cli.build_parser().parse_args(list(argv))
    command: Command = args.func
    return await asyncio.to_thread(command, settings, args)


async def _queued_batch(db: Database, minutes_ago: int) -> tuple[uuid.UUID, uuid.UUID]:
    """A user whose one-recipient batch was accepted ``minutes_ago`` and is still queued."""
    user_id = await accounts.ensure_user(db, unique("chk"))
    batch_id = _time_uuid(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes_ago))
    batch = new_batch(f"{unique('q')}@example.org", batch_id=batch_id, user_id=user_id)
    store = BatchStore(db)
    await store.write(batch)
    await store.index(batch)
    return user_id, batch_id


@pytest.fixture
async def declared(settings: Settings) -> AsyncIterator[Broker]:
    """The test's private topology, declared, with a broker on it."""
    broker = Broker(settings.amqp.url.get_secret_value(), topology_for(settings), name="cli")
    await broker.connect()
    await broker.declare()
    try:
        yield broker
    finally:
        await broker.close()


async def test_migrate_on_a_current_keyspace_applies_nothing(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second ``migrate`` says the keyspace is up to date and reports the data model."""
    code = await _run(settings, "migrate")

    first, second = capsys.readouterr().out.splitlines()
    assert code == 0
    assert first == f"keyspace {settings.cassandra.keyspace}: up to date"
    assert second.startswith("data model v2: ")


async def test_topology_declares_every_queue_it_counts(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printed count is the topology's queues, and each of them now exists."""
    expected = topology_for(settings)

    code = await _run(settings, "topology")

    assert code == 0
    out = capsys.readouterr().out
    assert out == f"exchange {expected.exchange}: {len(expected.queues())} queues declared\n"
    broker = Broker(settings.amqp.url.get_secret_value(), expected, name="verify")
    await broker.connect()
    try:
        depths = [await broker.queue_depth(q.name) for q in expected.queues()]
    finally:
        await broker.close()
    assert depths == [0] * len(expected.queues())


async def test_keys_create_prints_a_working_key_for_the_login(
    settings: Settings, db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each run prints a new key; both authenticate as the one user of that login."""
    login = unique("ops")

    assert await _run(settings, "keys", "create", "--user", login) == 0
    assert await _run(settings, "keys", "create", "--user", login, "--name", "ci") == 0

    first, second = capsys.readouterr().out.split()
    records = [await accounts.authenticate(db, key) for key in (first, second)]
    user_id = await accounts.ensure_user(db, login)
    assert first != second
    assert [(r.user_id, r.name) for r in records if r] == [(user_id, "cli"), (user_id, "ci")]


async def test_reconcile_reports_drift_exits_1_and_fix_repairs_it(
    settings: Settings, db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found drift fails the command until ``--fix`` stores the recount; then all agree."""
    user_id, batch = await _delivered_batch(db)
    log_id = log_id_for(batch.batch_id, "a@example.org")
    bucket = await corrupt_rollup(db, user_id, batch.batch_id, log_id)
    day = batch_day(batch.batch_id).isoformat()
    scope = ["stats", "reconcile", "--day", day, "--user", str(user_id)]

    found = await _run(settings, *scope)
    fixed = await _run(settings, *scope, "--fix")
    after = await _run(settings, *scope)

    lines = capsys.readouterr().out.splitlines()
    assert (found, fixed, after) == (1, 0, 0)
    assert lines[0].startswith(f"drift user={user_id} bucket={bucket}: rollup ")
    assert lines[1] == f"{day}: 1 drifting bucket(s) found"
    assert lines[3] == f"{day}: 1 drifting bucket(s) repaired"
    assert lines[4] == f"{day}: every rollup agrees with its outcome rows"


async def test_check_reports_a_recipient_queued_past_the_settle_time(
    settings: Settings, db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """Queued 20 minutes with a 10-minute settle time is a violation: listed, status 1."""
    user_id, batch_id = await _queued_batch(db, minutes_ago=20)
    day = batch_day(batch_id).isoformat()

    code = await _run(
        settings, "check", "--day", day, "--user", str(user_id), "--settle-after", "600"
    )

    violation, summary = capsys.readouterr().out.splitlines()
    assert code == 1
    assert violation.startswith(f"not_final user={user_id} batch={batch_id} q_")
    assert (
        summary
        == f"{day}: 1 violation(s): not_final 1, sent_twice 0, delivered_but_failed 0, stats 0"
    )


async def test_check_leaves_a_recipient_within_its_settle_time_alone(
    settings: Settings, db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same queued recipient with an hour to settle is no violation: status 0."""
    user_id, batch_id = await _queued_batch(db, minutes_ago=20)
    day = batch_day(batch_id).isoformat()

    code = await _run(
        settings, "check", "--day", day, "--user", str(user_id), "--settle-after", "3600"
    )

    assert code == 0
    assert (
        capsys.readouterr().out
        == f"{day}: 0 violation(s): "
        + ", ".join(
            f"{kind} 0" for kind in ("not_final", "sent_twice", "delivered_but_failed", "stats")
        )
        + "\n"
    )


async def test_check_limit_caps_the_lines_not_the_count(
    settings: Settings, db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--limit 0`` prints only the summary, which still counts every violation."""
    user_id, batch_id = await _queued_batch(db, minutes_ago=20)
    day = batch_day(batch_id).isoformat()

    code = await _run(
        settings, "check", "--day", day, "--user", str(user_id), "--settle-after", "60",
        "--limit", "0",
    )  # fmt: skip

    assert code == 1
    assert capsys.readouterr().out.startswith(f"{day}: 1 violation(s): not_final 1,")


async def test_check_with_settle_after_zero_wants_every_recipient_final(
    settings: Settings, db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--settle-after 0``: any recipient still queued is a violation."""
    user_id, batch_id = await _queued_batch(db, minutes_ago=20)
    day = batch_day(batch_id).isoformat()

    code = await _run(
        settings, "check", "--day", day, "--user", str(user_id), "--settle-after", "0"
    )

    assert code == 1
    assert "not_final 1" in capsys.readouterr().out


async def _archived_letter(db: Database) -> Letter:
    """A dead letter as the consumers archive it (a rejected dispatch to Mailgun)."""
    death = {"reason": "rejected", "queue": "t.mg", "count": 1, "time": dt.datetime.now(dt.UTC)}
    key = dispatch_key("mg", uuid.uuid1())
    letter = letter_of(key, None, {"x-death": [death]}, b"stuck", dt.datetime.now(dt.UTC))
    assert await DeadLetterStore(db).archive(letter)
    return letter


async def test_dead_list_replay_and_delete_print_each_letter_and_what_was_done(
    settings: Settings, declared: Broker, db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """list shows the letter by id; replay publishes it (once: a second replay fails, exit
    1); delete removes it."""
    letter = await _archived_letter(db)

    listed = await _run(settings, "dead", "list", "--limit", "500")
    list_out = capsys.readouterr().out
    replayed = await _run(settings, "dead", "replay", letter.id)
    replay_out = capsys.readouterr().out.splitlines()
    again = await _run(settings, "dead", "replay", letter.id)
    again_err = capsys.readouterr().err
    deleted = await _run(settings, "dead", "delete", letter.id)

    assert (listed, replayed, again, deleted) == (0, 0, 1, 0)
    assert f"{letter.id}  waiting  {letter.routing_key}  reason=rejected" in list_out
    assert replay_out[0].startswith(f"{letter.id}  replayed  ")
    assert replay_out[1] == "1 dead letter(s) replayed"
    assert "already replayed" in again_err
    message = await declared.get(declared.topology.provider_queue("mg"))
    assert message is not None and message.body == b"stuck"
    await message.ack()
    assert await DeadLetterStore(db).get(letter.id) is None


async def test_dead_replay_of_an_unknown_letter_names_it_and_exits_1(
    settings: Settings, declared: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await _run(settings, "dead", "replay", "1795000000000-" + "a" * 24) == 1
    assert "no such dead letter" in capsys.readouterr().err


async def test_make_run_setup_gives_the_sandbox_user_a_new_key_each_time(
    settings: Settings, db: Database
) -> None:
    """The demo key belongs to the fake GitHub's default user, so the dashboard shows it."""
    first = await asyncio.to_thread(devrun._setup, settings)
    second = await asyncio.to_thread(devrun._setup, settings)

    records = [await accounts.authenticate(db, key) for key in (first, second)]
    owners = {r.user_id for r in records if r}
    assert first != second
    assert len(owners) == 1
    profile = await accounts.get_user(db, owners.pop())
    assert profile is not None
    assert profile.login == "sandbox-user"


async def test_settings_set_stores_audits_and_get_shows_it(
    settings: Settings, declared: Broker, db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """``settings set`` changes a live setting for this deployment (audited as the CLI's);
    a bad value exits 2 and changes nothing."""
    assert await _run(settings, "settings", "set", "providers.sg.paused", "yes") == 0
    assert await _run(settings, "settings", "set", "providers.sg.paused", "maybe") == 2
    capsys.readouterr()
    assert await _run(settings, "settings", "get") == 0

    out = capsys.readouterr().out
    assert "providers.sg.paused=true\t(live)" in out
    (change,) = await SettingsStore(db, settings.amqp.exchange).audit()
    assert (change.name, change.new, change.by.startswith("cli:")) == (
        "providers.sg.paused",
        "true",
        True,
    )
