"""``make chaos``: the fault suite. Deterministic fault tests, then a soak under faults, then
the invariants checked over stored data and the providers' record of sends.

Usage: ``python -m chaos.run [--seconds 60] [--rate 4] [--recipients 50] [--providers sg,mg,ses]
[--soak-only]``

1. The deterministic tests (``tests/integration/test_exactly_once.py`` and its neighbours:
   kill -9 at each await of the send path, one job at two consumers, ambiguous calls,
   timed-out claims, acceptance crashes, webhook intake during outages) run first.
2. The soak: a private keyspace and exchange, the sandbox, the webhook service, two consumer
   processes and the API, each a real process; clients submit ``--rate`` batches a second of
   ``--recipients`` unique addresses for ``--seconds``, each retrying with its own
   ``Idempotency-Key`` until it is told its batch id, while ``chaos.faults`` kills every
   service with SIGKILL, restarts RabbitMQ, freezes Cassandra and makes the providers fail,
   time out or answer 5xx after accepting and reset connections. Meanwhile a campaign is
   sent to a list and paused and resumed every few seconds (``chaos.campaign``). The chain
   is ``--providers`` (default SendGrid, Mailgun, Amazon SES): with a third provider, 1 in 20
   addresses is dropped by SendGrid and by Mailgun on their side and must reach SES, and SES
   is throttled and answers 5xx after accepting (it has no query API: its events settle it).
3. Quiescence: the faults are cleared and the run waits until every accepted recipient is
   final (or ``--quiesce`` seconds pass).
4. The verdict (``chaos.verdict``), and ``safedelivr check`` over the same data. The last line
   of stdout is one JSON object; every count in it but ``accepted_recipients`` must be 0.
   Exit status 0 when they are, 1 when not, 2 when the run itself failed.

The soak shortens the windows that are hours in production (see the README) so a run takes
minutes: evidence is looked for every 2 s, the query APIs are asked after 8 s, webhooks are
waited for 240 s (SES's only evidence: the sandbox's backlog under load holds them back).
Everything the run creates is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.sampler import ProcessSampler
from bench.stack import ROOT, Stack
from chaos import campaign, clients, faults, verdict
from sandbox import signing
from shared.delivery.attempts import AttemptStore
from shared.delivery.precedence import visible
from shared.delivery.recipients import RecipientStore
from shared.delivery.stats import StatsStore, batch_day
from shared.infra.config import SandboxSettings
from shared.infra.db import Database
from shared.ops.check import Violation, check_day
from shared.ops.reconcile import day_batches

#: The fault tests run before the soak.
DETERMINISTIC = (
    "tests/integration/test_exactly_once.py",
    "tests/integration/test_resends.py",
    "tests/integration/test_acceptance_faults.py",
    "tests/integration/test_failover_chain.py",
    # Marked simulated (make test leaves it out): the chaos run still holds it to the real stack.
    "tests/integration/test_pipeline.py::"
    "test_sendgrid_500_fails_over_to_mailgun_as_retry_1_once_its_query_finds_nothing",
    "tests/integration/test_webhooks.py::test_cassandra_down_queues_the_delivery_and_applies_it_later",
    "tests/integration/test_webhooks.py::test_cassandra_and_rabbitmq_down_answers_503",
)

#: Violations, and batches whose attempts, printed when the soak fails.
DIAGNOSE_LINES, DIAGNOSE_BATCHES = 40, 3

#: Settings of every process of the soak (see the module docstring).
SETTINGS = {
    "SAFEDELIVR_PROVIDERS_TIMEOUT": "3",
    "SAFEDELIVR_PROVIDERS_RESOLVE_INTERVAL": "2",
    "SAFEDELIVR_PROVIDERS_QUERY_AFTER": "8",
    # SES has no query API: an unknown outcome waits for its events, which the sandbox's
    # backlog under the soak's load can hold back a minute or two (production: an hour).
    "SAFEDELIVR_PROVIDERS_WEBHOOK_WINDOW": "240",
    "SAFEDELIVR_PROVIDERS_BACKOFF": "1,2,5,10",
    "SAFEDELIVR_API_IDEMPOTENCY_LEASE": "5",
    "SAFEDELIVR_API_OUTBOX_GRACE": "5",
    "SAFEDELIVR_API_OUTBOX_RELAY_INTERVAL": "1",
    "SAFEDELIVR_SANDBOX_QUERY_DELAY": "2",
}
#: Start order: the sandbox and the webhook receiver before anything sends.
SERVICES = ("sandbox", "webhooks", "consumers", "consumers-b", "api")


class Printer:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--rate", type=float, default=4.0, help="batches started per second")
    parser.add_argument("--recipients", type=int, default=50, help="recipients per batch")
    parser.add_argument(
        "--quiesce", type=float, default=480.0, help="most seconds to wait for every outcome"
    )
    parser.add_argument(
        "--providers",
        default="sg,mg,ses",
        help="the provider chain of the soak (sg,mg keeps the two-provider run)",
    )
    parser.add_argument("--soak-only", action="store_true", help="skip the deterministic tests")
    parser.add_argument("--no-faults", action="store_true", help="the soak without its faults")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="against deploy/cluster (make cluster-test): node outages instead of the single-"
        "node faults, and no deterministic tests (they use the single-node services)",
    )
    return parser.parse_args(argv)


def deterministic_tests(printer: Printer) -> dict[str, int]:
    """Run the fault tests; their pass and fail counts."""
    printer(f"deterministic fault tests: {len(DETERMINISTIC)} modules/tests")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DETERMINISTIC],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "CI": "true"},
        check=False,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?)", summary)}
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    if proc.returncode != 0 and failed == 0:
        failed = 1  # pytest itself failed (collection, a crash): count it
    if failed:
        sys.stderr.write(proc.stdout[-20000:] + proc.stderr[-5000:])
    printer(f"deterministic fault tests: {summary or proc.returncode}")
    return {"deterministic_passed": counts.get("passed", 0), "deterministic_failed": failed}


async def soak(args: argparse.Namespace, printer: Printer) -> dict[str, Any]:
    os.environ.update({**SETTINGS, "SAFEDELIVR_PROVIDERS_CHAIN": args.providers})
    chain = tuple(args.providers.split(","))
    log_dir = Path(tempfile.mkdtemp(prefix="safedelivr-chaos-"))
    sampler = ProcessSampler()
    sampler.start()
    stack = Stack(log_dir=log_dir, sampler=sampler, printer=printer)
    printer(f"soak {stack.run_id}: logs in {log_dir}")
    try:
        await stack.setup()
        env = service_env(stack)
        for name in SERVICES:
            await stack.processes.start(name, env)
        run = uuid.uuid4().hex[:8]
        if args.no_faults:
            steps = []
        elif args.cluster:
            steps = faults.cluster_schedule()
        else:
            steps = faults.schedule(float(SETTINGS["SAFEDELIVR_PROVIDERS_TIMEOUT"]), chain)
        load = clients.load(
            stack.url("api"),
            stack.api_key,
            run=run,
            seconds=args.seconds,
            rate=args.rate,
            recipients=args.recipients,
            retry_for=120.0,
            printer=printer,
            walk=len(chain) > 2,
        )
        subs, fault_failures, mailing = await asyncio.gather(
            load,
            faults.run_schedule(stack, steps, printer),
            campaign.run_campaign(stack, run=run, seconds=args.seconds, printer=printer),
        )
        await _all_running(stack, env, printer)
        await faults.clear_provider_faults(stack)
        slices, campaign_counts = await campaign.outcome(
            stack, mailing, limit=args.quiesce, printer=printer
        )
        subs = [*subs, *slices]
        known = {b for s in subs for b in s.batch_ids}
        answers: dict[str, int] = {}
        for s in subs:
            for answer, n in s.answers.items():
                answers[answer] = answers.get(answer, 0) + n
        printer(f"answers the clients got: {dict(sorted(answers.items()))}")
        printer(f"{len(known)} batches accepted; waiting for every recipient to be final")
        await _quiesce(stack, known, args.quiesce, printer)
        result = await _verdict(stack, subs, printer)
        result.update(campaign_counts)
        result["fault_steps_failed"] = len(fault_failures)
        for failure in fault_failures:
            printer(f"fault step failed: {failure}")
        return result
    finally:
        for problem in await stack.teardown():
            printer(f"NOT CLEANED UP (remove by hand): {problem}")
        await sampler.stop()


def service_env(stack: Stack) -> dict[str, str]:
    """What the soak's processes add to the stack's environment: the sandbox posts webhooks
    soon (a benchmark has it post them an hour out) and signs them with this run's keys (an
    SNS key pair of its own for SES's events, its certificate pinned by the webhook service
    and the sandbox's topic allowed there, as ``make run`` does)."""
    sns_key, sns_certificate = signing.generate_sns_pair()
    return {
        "SAFEDELIVR_SANDBOX_WEBHOOK_DELAY": "0.5",
        "SAFEDELIVR_SANDBOX_SENDGRID_PRIVATE_KEY": stack.sendgrid_private_key,
        "SAFEDELIVR_SANDBOX_MAILGUN_SIGNING_KEY": stack.mailgun_signing_key,
        "SAFEDELIVR_PROVIDERS_SES_BASE_URL": f"{stack.url('sandbox')}/ses",
        "SAFEDELIVR_SANDBOX_SES_SIGNING_KEY": sns_key,
        "SAFEDELIVR_WEBHOOKS_SES_CERT_PEM": sns_certificate,
        "SAFEDELIVR_WEBHOOKS_SES_TOPIC_ARNS": SandboxSettings().ses_topic_arn,
    }


async def _all_running(stack: Stack, env: dict[str, str], printer: Printer) -> None:
    """Start any service a fault step left dead (a restart that failed)."""
    for name in SERVICES:
        service = stack.processes.running.get(name)
        if service is None or service.proc is None or service.proc.returncode is not None:
            printer(f"{name} is not running; starting it again")
            stack.processes.running.pop(name, None)
            await stack.processes.start(name, env)


async def _rows(db: Database, batch_id: uuid.UUID) -> list[verdict.Recipient]:
    rows = await RecipientStore(db).batch_rows(batch_id)
    events: dict[uuid.UUID, list[Any]] = {}
    for ev in await db.all_pages(
        "SELECT log_id, kind, at FROM log_events WHERE batch_id = ?", (batch_id,)
    ):
        events.setdefault(ev["log_id"], []).append(ev)
    return [verdict.recipient(batch_id, r, events.get(r["log_id"], [])) for r in rows]


async def _queued(db: Database, batch_id: uuid.UUID) -> int:
    """Recipients of a batch that readers still see ``queued``."""
    rows = await RecipientStore(db).batch_rows(batch_id)
    return sum(1 for r in rows if visible(r).state == "queued")


def _provider_record(value: Any) -> bool:
    return isinstance(value, dict) and "pending_events" in value


async def _quiesce(stack: Stack, batches: set[str], limit: float, printer: Printer) -> None:
    """Wait until every recipient of ``batches`` is final, or ``limit`` seconds pass."""
    assert stack.db is not None  # noqa: S101
    pending = set(batches)
    deadline = time.monotonic() + limit
    async with httpx.AsyncClient(base_url=stack.url("sandbox"), timeout=30) as sandbox:
        while pending and time.monotonic() < deadline:
            await stack.wait_until_available()
            hooks = (await sandbox.get("/_control/webhooks")).json()
            queued = 0
            for batch_id in sorted(pending):
                n = await _queued(stack.db, uuid.UUID(batch_id))
                queued += n
                if n == 0:
                    pending.discard(batch_id)
            if pending:
                backlog = (
                    sum(v["pending_events"] for v in hooks.values() if _provider_record(v))
                    + hooks["scheduled"]
                    + hooks["buffered_events"]
                )
                printer(
                    f"{len(pending)} batches, {queued} recipients not final; "
                    f"webhook events not yet posted by the providers: {backlog}"
                )
                await asyncio.sleep(5)
    # Whatever is still in flight (a stats write after a state write) gets a moment more.
    await asyncio.sleep(5)


async def _verdict(
    stack: Stack, subs: list[verdict.Submission], printer: Printer
) -> dict[str, Any]:
    db = stack.db
    assert db is not None  # noqa: S101
    days = sorted({batch_day(uuid.UUID(b)) for s in subs for b in s.batch_ids})
    stored = [str(b) for day in days for b in await day_batches(db, stack.user_id, day)]
    recipients = [r for b in stored for r in await _rows(db, uuid.UUID(b))]
    async with httpx.AsyncClient(base_url=stack.url("sandbox"), timeout=60) as client:
        resp = await client.get("/_control/sends", params={"recent": "0"})
        resp.raise_for_status()
        ledger = resp.json()
    accepted: dict[str, dict[str, int]] = {}
    for provider, record in ledger.items():
        for email, n in record["by_recipient"].items():
            accepted.setdefault(email, {})[provider] = n
    stats = StatsStore(db)
    # A read serves a busy bucket from its last rollup and recounts it behind the read (the
    # stated lag): the verdict judges the counts once those recounts are in.
    for day in days:
        await stats.day(stack.user_id, day)
    await stats.rolled()
    totals: dict[str, int] = {}
    for day in days:
        for metric, n in (await stats.day(stack.user_id, day)).items():
            totals[metric] = totals.get(metric, 0) + n
    found = []
    for day in days:
        found += await check_day(
            db, day, now=datetime.now(UTC), settle_after=timedelta(0), users=[stack.user_id]
        )
    if found:
        await _diagnose(stack, found, printer)
    await _wrong_outcomes(db, recipients, accepted, printer)
    return verdict.verdict(subs, stored, recipients, accepted, totals, check_violations=len(found))


async def _wrong_outcomes(
    db: Database,
    recipients: list[verdict.Recipient],
    accepted: dict[str, dict[str, int]],
    printer: Printer,
) -> None:
    """A few recipients that ended other than their address says, with their providers map,
    reason and the sandbox's accepts: where to start looking."""
    wrong = [
        r
        for r in recipients
        if r.state not in ("queued", verdict.EXPECTED_STATE[verdict.address_class(r.email)])
    ]
    store = RecipientStore(db)
    for r in wrong[: DIAGNOSE_LINES // 4]:
        rows = await store.batch_rows(uuid.UUID(r.batch_id))
        row = next((x for x in rows if x["email"] == r.email), None)
        seen = visible(row) if row is not None else None
        printer(
            f"wrong outcome: {r.email} {r.state} reason={seen.reason if seen else None} "
            f"providers={row.get('providers') if row else None} "
            f"accepted={accepted.get(r.email.lower(), {})}"
        )


async def _diagnose(stack: Stack, found: list[Violation], printer: Printer) -> None:
    """What an engineer needs first when the soak fails: the violations, the attempts of a
    few batches concerned, and what is left in the queues."""
    assert stack.db is not None  # noqa: S101
    for v in found[:DIAGNOSE_LINES]:
        printer(f"violation: {v.line()}")
    attempts = AttemptStore(stack.db)
    batches = sorted({v.batch_id for v in found if v.batch_id is not None}, key=str)
    for batch_id in batches[:DIAGNOSE_BATCHES]:
        for line, history in sorted((await attempts.lines(batch_id)).items()):
            for a in history:
                printer(
                    f"  {batch_id} {line}.{a.attempt} {a.provider} {a.state} "
                    f"decision={a.decision} next={a.next_provider}/{a.next_attempt} "
                    f"checks={a.checks} error={a.error} verdict={a.verdict}"
                )
    for queue in [*stack.work_queues(), stack.topology.dead_letter_queue]:
        with contextlib.suppress(Exception):
            printer(f"queue {queue}: {await stack.depth(queue)} ready")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    printer = Printer()
    # The run's own broker connection drops with every RabbitMQ restart it causes: expected.
    for noisy in ("aiormq", "aio_pika"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    result: dict[str, Any] = {}
    if not (args.soak_only or args.cluster):
        result.update(deterministic_tests(printer))
    try:
        result.update(asyncio.run(soak(args, printer)))
    except Exception as exc:  # noqa: BLE001 - the last line still says what happened
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["seconds"] = round(time.monotonic() - printer.t0, 1)
    print(orjson.dumps(result).decode(), flush=True)
    if "error" in result:
        return 2
    bad = {k: v for k, v in result.items() if _is_violation(k, v)}
    return 1 if bad else 0


def _is_violation(key: str, value: Any) -> bool:
    informative = {"accepted_recipients", "deterministic_passed", "seconds"}
    return (
        isinstance(value, int)
        and key not in informative
        and not key.endswith("_to_final")
        and value != 0
    )


if __name__ == "__main__":
    sys.exit(main())
