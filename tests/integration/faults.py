"""Faults injected in tests: Cassandra's at our driver boundary, for the unknown-outcome
cases, and RabbitMQ stopped and started again (healed after: see ``start_rabbitmq_app``).

:class:`FaultyDatabase` shares a real session (every statement really runs against
Cassandra) but, for statements matching a rule, raises what a timeout raises: after running
the statement (the write applied, the client never heard: an LWT "timed out but applied") or
instead of running it (a write that never happened). This is how a coordinator timeout looks
to us, and no test can produce one on demand otherwise.
"""

from __future__ import annotations

import asyncio
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cassandra.query import BatchStatement

from shared.core.errors import DependencyUnavailable
from shared.infra.db import Database, Page, Params

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Rule:
    contains: str
    """Fires for statements whose CQL contains this text."""
    applied: bool
    """Whether the statement runs before the failure (outcome: applied, reported failed)."""
    times: int = 1
    fired: int = 0


class FaultyDatabase(Database):
    """A :class:`Database` on the same session whose matching statements time out."""

    def __init__(self, real: Database, *rules: Rule) -> None:
        super().__init__(real.cluster, real.session, real.keyspace)
        self._prepared = real._prepared
        self.rules = list(rules)

    async def execute(self, query: Any, params: Params = None, **kw: Any) -> Page:
        rule = self._rule(query)
        if rule is None:
            return await super().execute(query, params, **kw)
        rule.fired += 1
        if rule.applied:
            await super().execute(query, params, **kw)
        raise DependencyUnavailable("cassandra", "WriteTimeout (injected)")

    def _rule(self, query: Any) -> Rule | None:
        text = self._text(query)
        for rule in self.rules:
            if rule.contains in text and rule.fired < rule.times:
                return rule
        return None

    def _text(self, query: Any) -> str:
        """The CQL of a statement, or of every statement in a batch of prepared ones."""
        if isinstance(query, str):
            return query
        if isinstance(query, BatchStatement):
            by_id = {p.query_id: cql for cql, p in self._prepared.items()}
            return "\n".join(by_id.get(q, "") for _, q, _ in query._statements_and_parameters)
        return ""


def after(contains: str, times: int = 1) -> Rule:
    """The matching statement applies, then the client hears a timeout."""
    return Rule(contains, applied=True, times=times)


def before(contains: str, times: int = 1) -> Rule:
    """The matching statement times out without applying."""
    return Rule(contains, applied=False, times=times)


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


async def stop_rabbitmq_app() -> None:
    """Every connection to RabbitMQ drops and no new one is accepted (the node stays up)."""
    await asyncio.to_thread(rabbitmqctl, "stop_app")


async def start_rabbitmq_app() -> None:
    """RabbitMQ back, and healed: 3.10 can come back with its dead-letter supervisor stopped,
    which breaks every later test on this broker (``deploy/local/rabbitmq.sh heal``)."""
    await asyncio.to_thread(rabbitmqctl, "start_app")
    await asyncio.to_thread(
        subprocess.run,
        ["bash", str(ROOT / "deploy" / "local" / "rabbitmq.sh"), "heal"],
        check=True,
        timeout=120,
    )
