"""What every fuzzing phase shares: :class:`Tally`, which counts each answer by route and
status class where the app sees it, :func:`settings_for`, Hypothesis settings with a seed, and
:func:`new_sender`, the user the requests come from."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import seed as hypothesis_seed
from starlette.routing import Match

from shared.accounts import accounts
from shared.accounts.apikeys import SCOPES
from shared.accounts.domains import DomainStore
from shared.infra.db import Database


class Tally:
    """ASGI middleware: every answer, by route template and status class."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.counts: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.failures: list[str] = []

    def route_of(self, scope: dict[str, Any]) -> str:
        for route in getattr(self.app, "routes", ()):
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return f"{scope['method']} {getattr(route, 'path', '?')}"
        return f"{scope['method']} (no route)"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self.route_of(scope)

        async def counting(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                self.counts[route][f"{status // 100}xx"] += 1
                if status >= 500:
                    self.failures.append(f"{route}: {status}")
            await send(message)

        await self.app(scope, receive, counting)

    def summary(self) -> dict[str, Any]:
        return {
            "requests": sum(sum(c.values()) for c in self.counts.values()),
            "server_errors": len(self.failures),
            "by_route": {route: dict(c) for route, c in sorted(self.counts.items())},
            "first_failures": self.failures[:20],
        }


def settings_for(examples: int, seed: int) -> Callable[[Any], Any]:
    def apply(test: Any) -> Any:
        seeded = settings(
            max_examples=examples,
            database=None,
            derandomize=False,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )(test)
        return hypothesis_seed(seed)(seeded)

    return apply


async def new_sender(db: Database, login: str) -> tuple[uuid.UUID, str]:
    """A new user who may send from example.com, and a key of theirs with every scope."""
    user = await accounts.ensure_user(db, f"{login}-{uuid.uuid4().hex[:8]}")
    domains = DomainStore(db)
    await domains.add(user, "example.com")
    await domains.mark_verified(user, "example.com")
    return user, await accounts.create_key(db, user, "fuzz", scopes=SCOPES)
