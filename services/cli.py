"""The ``safedelivr`` command line: run a service, migrate, declare topology, manage keys.

Each subcommand loads and validates the settings first, so a bad variable stops the process
with a message naming it before anything connects. Service modules are imported lazily so
that ``safedelivr migrate`` does not pay for (or depend on) the web stack.

``safedelivr api|webhooks|tracking|consumers|hooks|submission --workers N`` (or ``auto``: one
per core) runs N worker processes under uvicorn's supervisor, which restarts a worker that
dies; each worker is a fresh interpreter that builds its app through :func:`api_app` and its
siblings.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from services import usercli
from shared.accounts.apikeys import SCOPES
from shared.core.errors import ConfigError, DependencyUnavailable
from shared.infra.config import Settings, load_settings
from shared.infra.logs import configure_logging


def _create(command: str, settings: Settings) -> Any:
    """The ASGI app of one served process."""
    if command == "api":
        from services.api.app import create_app as api

        return api(settings)
    if command == "webhooks":
        from services.webhooks.app import create_app as webhooks

        return webhooks(settings)
    if command == "tracking":
        from services.tracking.app import create_app as tracking

        return tracking(settings)
    if command == "consumers":
        from services.consumers.main import create_app as consumers

        return consumers(settings)
    if command == "hooks":
        from services.hooks.main import create_app as hooks

        return hooks(settings)
    if command == "submission":
        from services.submission.main import create_app as submission

        return submission(settings)
    try:
        # A development tool, kept out of the wheel: only a source checkout has it.
        from sandbox.app import create_app as sandbox
    except ModuleNotFoundError as exc:
        raise ConfigError(
            "the sandbox (stand-ins for SendGrid, Mailgun and GitHub) is a development tool: "
            "run it from a source checkout"
        ) from exc
    return sandbox(settings.sandbox)


def _served(command: str, settings: Settings) -> Any:
    """The app a service process serves: settled once started, and held to its memory
    limit (``SAFEDELIVR_<SERVICE>_MEMORY_MAX_MB``; the sandbox, a test double, has none)."""
    from shared.infra.heap import settle_when_started
    from shared.infra.memory_guard import MemoryGuard, guarded

    app = settle_when_started(_create(command, settings))
    if command == "sandbox":
        return app
    limit: int = getattr(settings, command).memory_max_mb
    return guarded(app, MemoryGuard(limit))


def _worker_app(command: str) -> Any:
    """The app of one uvicorn worker process: settings and logging are its own to set up."""
    from shared.infra.gil import shorten_switch_interval
    from shared.infra.heap import tune_malloc

    tune_malloc()
    shorten_switch_interval()
    settings = load_settings()
    configure_logging(settings.log_level, service=command, fmt=settings.log_format)
    return _served(command, settings)


def api_app() -> Any:
    return _worker_app("api")


def webhooks_app() -> Any:
    return _worker_app("webhooks")


def consumers_app() -> Any:
    return _worker_app("consumers")


def tracking_app() -> Any:
    return _worker_app("tracking")


def hooks_app() -> Any:
    return _worker_app("hooks")


def submission_app() -> Any:
    return _worker_app("submission")


def _serve(command: str, settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from shared.infra.gil import shorten_switch_interval
    from shared.infra.heap import tune_malloc

    tune_malloc()
    shorten_switch_interval()

    host, port = {
        "api": (settings.api.host, settings.api.port),
        "webhooks": (settings.webhooks.host, settings.webhooks.port),
        "tracking": (settings.tracking.host, settings.tracking.port),
        "consumers": (settings.consumers.host, settings.consumers.port),
        "hooks": (settings.hooks.host, settings.hooks.port),
        "submission": (settings.submission.host, settings.submission.port),
        "sandbox": (settings.sandbox.host, settings.sandbox.port),
    }[command]
    options: dict[str, Any] = {
        "host": host,
        "port": args.port or port,
        "log_level": settings.log_level.lower(),
        "access_log": False,
        "loop": "uvloop",
        "http": "httptools",
        "lifespan": "on",
        "timeout_graceful_shutdown": 10,
    }
    workers: int = getattr(args, "workers", 1)
    if workers == 1:
        uvicorn.run(_served(command, settings), **options)
        return 0
    return _supervise(f"services.cli:{command}_app", workers, options)


def _supervise(factory: str, workers: int, options: dict[str, Any]) -> int:
    """Run ``workers`` worker processes under uvicorn's supervisor (as ``uvicorn.run`` does),
    and exit with uvicorn's start-up failure status when a worker could not start: the
    supervisor then stops them all but returns as if nothing happened."""
    from uvicorn import Config
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors.multiprocess import Multiprocess

    config = Config(factory, factory=True, workers=workers, **options)
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    failed = any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes)
    return STARTUP_FAILURE if failed else 0


def cmd_api(settings: Settings, args: argparse.Namespace) -> int:
    return _serve("api", settings, args)


def cmd_webhooks(settings: Settings, args: argparse.Namespace) -> int:
    return _serve("webhooks", settings, args)


def cmd_tracking(settings: Settings, args: argparse.Namespace) -> int:
    return _serve("tracking", settings, args)


def cmd_sandbox(settings: Settings, args: argparse.Namespace) -> int:
    return _serve("sandbox", settings, args)


def cmd_consumers(settings: Settings, args: argparse.Namespace) -> int:
    return _serve("consumers", settings, args)


def cmd_hooks(settings: Settings, args: argparse.Namespace) -> int:
    return _serve("hooks", settings, args)


def cmd_submission(settings: Settings, args: argparse.Namespace) -> int:
    return _serve("submission", settings, args)


def _workers(value: str) -> int:
    """``--workers``: a positive count, or ``auto`` for one per core this process may use."""
    if value == "auto":
        return len(os.sched_getaffinity(0)) or 1
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number or 'auto'") from None
    if count < 1:
        raise argparse.ArgumentTypeError("at least 1 worker")
    return count


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from shared.accounts.domains import DomainStore
    from shared.delivery.stats import StatsStore
    from shared.infra.db import Database
    from shared.infra.migrations import fix_layout, migrate
    from shared.ops.upgrade import upgrade

    async def go() -> int:
        applied = await migrate(settings.cassandra)
        ks = settings.cassandra.keyspace
        print(f"keyspace {ks}: applied {applied}" if applied else f"keyspace {ks}: up to date")
        db = await Database.connect(settings.cassandra, keyspace=ks)
        try:
            await fix_layout(db, settings.stats.buckets)
            report = await upgrade(db, StatsStore(db, settings.stats.buckets))
            # Domains added before domain_claims existed (idempotent, like the rest).
            claims = await DomainStore(db).index_all()
        finally:
            await db.close()
        print(
            f"data model v2: {report.upgraded} batch(es) upgraded ({report.recipients} "
            f"recipients), {report.already} already v2, {report.kept_v1} kept in the v1 layout; "
            f"{report.outbox_moved} outbox row(s) moved; {claims} sending domain(s) indexed"
        )
        return 0

    return asyncio.run(go())


def cmd_topology(settings: Settings, args: argparse.Namespace) -> int:
    from shared.infra.resources import declare_topology

    t = asyncio.run(declare_topology(settings))
    print(f"exchange {t.exchange}: {len(t.queues())} queues declared")
    return 0


def cmd_keys_create(settings: Settings, args: argparse.Namespace) -> int:
    from shared.accounts.accounts import create_key_for_login
    from shared.accounts.apikeys import DEFAULT_SCOPES

    key = asyncio.run(
        create_key_for_login(
            settings,
            args.user,
            name=args.name,
            scopes=sorted(
                set(args.scope or DEFAULT_SCOPES) | ({"operator"} if args.operator else set())
            ),
            expires_at=(
                dt.datetime.now(dt.UTC) + dt.timedelta(days=args.expires_days)
                if args.expires_days
                else None
            ),
        )
    )
    print(key)
    return 0


def _day(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD, not {value!r}") from None


def _user(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a user id (UUID), not {value!r}") from None


def cmd_stats_reconcile(settings: Settings, args: argparse.Namespace) -> int:
    from shared.infra.db import Database
    from shared.ops.reconcile import reconcile_day

    day: dt.date = args.day
    users = [args.user] if args.user else None

    async def go() -> int:
        db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
        try:
            drifts = await reconcile_day(
                db, day, fix=args.fix, users=users, buckets=settings.stats.buckets
            )
        finally:
            await db.close()
        for d in drifts:
            print(
                f"drift user={d.user_id} bucket={d.bucket}: rollup {d.stored}, "
                f"outcome rows {d.counted}"
            )
        verb = "repaired" if args.fix else "found"
        print(
            f"{day}: {len(drifts)} drifting bucket(s) {verb}"
            if drifts
            else f"{day}: every rollup agrees with its outcome rows"
        )
        return 1 if drifts and not args.fix else 0

    return asyncio.run(go())


def cmd_check(settings: Settings, args: argparse.Namespace) -> int:
    from shared.infra.db import Database
    from shared.ops.check import KINDS, check_day

    # Longer than every window a recipient may rightly wait in: the resolution of an
    # ambiguous call by webhooks (or the query API), or a deferral until it is handed over;
    # plus the last retry's delay and ten minutes.
    p = settings.providers
    windows = max(p.webhook_window + p.query_after, settings.webhooks.deferred_deadline)
    default_settle = windows + max(p.backoff_tiers, default=0) + 600
    settle = dt.timedelta(
        seconds=default_settle if args.settle_after is None else args.settle_after
    )

    async def go() -> int:
        db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
        try:
            found = await check_day(
                db,
                args.day,
                now=dt.datetime.now(dt.UTC),
                settle_after=settle,
                users=[args.user] if args.user else None,
                buckets=settings.stats.buckets,
            )
        finally:
            await db.close()
        for v in found[: args.limit]:
            print(v.line())
        counts = {k: sum(v.kind == k for v in found) for k in KINDS}
        summary = ", ".join(f"{k} {n}" for k, n in counts.items())
        print(f"{args.day}: {len(found)} violation(s): {summary}")
        return 1 if found else 0

    return asyncio.run(go())


def cmd_dead(settings: Settings, args: argparse.Namespace) -> int:
    from shared.infra.broker import Broker
    from shared.infra.db import Database
    from shared.infra.resources import topology_for
    from shared.ops.deadletters import DeadLetters, DeadLetterStore, ReplayRefused, line

    async def go() -> int:
        db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
        try:
            store = DeadLetterStore(db)
            if args.dead_command == "list":
                found = await store.page(args.limit)
                for letter in found:
                    print(line(letter))
                print(f"{len(found)} dead letter(s)")
                return 0
            if args.dead_command == "delete":
                missing = [i for i in args.ids if not await store.delete(i)]
                for letter_id in missing:
                    print(f"safedelivr dead: no dead letter {letter_id}", file=sys.stderr)
                print(f"{len(args.ids) - len(missing)} dead letter(s) deleted")
                return 1 if missing else 0
            ids = list(args.ids)
            if args.all:
                ids += [x.id for x in await store.page(args.limit) if x.state == "waiting"]
            if not ids:
                print("safedelivr dead replay: name letter ids, or --all", file=sys.stderr)
                return 2
            broker = Broker(
                settings.amqp.url.get_secret_value(), topology_for(settings), name="safedelivr-dead"
            )
            await broker.connect()
            failed = 0
            try:
                replayer = DeadLetters(store, broker)
                for letter_id in ids:
                    try:
                        print(line(await replayer.replay(letter_id)))
                    except ReplayRefused as exc:
                        failed += 1
                        print(f"safedelivr dead: {letter_id}: {exc.message}", file=sys.stderr)
            finally:
                await broker.close()
            print(f"{len(ids) - failed} dead letter(s) replayed")
            return 1 if failed else 0
        finally:
            await db.close()

    return asyncio.run(go())


def cmd_settings(settings: Settings, args: argparse.Namespace) -> int:
    import getpass

    from shared.infra.broker import Broker
    from shared.infra.db import Database
    from shared.infra.resources import topology_for
    from shared.ops.livesettings import SettingsError, SettingsStore, announce, check, defaults

    async def go() -> int:
        db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
        try:
            store = SettingsStore(db, settings.amqp.exchange)
            if args.settings_command == "get":
                stored = await store.stored()
                for name, value in sorted({**defaults(settings.providers), **stored}.items()):
                    origin = "live" if name in stored else "environment"
                    print(f"{name}={value}\t({origin})")
                for change in await store.audit(10):
                    print(
                        f"changed {change.at:%Y-%m-%d %H:%M:%S}Z by {change.by}: "
                        f"{change.name} {change.old or '-'} -> {change.new}"
                    )
                return 0
            try:
                value = check(args.name, args.value)
            except SettingsError as exc:
                print(f"safedelivr settings: {exc}", file=sys.stderr)
                return 2
            done = await store.change({args.name: value}, by=f"cli:{getpass.getuser()}")
            if done:
                broker = Broker(
                    settings.amqp.url.get_secret_value(),
                    topology_for(settings),
                    name="safedelivr-settings",
                )
                await broker.connect()
                try:
                    await announce(broker, done)
                finally:
                    await broker.close()
            print(f"{args.name}={value}" + ("" if done else " (unchanged)"))
            return 0
        finally:
            await db.close()

    return asyncio.run(go())


def cmd_signups(settings: Settings, args: argparse.Namespace) -> int:
    import getpass

    from shared.accounts.signup import RequestState, SignupRequests
    from shared.infra.db import Database

    async def go() -> int:
        db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
        try:
            requests = SignupRequests(db)
            if args.signups_command == "list":
                waiting = await requests.all()
                for r in waiting:
                    print(
                        f"{r.github_id}\t{r.login}\t{r.state}\t{r.email or '-'}\t"
                        f"{r.requested_at:%Y-%m-%d %H:%M}Z\t{r.name or ''}"
                    )
                print(f"{len(waiting)} sign-up request(s) (policy: {settings.signup_policy})")
                return 0
            state: RequestState = "approved" if args.signups_command == "approve" else "refused"
            account: str = args.account
            if not account.isascii() or not account.isdecimal():
                # By id only: two requests may carry one login (one renamed after asking).
                ids = [str(r.github_id) for r in await requests.all() if r.login == account]
                hint = f": its request's id is {', '.join(ids)}" if ids else ""
                print(
                    f"safedelivr signups: name the request by its GitHub id (the first column "
                    f"of `safedelivr signups list`), not by login{hint}",
                    file=sys.stderr,
                )
                return 2
            if not await requests.answer(int(account), state, f"cli:{getpass.getuser()}"):
                print(f"safedelivr signups: no sign-up request from {account}", file=sys.stderr)
                return 1
            print(f"{account}: {state}" + (" (they can log in now)" if state == "approved" else ""))
            return 0
        finally:
            await db.close()

    return asyncio.run(go())


def cmd_dev(settings: Settings, args: argparse.Namespace) -> int:
    from services.devrun import run

    return run(settings)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="safedelivr", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, help_ in [
        ("api", cmd_api, "run the HTTP API and dashboard"),
        ("webhooks", cmd_webhooks, "run the provider webhook receiver"),
        ("tracking", cmd_tracking, "run the tracking endpoint (opens, clicks, unsubscribe)"),
        ("consumers", cmd_consumers, "run the RabbitMQ consumers"),
        ("hooks", cmd_hooks, "run the delivery worker of users' webhooks"),
        ("submission", cmd_submission, "run the SMTP submission server (mail in over SMTP)"),
        ("sandbox", cmd_sandbox, "run the local SendGrid/Mailgun/GitHub stand-ins"),
    ]:
        p = sub.add_parser(name, help=help_)
        p.add_argument("--port", type=int, default=None, help="override the configured port")
        if name != "sandbox":
            p.add_argument(
                "--workers",
                type=_workers,
                default=1,
                help="worker processes, or 'auto' for one per core (default 1)",
            )
        p.set_defaults(func=func)
    sub.add_parser("migrate", help="apply CQL migrations").set_defaults(func=cmd_migrate)
    sub.add_parser("topology", help="declare exchanges and queues").set_defaults(func=cmd_topology)
    sub.add_parser("dev", help="run every service locally (make run)").set_defaults(func=cmd_dev)
    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(
        dest="keys_command", required=True
    )
    create = keys.add_parser("create", help="create an API key (shown once)")
    create.add_argument("--user", required=True, help="the user's login; created if missing")
    create.add_argument("--name", default="cli", help="a label for the key")
    create.add_argument(
        "--scope",
        action="append",
        choices=SCOPES,
        help="what the key may do (repeat it; default: send, read and keys)",
    )
    create.add_argument(
        "--operator",
        action="store_true",
        help="add the operator scope: the operator routes (/v1/dead-letters)",
    )
    create.add_argument(
        "--expires-days", type=int, default=0, help="days until the key expires (default never)"
    )
    create.set_defaults(func=cmd_keys_create)
    dead = sub.add_parser("dead", help="list, replay or delete dead letters")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True)
    dead_list = dead_sub.add_parser("list", help="show the archived dead letters, newest first")
    dead_list.add_argument("--limit", type=int, default=100)
    dead_list.set_defaults(func=cmd_dead)
    replay = dead_sub.add_parser("replay", help="publish letters again (each at most once)")
    replay.add_argument("ids", nargs="*", help="letter ids, from `dead list`")
    replay.add_argument("--all", action="store_true", help="every waiting letter")
    replay.add_argument("--limit", type=int, default=100, help="at most this many with --all")
    replay.set_defaults(func=cmd_dead)
    delete = dead_sub.add_parser("delete", help="delete letters for good")
    delete.add_argument("ids", nargs="+", help="letter ids, from `dead list`")
    delete.set_defaults(func=cmd_dead)
    live = sub.add_parser(
        "settings", help="the live settings: chain order, paused providers, attempts"
    ).add_subparsers(dest="settings_command", required=True)
    live.add_parser("get", help="every live setting and the latest changes").set_defaults(
        func=cmd_settings
    )
    change = live.add_parser("set", help="change one; every process applies it within 1 s")
    change.add_argument("name", help="providers.chain, providers.<code>.paused, ...")
    change.add_argument("value", help="e.g. mailgun,sendgrid or true")
    change.set_defaults(func=cmd_settings)
    signups = sub.add_parser(
        "signups", help="answer sign-up requests (SAFEDELIVR_SIGNUP=approval)"
    ).add_subparsers(dest="signups_command", required=True)
    signups.add_parser("list", help="show waiting and answered requests").set_defaults(
        func=cmd_signups
    )
    for name, help_ in (
        ("approve", "let this GitHub account sign up at its next login"),
        ("refuse", "keep this GitHub account out"),
    ):
        answer = signups.add_parser(name, help=help_)
        answer.add_argument(
            "account", help="the GitHub id of the account that asked (see `signups list`)"
        )
        answer.set_defaults(func=cmd_signups)
    stats_parser = sub.add_parser("stats", help="your daily stats (and `stats reconcile`)")
    stats = stats_parser.add_subparsers(dest="stats_command", required=False)
    reconcile = stats.add_parser("reconcile", help="recount a day's rollups from its outcome rows")
    reconcile.add_argument("--day", required=True, type=_day, help="UTC day, YYYY-MM-DD")
    reconcile.add_argument("--user", type=_user, help="only this user (id); default everyone")
    reconcile.add_argument("--fix", action="store_true", help="store the recounts as rollups")
    reconcile.set_defaults(func=cmd_stats_reconcile)
    check = sub.add_parser(
        "check",
        help="find violations of the delivery invariants in a day's stored data",
        description="Reports recipients never finished, sent twice or delivered yet shown "
        "failed, and stats that disagree with the logs. Exit status 1 when any is found.",
    )
    check.add_argument("--day", required=True, type=_day, help="UTC day, YYYY-MM-DD")
    check.add_argument("--user", type=_user, help="only this user (id); default everyone")
    check.add_argument(
        "--settle-after",
        type=int,
        default=None,
        help="seconds after acceptance a recipient must be final (default: the longest window of "
        "the providers and webhooks settings, plus ten minutes)",
    )
    check.add_argument("--limit", type=int, default=1000, help="most violations printed")
    check.set_defaults(func=cmd_check)
    usercli.add_commands(sub, stats_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"safedelivr: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, service=args.command, fmt=settings.log_format)
    func: Callable[[Settings, argparse.Namespace], int] = args.func
    try:
        return func(settings, args)
    except DependencyUnavailable as exc:
        print(f"safedelivr {args.command}: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
