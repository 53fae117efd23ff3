"""The inputs of ``make fuzz``, sent to the running stack of ``make hostile``.

The cases are drawn by ``tests.fuzz`` itself (seeded): every route of the API with the
hand-written strategies (:func:`tests.fuzz.handmade.draw_calls`, as a key, a wrong key, a
session with and without its CSRF token, nobody), Hypothesis bodies for both webhook
receivers signed with the stack's keys and not (:func:`tests.fuzz.run.webhook_bodies`), and
hostile tokens for the tracking endpoint (:func:`tests.fuzz.run.tracking_calls`); then
Schemathesis over the API's OpenAPI document with a key holding every scope. Answers are
counted by status class; a 5xx is reported, not judged (``make fuzz`` judges those).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.hostile.attack import Attack, Target
from sandbox import signing
from shared.infra.config import Settings
from tests.fuzz import handmade
from tests.fuzz.run import tracking_calls, webhook_bodies

#: Seconds the Schemathesis run may take before it is stopped.
SCHEMATHESIS_TIMEOUT = 600.0


async def fuzz_all(
    settings: Settings,
    target: Target,
    *,
    examples: int,
    seed: int,
    schemathesis: bool,
    printer: Callable[[str], None],
) -> list[tuple[str, Attack]]:
    """Every fuzzing group in turn, each one's answers counted."""
    out: list[tuple[str, Attack]] = []
    async with httpx.AsyncClient(timeout=target.timeout) as client:
        who = await handmade.credentials(settings)
        routes = Attack("fuzz: every API route")
        async with httpx.AsyncClient(base_url=target.api, timeout=target.timeout) as api:
            for call in handmade.draw_calls(who, examples, seed):
                await _counted(routes, handmade.send(api, call))
        out.append((routes.name, routes))
        printer(f"{routes.name}: {dict(routes.statuses)}")

        hooks = Attack("fuzz: webhook receivers")
        private = signing.load_private_key(target.sendgrid_private_key)
        for path, body, headers in webhook_bodies(
            private, target.mailgun_signing_key, examples * 10, seed
        ):
            await _counted(
                hooks, client.post(target.webhooks + path, content=body, headers=headers)
            )
        out.append((hooks.name, hooks))
        printer(f"{hooks.name}: {dict(hooks.statuses)}")

        tracking = Attack("fuzz: tracking endpoint")
        for method, path, body in tracking_calls(target.ring, examples * 2, seed):
            request = client.request(method, target.tracking + path, content=body or None)
            await _counted(tracking, request)
        out.append((tracking.name, tracking))
        printer(f"{tracking.name}: {dict(tracking.statuses)}")
    if schemathesis:
        schema = Attack("fuzz: Schemathesis over the OpenAPI document")
        schema.statuses.update(await _schemathesis(target, examples, seed, schema))
        out.append((schema.name, schema))
        printer(f"{schema.name}: {dict(schema.statuses)}")
    return out


async def _counted(attack: Attack, request: Any) -> None:
    """Count the answer by status class; a 5xx is also listed with its request."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        response: httpx.Response = await request
    except httpx.HTTPError as exc:
        attack.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
        return
    finally:
        attack.slowest_s = max(attack.slowest_s, loop.time() - started)
    attack.statuses[f"{response.status_code // 100}xx"] += 1
    if response.status_code >= 500:
        attack.server_errors.append(
            f"{response.request.method} {response.request.url.path[:80]}: "
            f"{response.status_code} {response.text[:200]}"
        )


async def _schemathesis(target: Target, examples: int, seed: int, attack: Attack) -> Counter[str]:
    """Schemathesis's own run; its answers are counted by the API's metrics, not here, so
    only the exit status is kept (as ``exit <n>``)."""
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "run",
        f"{target.api}/v1/openapi.json",
        "--checks",
        "not_a_server_error",
        "--max-examples",
        str(examples),
        "--seed",
        str(seed),
        "--header",
        f"Authorization: Bearer {target.key}",
        "--request-timeout",
        str(int(target.timeout)),
        "--no-color",
        "--warnings",
        "off",
    ]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), SCHEMATHESIS_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        attack.errors.append(f"stopped after {SCHEMATHESIS_TIMEOUT:.0f}s")
        return Counter()
    if process.returncode:
        attack.errors.append(out.decode(errors="replace")[-2000:])
    return Counter({f"exit {process.returncode}": 1})
