"""The soak's faults: a schedule of crashes, outages and provider misbehaviour, run while the
clients submit.

Each step names when it starts (seconds after the load starts) and what it does; steps run
one after another (a late step waits for the one before it), so two outages never overlap
by accident. The sandbox is the only process never killed: it stands for SendGrid and
Mailgun, and its record of what they accepted is the soak's ground truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import procfs
from bench.stack import Stack

Printer = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Step:
    at: float
    what: str
    run: Callable[[Stack], Awaitable[None]]
    wait: bool = True
    """False: the next step may start while this one still runs (overlapping outages)."""


def crash(service: str, down: float) -> Callable[[Stack], Awaitable[None]]:
    """kill -9 ``service``, leave it dead for ``down`` seconds, start it again."""

    async def go(stack: Stack) -> None:
        env = await stack.processes.kill(service)
        await asyncio.sleep(down)
        await stack.processes.start(service, env)

    return go


def provider(*, used_within: float = 0.0, **fault: Any) -> Callable[[Stack], Awaitable[None]]:
    """Make ``fault`` (a ``POST /_control/faults`` body) the provider's active fault, saying
    so when it replaces one not used up (its calls never came: the step tested less). With
    ``used_within`` the step lasts until the fault's calls have come (at most that many
    seconds), so that no later step replaces it first."""

    async def go(stack: Stack) -> None:
        async with httpx.AsyncClient(base_url=stack.url("sandbox")) as client:
            await _report_unused(client, stack.printer, fault["provider"])
            resp = await client.post("/_control/faults", json=fault)
            resp.raise_for_status()
            for _ in range(int(used_within * 4)):
                if not await _left(client, fault["provider"]):
                    break
                await asyncio.sleep(0.25)  # the sandbox is another process: poll it

    return go


async def _left(client: httpx.AsyncClient, name: str) -> int:
    """Calls left to the provider's active fault (0 once it is used up)."""
    resp = await client.get("/_control/faults")
    resp.raise_for_status()
    return sum(f["count"] or 0 for f in resp.json() if f["provider"] == name)


async def clear_provider_faults(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url("sandbox")) as client:
        await _report_unused(client, stack.printer)
        (await client.delete("/_control/faults")).raise_for_status()


async def _report_unused(client: httpx.AsyncClient, printer: Printer, name: str = "") -> None:
    """Print the active faults (of provider ``name``, or all) that still have calls left."""
    resp = await client.get("/_control/faults")
    resp.raise_for_status()
    for left in resp.json():
        if left["count"] and left["provider"] in (name or left["provider"]):
            printer(f"fault not used up: {left['provider']} status {left['status']}, "
                    f"{left['count']} call(s) left")  # fmt: skip


def rabbitmq_restart(down: float) -> Callable[[Stack], Awaitable[None]]:
    """``rabbitmqctl stop_app``, ``down`` seconds, ``start_app``: every connection drops."""

    async def go(stack: Stack) -> None:
        await asyncio.to_thread(_rabbitmqctl, "stop_app")
        try:
            await asyncio.sleep(down)
        finally:
            await asyncio.to_thread(_rabbitmqctl, "start_app")
            # RabbitMQ 3.10 can come back with its dead-letter supervisor stopped.
            await asyncio.to_thread(_heal_rabbitmq)

    return go


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


def _heal_rabbitmq() -> None:
    script = Path(__file__).resolve().parents[1] / "deploy" / "local" / "rabbitmq.sh"
    subprocess.run(["bash", str(script), "heal"], check=True, timeout=120)


def cassandra_pause(seconds: float) -> Callable[[Stack], Awaitable[None]]:
    """Freeze Cassandra (SIGSTOP) for ``seconds``: connections stay open, requests time out,
    as in a long GC pause or a stalled disk."""

    async def go(stack: Stack) -> None:
        pid = procfs.cassandra_pid(stack.state_dir)
        if pid is None:
            raise RuntimeError("no Cassandra process found to pause")
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    return go


#: deploy/cluster's control script (``make cluster-test``).
CLUSTER_SCRIPT = "deploy/cluster/cluster.sh"


def node_outage(kind: str, node: int, down: float) -> Callable[[Stack], Awaitable[None]]:
    """kill -9 node ``node`` of the local ``kind`` cluster (cassandra or rabbitmq), leave it
    dead for ``down`` seconds, start it again (it rejoins with its data)."""

    async def go(stack: Stack) -> None:
        await asyncio.to_thread(_cluster, "kill", kind, str(node))
        try:
            await asyncio.sleep(down)
        finally:
            await asyncio.to_thread(_cluster, "start", kind, str(node))

    return go


def _cluster(*args: str) -> None:
    subprocess.run(["bash", CLUSTER_SCRIPT, *args], check=True, capture_output=True, timeout=300)


def cluster_schedule() -> list[Step]:
    """``make cluster-test``: one Cassandra node and one RabbitMQ node die under load, their
    outages overlapping. Node 1 of each is the first contact point and the first AMQP node
    of every process, so it holds the most connections (and the Cassandra seed)."""
    return [
        Step(8, "kill -9 Cassandra node 1 for 30 s", node_outage("cassandra", 1, 30), False),
        Step(14, "kill -9 RabbitMQ node 1 for 20 s", node_outage("rabbitmq", 1, 20)),
    ]


def schedule(timeout: float, chain: Sequence[str] = ("sg", "mg")) -> list[Step]:
    """The default schedule over about 60 seconds of load. ``timeout`` is the providers'
    request timeout: an accepted call that answers later is ambiguous, and so is any call
    answered with a 5xx, whether the provider accepted it first (as Mailgun did, answering
    504) or not: the query APIs settle them once ``SAFEDELIVR_PROVIDERS_QUERY_AFTER`` passed.
    With SES in ``chain`` it is throttled and accepts then answers 5xx too; it has no query
    API, so its events settle those."""
    late = int((timeout + 5) * 1000)
    steps = [
        Step(
            2,
            "SendGrid accepts, then answers 503 (x5)",
            provider(provider="sendgrid", status=503, accept=True, count=5, used_within=15),
        ),
        Step(
            4,
            "SendGrid answers 500 forty times (accepting nothing)",
            provider(provider="sendgrid", status=500, count=40),
        ),
        Step(
            6,
            "Mailgun accepts, then answers 504 (x5)",
            provider(provider="mailgun", status=504, accept=True, count=5, used_within=20),
        ),
        Step(8, "kill -9 consumers", crash("consumers", 2)),
        Step(14, "kill -9 api", crash("api", 1)),
        Step(
            18,
            "SendGrid accepts, then answers after the timeout (x4)",
            provider(provider="sendgrid", status=200, accept=True, latency_ms=late, count=4),
        ),
        Step(22, "RabbitMQ stop_app for 5 s", rabbitmq_restart(5)),
        Step(32, "kill -9 webhooks", crash("webhooks", 3)),
        Step(38, "Cassandra frozen for 3 s", cassandra_pause(3)),
        Step(
            43,
            "Mailgun accepts, then resets the connection (x3)",
            provider(provider="mailgun", status=200, accept=True, reset=True, count=3),
        ),
        Step(
            44,
            "SendGrid resets the connection before accepting (x3)",
            provider(provider="sendgrid", status=500, reset=True, count=3),
        ),
        Step(48, "kill -9 consumers-b", crash("consumers-b", 2)),
        Step(
            51,
            "SendGrid accepts, then resets the connection (x3)",
            provider(provider="sendgrid", status=200, accept=True, reset=True, count=3),
        ),
        Step(55, "kill -9 api", crash("api", 1)),
        Step(57, "kill -9 consumers", crash("consumers", 1)),
    ]
    if "ses" in chain:
        steps += [
            Step(
                10,
                "SES throttles (429) twenty calls",
                provider(provider="ses", status=429, count=20),
                False,
            ),
            Step(
                26,
                "SES accepts, then answers 500 (x5)",
                provider(provider="ses", status=500, accept=True, count=5, used_within=30),
                False,
            ),
        ]
    return sorted(steps, key=lambda s: s.at)


async def run_schedule(stack: Stack, steps: list[Step], printer: Printer) -> list[str]:
    """Run ``steps`` from now; return the failures (a step that failed is reported, and the
    soak goes on: the invariants must hold whatever happened)."""
    t0 = time.monotonic()
    failures: list[str] = []

    async def run(step: Step) -> None:
        try:
            await step.run(stack)
        except Exception as exc:  # noqa: BLE001 - reported with the verdict
            failures.append(f"{step.what}: {type(exc).__name__}: {exc}")
            printer(f"fault step failed: {type(exc).__name__}: {exc}")

    overlapping = []
    for step in steps:
        await asyncio.sleep(max(0.0, step.at - (time.monotonic() - t0)))
        printer(f"fault: {step.what}")
        if step.wait:
            await run(step)
        else:
            overlapping.append(asyncio.create_task(run(step)))
    await asyncio.gather(*overlapping)
    with contextlib.suppress(Exception):
        await clear_provider_faults(stack)
    return failures
