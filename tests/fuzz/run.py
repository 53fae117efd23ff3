"""``make fuzz``: property-based HTTP fuzzing of every route of the API and of both webhook
receivers, against the real services, with valid and with invalid credentials.

The API is fuzzed by Schemathesis from its own OpenAPI document (``/v1/openapi.json``): data
that fits the schema and data that does not, with a key holding every scope and with a key
that does not exist. The webhook receivers (not in that document) are fuzzed with Hypothesis:
arbitrary and near-valid bodies, signed and unsigned; so are the API's routes that the
document does not list (``tests.fuzz.unlisted``: the original's ``/api/*``, the dashboard, the
GitHub login), and every listed route again with hand-written strategies
(``tests.fuzz.handmade``). Every answer is counted by route and
status where the apps see it; the verdict is the count of answers of 500 and above (it must
be 0), and Schemathesis also checks that each answer matches its documented schema, error
envelopes included.

Usage: ``python -m tests.fuzz.run [--examples N] [--seed S]``; prints one JSON document and
exits 1 when a route answered 5xx or a check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from sandbox import signing
from sandbox.app import create_app as create_sandbox
from services.api.app import create_app as create_api
from services.tracking.app import create_app as create_tracking
from services.webhooks.app import create_app as create_webhooks
from shared.core.keyring import KeyRing, ring_from
from shared.engagement.engagement_tokens import Claim, sign
from shared.infra.config import (
    AmqpSettings,
    ApiSettings,
    CassandraSettings,
    SandboxSettings,
    Settings,
    WebhookSettings,
)
from shared.infra.db import Database
from shared.infra.migrations import migrate
from shared.infra.resources import declare_topology
from tests.fuzz.handmade import fuzz_handmade
from tests.fuzz.tally import Tally, new_sender, settings_for
from tests.integration.harness import served

ROOT = Path(__file__).resolve().parents[2]
MG_KEY = "fuzz-mailgun-signing-key"


@contextlib.asynccontextmanager
async def keyspace() -> AsyncIterator[CassandraSettings]:
    cassandra = CassandraSettings(keyspace=f"fuzz_{uuid.uuid4().hex[:10]}")
    await migrate(cassandra)
    try:
        yield cassandra
    finally:
        db = await Database.connect(cassandra)
        with contextlib.suppress(Exception):
            await db.execute(f"DROP KEYSPACE IF EXISTS {cassandra.keyspace}")
        await db.close()


async def fuzz_api(settings: Settings, examples: int, seed: int) -> dict[str, Any]:
    """Schemathesis over every operation, with a key holding every scope, then a bad key."""
    db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
    try:
        _, key = await new_sender(db, "fuzz")
    finally:
        await db.close()
    sandbox = create_sandbox(SandboxSettings(webhook_url="http://127.0.0.1:9", webhook_delay=60))
    checks: dict[str, int] = {}
    async with served(sandbox) as sandbox_url:  # its DNS answers domain verification
        api = settings.api.model_copy(update={"dns_url": f"{sandbox_url}/dns-query"})
        app = create_api(settings.model_copy(update={"api": api}))
        tally = Tally(app)
        return await _schemathesis(tally, key, examples, seed, checks)


async def _schemathesis(
    tally: Tally, key: str, examples: int, seed: int, checks: dict[str, int]
) -> dict[str, Any]:
    async with served(tally) as url:  # its lifespan runs the app's
        for name, token in (
            ("valid key", key),
            ("invalid key", "sd_live_aaaaaaaaaaaa_" + "b" * 43),
        ):
            command = [
                str(ROOT / ".venv/bin/schemathesis"),
                "run",
                f"{url}/v1/openapi.json",
                "--checks",
                "not_a_server_error,status_code_conformance,response_schema_conformance",
                "--max-examples",
                str(examples),
                "--seed",
                str(seed),
                "--header",
                f"Authorization: Bearer {token}",
                "--request-timeout",
                "30",
                "--no-color",
                "--warnings",
                "off",
            ]
            process = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
            out, _ = await process.communicate()
            checks[name] = process.returncode or 0
            if process.returncode:
                sys.stderr.write(out.decode(errors="replace")[-6000:])
    return {**tally.summary(), "schemathesis_exit": checks}


def _sendgrid_headers(private: Any, body: bytes, *, sign: bool) -> dict[str, str]:
    stamp = str(int(time.time()))
    if not sign:
        return {"X-Twilio-Email-Event-Webhook-Timestamp": stamp}
    return {
        "X-Twilio-Email-Event-Webhook-Timestamp": stamp,
        "X-Twilio-Email-Event-Webhook-Signature": signing.sign_sendgrid(private, stamp, body),
    }


ints = st.integers(-(2**63), 2**63 - 1)  # what JSON encoders write
json_values = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
event_fields = st.fixed_dictionaries(
    {},
    optional={
        "email": st.emails() | st.text(),
        "event": st.sampled_from(["delivered", "bounce", "dropped", "open", "x"]) | st.text(),
        "timestamp": ints | st.text(),
        "sg_event_id": st.text(),
        "batch_id": st.uuids().map(str) | st.text(),
        "chunk": ints | st.text(),
        "log_id": st.uuids().map(str) | st.text(),
    },
)


def webhook_bodies(
    private: Any, mailgun_key: str, examples: int, seed: int
) -> list[tuple[str, bytes, dict[str, str]]]:
    """Hypothesis bodies for both receivers (path, body, headers), signed with these keys
    and not: ``examples`` for each receiver."""
    bodies: list[tuple[str, bytes, dict[str, str]]] = []

    @settings_for(examples, seed)
    @given(
        st.one_of(
            st.binary(max_size=2048),
            json_values.map(orjson.dumps),
            st.lists(event_fields, max_size=5).map(orjson.dumps),
        ),
        st.booleans(),
    )
    def sendgrid(body: bytes, sign: bool) -> None:
        bodies.append(("/webhooks/sendgrid", body, _sendgrid_headers(private, body, sign=sign)))

    @settings_for(examples, seed)
    @given(event_fields, st.booleans(), json_values)
    def mailgun(event: dict[str, Any], sign: bool, junk: Any) -> None:
        signature = signing.mailgun_signature(mailgun_key if sign else "wrong", int(time.time()))
        body = orjson.dumps({"signature": signature, "event-data": event, "junk": junk})
        bodies.append(("/webhooks/mailgun", body, {"Content-Type": "application/json"}))

    sendgrid()
    mailgun()
    return bodies


async def fuzz_webhooks(settings: Settings, examples: int, seed: int) -> dict[str, Any]:
    """Hypothesis bodies to both receivers, signed and not."""
    private = signing.generate_private_key()
    webhooks = settings.model_copy(
        update={
            "webhooks": WebhookSettings(
                sendgrid_public_key=signing.public_key_base64(private),
                mailgun_signing_key=SecretStr(MG_KEY),
            )
        }
    )
    app = create_webhooks(webhooks)
    tally = Tally(app)
    async with served(tally) as url, httpx.AsyncClient(base_url=url) as client:
        for path, body, headers in webhook_bodies(private, MG_KEY, examples, seed):
            await client.post(path, content=body, headers=headers)
    return tally.summary()


def tracking_calls(ring: KeyRing, examples: int, seed: int) -> list[tuple[str, str, bytes]]:
    """Hostile requests to the tracking endpoint (method, path, body): tokens forged,
    truncated, re-signed with other keys, signed for unknown batches."""
    calls: list[tuple[str, str, bytes]] = []
    signed = st.builds(
        lambda purpose, link, scope: sign(
            Claim(purpose, uuid.uuid1(), uuid.uuid4(), link=link, scope=scope), ring
        ),
        st.sampled_from(["click", "open", "unsubscribe"]),
        st.none() | st.integers(0, 65535),
        st.none() | st.text(max_size=50).filter(lambda t: len(t.encode()) <= 200),
    )
    tokens = st.one_of(
        st.text(max_size=300),
        signed,
        signed.map(lambda t: t[:-1] + ("A" if t[-1] != "A" else "B")),
    )

    @settings_for(examples, seed)
    @given(
        st.sampled_from(["GET /o/", "GET /c/", "GET /u/", "POST /u/"]),
        tokens,
        st.binary(max_size=512),
    )
    def hit(route: str, token: str, body: bytes) -> None:
        method, path = route.split(" ")
        calls.append((method, path + urllib.parse.quote(token, safe=""), body))

    hit()
    return calls


async def fuzz_tracking(settings: Settings, examples: int, seed: int) -> dict[str, Any]:
    """Hostile tokens and bodies to the tracking endpoint (:func:`tracking_calls`): every
    answer a 404 page, a pixel or a 200, never a 5xx and never a redirect."""
    app = create_tracking(settings)
    ring = ring_from(settings.tracking.keys.get_secret_value())
    tally = Tally(app)
    redirects = 0
    async with served(tally) as url, httpx.AsyncClient(base_url=url) as client:
        for method, path, body in tracking_calls(ring, examples, seed):
            resp = await client.request(method, path, content=body or None)
            redirects += resp.is_redirect
    summary = tally.summary()
    summary["redirects"] = redirects
    return summary


async def main(examples: int, seed: int) -> int:
    async with keyspace() as cassandra:
        settings = Settings(
            cassandra=cassandra,
            amqp=AmqpSettings(exchange=f"fuzz-{uuid.uuid4().hex[:8]}"),
            api=ApiSettings(rate_limit_per_second=10_000, rate_burst=10_000),
        )
        topology = await declare_topology(settings)
        try:
            report: dict[str, Any] = {
                "examples_per_operation": examples,
                "seed": seed,
                "api": await fuzz_api(settings, examples, seed),
                "webhooks": await fuzz_webhooks(settings, examples * 10, seed),
                "tracking": await fuzz_tracking(settings, examples * 2, seed),
                "handmade": await fuzz_handmade(settings, examples * 2, seed),
            }
        finally:
            with contextlib.suppress(Exception):
                from shared.infra.broker import Broker

                broker = Broker(settings.amqp.url.get_secret_value(), topology, name="fuzz")
                await broker.connect()
                await broker.delete()
                await broker.close()
    report["per_route"] = per_route(report["api"]["by_route"], report["handmade"]["by_route"])
    print(json.dumps(report, indent=2))
    phases = ("api", "webhooks", "tracking", "handmade")
    bad = sum(report[phase]["server_errors"] for phase in phases)
    bad += report["handmade"]["envelope_failures"] + report["tracking"]["redirects"]
    return 1 if bad or any(report["api"]["schemathesis_exit"].values()) else 0


def per_route(*tallies: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Requests per route over every phase, and the routes below 2,000 (the long run's bar)."""
    totals: Counter[str] = Counter()
    for tally in tallies:
        for route, statuses in tally.items():
            totals[route] += sum(statuses.values())
    routes = {r: n for r, n in sorted(totals.items()) if "(no route)" not in r}
    return {
        "requests": routes,
        "fewest": min(routes.values(), default=0),
        "below_2000": sorted(r for r, n in routes.items() if n < 2000),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=50, help="per API operation and auth")
    parser.add_argument("--seed", type=int, default=20261125)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.examples, args.seed)))
