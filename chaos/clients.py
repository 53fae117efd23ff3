"""The soak's clients: batches submitted at a steady rate, each retried with its own
``Idempotency-Key`` until the API names its batch, the way a careful client would.

A client retries on anything that may be transient (no connection, a timeout, 409
``idempotency_in_progress``, 429, 5xx) with a capped backoff, until it is told a batch id or
its deadline passes. Every answer is recorded in its :class:`~chaos.verdict.Submission`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import httpx

from chaos.verdict import Submission

#: Address local parts by position in a batch: 1 in 20 bounces, 1 in 20 is dropped by
#: SendGrid (and handed to Mailgun), with a chain of three or more 1 in 20 is dropped by
#: SendGrid and Mailgun (and handed to the third), the rest are delivered.
_BOUNCE_EVERY, _SGDROP_EVERY, _SGMGDROP_EVERY = 20, 20, 20
#: Seconds one request may take before the client gives up on it and retries.
REQUEST_TIMEOUT = 10.0
#: Backoff between retries (seconds): doubled from the first up to the cap.
BACKOFF_FIRST, BACKOFF_CAP = 0.25, 4.0


def addresses(run: str, seq: int, count: int, *, walk: bool = False) -> tuple[str, ...]:
    """``count`` addresses unique to batch ``seq`` of ``run``, with the class mix above
    (``walk``: the chain has a provider after SendGrid and Mailgun)."""
    out = []
    for i in range(count):
        if i % _BOUNCE_EVERY == 1:
            local = "bounce"
        elif i % _SGDROP_EVERY == 2:
            local = "sgdrop"
        elif walk and i % _SGMGDROP_EVERY == 3:
            local = "sgmgdrop"
        else:
            local = "user"
        out.append(f"{local}-{run}-{seq}-{i}@chaos.example.com")
    return tuple(out)


async def submit(
    client: httpx.AsyncClient, api_key: str, sub: Submission, *, deadline: float
) -> None:
    """Send ``sub`` until a batch id comes back or ``deadline`` (monotonic) passes."""
    body = {
        "from": "Chaos <chaos@example.com>",
        "to": list(sub.emails),
        "subject": f"chaos {sub.key}",
        "text": "Exactly once, please.",
    }
    headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": sub.key}
    wait = BACKOFF_FIRST
    while time.monotonic() < deadline:
        try:
            resp = await client.post(
                "/v1/batches", json=body, headers=headers, timeout=REQUEST_TIMEOUT
            )
        except httpx.HTTPError as exc:
            _count(sub, f"transport:{type(exc).__name__}")
        else:
            _count(sub, str(resp.status_code))
            if resp.status_code in (200, 201, 202):
                sub.batch_ids.add(str(resp.json()["batch_id"]))
                return
            if resp.status_code not in (409, 429) and resp.status_code < 500:
                sub.unexpected.append(f"{resp.status_code} {resp.text[:200]}")
                return
        await asyncio.sleep(wait)
        wait = min(wait * 2, BACKOFF_CAP)


def _count(sub: Submission, answer: str) -> None:
    sub.answers[answer] = sub.answers.get(answer, 0) + 1


async def load(
    api_url: str,
    api_key: str,
    *,
    run: str,
    seconds: float,
    rate: float,
    recipients: int,
    retry_for: float,
    printer: Callable[[str], None],
    walk: bool = False,
) -> list[Submission]:
    """Start ``rate`` batches a second for ``seconds``; wait for every client to finish
    (each keeps retrying for up to ``retry_for`` seconds after the load ends); ``walk``: the
    chain has a provider after SendGrid and Mailgun (the address mix includes the walk)."""
    subs: list[Submission] = []
    tasks: list[asyncio.Task[None]] = []
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=32)
    async with httpx.AsyncClient(base_url=api_url, limits=limits) as client:
        t0 = time.monotonic()
        deadline = t0 + seconds + retry_for
        seq = 0
        while (elapsed := time.monotonic() - t0) < seconds:
            while seq < elapsed * rate:
                sub = Submission(
                    uuid.uuid4().hex, addresses(run, seq, recipients, walk=walk), time.time()
                )
                subs.append(sub)
                tasks.append(asyncio.create_task(submit(client, api_key, sub, deadline=deadline)))
                seq += 1
            await asyncio.sleep(0.05)
        printer(f"load done: {seq} batches started; waiting for clients to get their ids")
        await asyncio.gather(*tasks)
    return subs
