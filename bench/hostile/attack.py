"""Part (b) of ``make hostile``: the hostile requests of issue 33 sent to a running stack.

Each :class:`Attack` is a named group of requests with the statuses they got and the
slowest answer (an answer that never came is an error of the group, not of the run: a
service held for minutes is what is being measured). The groups run at once, as hostile
users would; :func:`run_all` returns them in a fixed order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.hostile import payloads
from bench.hostile.cases import OPEN_WORD
from sandbox import signing
from shared.core.keyring import KeyRing
from shared.engagement.engagement_tokens import Claim, sign

#: Times an API request answered 503 with Retry-After is sent.
RETRIES = 30
#: A user agent of 7 KB of open encoded words (a header may not end in a space).
HOSTILE_AGENT = (OPEN_WORD * 1000).strip()


@dataclass
class Attack:
    """One group of hostile requests and what came of them."""

    name: str
    statuses: Counter[str] = field(default_factory=Counter)
    slowest_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    """Requests that got no answer."""
    server_errors: list[str] = field(default_factory=list)
    """Answers of 500 and above, with their requests."""
    retried: int = 0
    """503s with Retry-After that were retried (not counted in ``statuses``)."""

    def summary(self) -> dict[str, Any]:
        return {
            "requests": sum(self.statuses.values()) + len(self.errors),
            "statuses": dict(sorted(self.statuses.items())),
            "slowest_s": round(self.slowest_s, 3),
            "errors": self.errors[:10],
            "server_errors": self.server_errors[:10],
            "retried": self.retried,
        }


@dataclass(frozen=True)
class Target:
    """Where the stack listens and what a hostile user holds."""

    api: str
    webhooks: str
    tracking: str
    key: str
    ring: KeyRing
    sendgrid_private_key: str
    mailgun_signing_key: str
    timeout: float


class Attacker:
    """Sends requests on behalf of the attacks and records their answers."""

    def __init__(self, target: Target, client: httpx.AsyncClient) -> None:
        self.target = target
        self.client = client

    async def send(
        self, attack: Attack, method: str, url: str, **kwargs: Any
    ) -> httpx.Response | None:
        started = time.monotonic()
        try:
            response = await self.client.request(method, url, timeout=self.target.timeout, **kwargs)
        except httpx.HTTPError as exc:
            where = url.split("?")[0][:80]
            attack.errors.append(f"{method} {where}: {type(exc).__name__} {str(exc)[:200]}")
            return None
        finally:
            attack.slowest_s = max(attack.slowest_s, time.monotonic() - started)
        attack.statuses[str(response.status_code)] += 1
        if response.status_code >= 500:
            attack.server_errors.append(
                f"{method} {response.request.url.path[:80]}: {response.status_code} "
                f"{response.text[:200]}"
            )
        return response

    async def api(
        self, attack: Attack, method: str, path: str, **kwargs: Any
    ) -> httpx.Response | None:
        headers = {"Authorization": f"Bearer {self.target.key}", **kwargs.pop("headers", {})}
        url = self.target.api + path
        for _ in range(RETRIES):
            answer = await self.send(attack, method, url, headers=headers, **kwargs)
            wait = None if answer is None else answer.headers.get("retry-after")
            if answer is None or answer.status_code != 503 or not wait:
                return answer
            # Refused unread for want of room (the body budget): a client retries as told, so
            # every hostile request is in the end processed, one budget's worth at a time.
            attack.statuses.subtract({"503": 1})
            attack.statuses += Counter()  # drops the count if it fell to 0
            attack.server_errors.pop()
            attack.retried += 1
            await asyncio.sleep(float(wait))
        return answer

    # -- the attacks ---------------------------------------------------------------------

    async def click_tracking(self, attack: Attack) -> None:
        """Item 1: the batch, then a click on its first link (the tracking endpoint reads
        the stored message's links) from a 10 KB user agent."""
        answer = await self.api(attack, "POST", "/v1/batches", json=payloads.click_tracking_batch())
        batch_id = _field(answer, "batch_id")
        if batch_id is None:
            return
        claim = Claim("click", uuid.UUID(batch_id), uuid.uuid4(), link=0)
        token = sign(claim, self.target.ring)
        agent = {"User-Agent": ("Mozilla/5.0 " * 850).strip()}
        await self.send(attack, "GET", f"{self.target.tracking}/c/{token}", headers=agent)

    async def templates(self, attack: Attack) -> None:
        """Item 2: each bomb created and previewed (the ``read`` scope is enough for a
        preview); the markers' template also sent as a batch (its render checks them)."""
        bombs = [
            payloads.int_bomb_template(),
            payloads.memory_bomb_template(),
            payloads.compile_bomb_template(),
            payloads.markers_template(),
        ]
        for body in bombs:
            created = await self.api(attack, "POST", "/v1/templates", json=body)
            template_id = _field(created, "id")
            if template_id is None:
                continue
            preview = f"/v1/templates/{template_id}/preview"
            await self.api(attack, "POST", preview, json={"version": 1})
            if body["name"] == "markers":
                batch = payloads.template_batch(template_id)
                await self.api(attack, "POST", "/v1/batches", json=batch)

    async def mailgun_keys(self, attack: Attack) -> None:
        """Item 3: 10,000 substitution keys through Mailgun."""
        await self.api(attack, "POST", "/v1/batches", json=payloads.mailgun_batch())

    async def large_substitutions(self, attack: Attack) -> None:
        """Item 4: several 10 MB batches of large substitutions at once."""
        bodies = [payloads.large_substitutions_batch(i) for i in range(payloads.LARGE_BATCHES)]
        await asyncio.gather(
            *(self.api(attack, "POST", "/v1/batches", json=body) for body in bodies)
        )

    async def addresses(self, attack: Attack) -> None:
        """Header and address parsing: hostile names in every address and header."""
        await self.api(attack, "POST", "/v1/batches", json=payloads.hostile_addresses_batch())

    async def csv_imports(self, attack: Attack) -> None:
        """Item 5: a 50 MB import, then several at once (each into a list of its own)."""
        data = payloads.csv_file()
        await self._import(attack, data, "hostile import")
        await asyncio.gather(
            *(
                self._import(attack, data, f"hostile import {i}")
                for i in range(payloads.CSV_AT_ONCE)
            )
        )

    async def _import(self, attack: Attack, data: bytes, name: str) -> None:
        made = await self.api(attack, "POST", "/v1/lists", json={"name": name})
        list_id = _field(made, "id")
        if list_id is None:
            return
        headers = {"Content-Type": "text/csv"}
        await self.api(
            attack, "POST", f"/v1/lists/{list_id}/imports", content=data, headers=headers
        )

    async def webhooks(self, attack: Attack) -> None:
        """Hostile events to both receivers, signed as the providers would."""
        body = payloads.sendgrid_webhook()
        stamp = str(int(time.time()))
        key = signing.load_private_key(self.target.sendgrid_private_key)
        headers = {
            "X-Twilio-Email-Event-Webhook-Timestamp": stamp,
            "X-Twilio-Email-Event-Webhook-Signature": signing.sign_sendgrid(key, stamp, body),
        }
        await self.send(
            attack,
            "POST",
            f"{self.target.webhooks}/webhooks/sendgrid",
            content=body,
            headers=headers,
        )
        signature = signing.mailgun_signature(self.target.mailgun_signing_key, int(time.time()))
        await self.send(
            attack,
            "POST",
            f"{self.target.webhooks}/webhooks/mailgun",
            content=payloads.mailgun_webhook(signature),
            headers={"Content-Type": "application/json", "User-Agent": HOSTILE_AGENT},
        )


def _field(response: httpx.Response | None, name: str) -> str | None:
    """A string field of a JSON answer of 2xx, or None."""
    if response is None or not response.is_success:
        return None
    try:
        value = response.json().get(name)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


#: The attacks in the order they are reported.
ATTACKS: tuple[tuple[str, Callable[[Attacker, Attack], Awaitable[None]]], ...] = (
    ("click tracking (item 1)", Attacker.click_tracking),
    ("template bombs (item 2)", Attacker.templates),
    ("Mailgun 10k keys (item 3)", Attacker.mailgun_keys),
    ("10 MB substitutions x3 (item 4)", Attacker.large_substitutions),
    ("50 MB CSV, then x4 (item 5)", Attacker.csv_imports),
    ("hostile addresses and headers", Attacker.addresses),
    ("hostile webhooks", Attacker.webhooks),
)


async def run_all(attacker: Attacker, printer: Callable[[str], None]) -> list[tuple[str, Attack]]:
    """Every attack at once; each one's outcome in :data:`ATTACKS` order."""
    attacks = [(name, Attack(name)) for name, _ in ATTACKS]

    async def one(run: Callable[[Attacker, Attack], Awaitable[None]], attack: Attack) -> None:
        started = time.monotonic()
        await run(attacker, attack)
        summary = attack.summary()
        printer(
            f"{attack.name}: {summary['statuses']} in {time.monotonic() - started:.1f}s"
            + (f", {len(attack.errors)} without an answer" if attack.errors else "")
        )

    await asyncio.gather(
        *(one(run, attack) for (_, run), (_, attack) in zip(ATTACKS, attacks, strict=True))
    )
    return attacks
