"""Who may create an account by logging in with GitHub (``SAFEDELIVR_SIGNUP``), and the
requests waiting for an operator under ``approval``.

An account is what lets someone mint keys and send mail, so an open sign-up is an open
relay. :func:`decide` is the one rule, over plain data: an existing user is always let in
(they were admitted when they signed up), a newcomer by the policy. Nothing is written for a
newcomer who is not admitted, except under ``approval``, where their request is kept (in
``signup_requests``, owned by :class:`SignupRequests`) for an operator to answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from shared.infra import github_accounts
from shared.infra.db import Database

Policy = Literal["open", "closed", "allowlist", "approval"]
Decision = Literal["admit", "pending", "refuse"]
RequestState = Literal["pending", "approved", "refused"]


@dataclass(frozen=True, slots=True)
class Allowlist:
    """GitHub accounts and organisations admitted under ``allowlist``, by id: a login or an
    organisation's name can be renamed and then registered by anyone."""

    accounts: frozenset[int] = frozenset()
    orgs: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str) -> Allowlist:
        """``"583231, alice:1001, org:9919, org:acme:77"`` (see ``shared.infra.github_accounts``;
        the settings refuse anything else at start-up)."""
        found = github_accounts.parse_accounts(text, orgs=True)
        return cls(github_accounts.ids(found), github_accounts.ids(found, org=True))

    def admits(self, github_id: int, org_ids: Iterable[int]) -> bool:
        return github_id in self.accounts or any(o in self.orgs for o in org_ids)


def decide(
    policy: Policy,
    *,
    existing: bool,
    github_id: int,
    orgs: Iterable[int] = (),
    allowlist: Allowlist = Allowlist(),
    request: RequestState | None = None,
) -> Decision:
    """Whether a GitHub account that just logged in gets (or keeps) an account.

    ``existing``: the account already has a user; ``orgs``: the ids of its organisations;
    ``request``: the state of its sign-up request, if it made one (only ``approval`` reads it).
    """
    if existing or policy == "open":
        return "admit"
    if policy == "allowlist":
        return "admit" if allowlist.admits(github_id, orgs) else "refuse"
    if policy == "approval":
        if request == "approved":
            return "admit"
        return "refuse" if request == "refused" else "pending"
    return "refuse"


def needs_orgs(policy: Policy, allowlist: Allowlist) -> bool:
    """Whether deciding needs the account's organisations (a GitHub call and a scope)."""
    return policy == "allowlist" and bool(allowlist.orgs)


@dataclass(frozen=True, slots=True)
class SignupRequest:
    github_id: int
    login: str
    name: str | None
    email: str | None
    requested_at: datetime
    state: RequestState
    decided_by: str | None


class SignupQueue(Protocol):
    """What callers use of :class:`SignupRequests` (its twin: ``tests/fakes/accounts.py``)."""

    async def state(self, github_id: int) -> RequestState | None: ...

    async def ask(
        self, github_id: int, login: str, name: str | None, email: str | None
    ) -> None: ...

    async def answer(self, github_id: int, state: RequestState, operator: str) -> bool: ...

    async def done(self, github_id: int) -> None: ...

    async def all(self, limit: int = 1000) -> list[SignupRequest]: ...


class SignupRequests:
    """The ``signup_requests`` table."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def state(self, github_id: int) -> RequestState | None:
        row = await self.db.one(
            "SELECT state FROM signup_requests WHERE github_id = ?", (github_id,)
        )
        return row["state"] if row else None

    async def ask(self, github_id: int, login: str, name: str | None, email: str | None) -> None:
        """Record a pending request once; asking again keeps the first time and any answer."""
        await self.db.one(
            "INSERT INTO signup_requests (github_id, login, name, email, requested_at, state) "
            "VALUES (?, ?, ?, ?, ?, 'pending') IF NOT EXISTS",
            (github_id, login, name, email, datetime.now(UTC)),
        )

    async def answer(self, github_id: int, state: RequestState, operator: str) -> bool:
        """Approve or refuse the request of the account ``github_id``; False when there is
        none. By id: two requests may carry one login (an account renamed after asking, and
        another that took the name), and the operator answers the one they looked at."""
        row = await self.db.one(
            "UPDATE signup_requests SET state = ?, decided_at = ?, decided_by = ? "
            "WHERE github_id = ? IF EXISTS",
            (state, datetime.now(UTC), operator, github_id),
        )
        return bool(row and row["[applied]"])

    async def done(self, github_id: int) -> None:
        """The approved account signed up: the request has served its purpose."""
        await self.db.execute(
            "DELETE FROM signup_requests WHERE github_id = ?", (github_id,), idempotent=True
        )

    async def all(self, limit: int = 1000) -> list[SignupRequest]:
        """Every open request, oldest first (the table holds only unanswered sign-ups and
        expires them, so it stays small)."""
        rows = await self.db.rows(
            "SELECT github_id, login, name, email, requested_at, state, decided_by "
            "FROM signup_requests LIMIT ?",
            (limit,),
        )
        requests = [
            SignupRequest(
                github_id=r["github_id"],
                login=r["login"],
                name=r["name"],
                email=r["email"],
                requested_at=r["requested_at"].replace(tzinfo=UTC),
                state=r["state"],
                decided_by=r["decided_by"],
            )
            for r in rows
        ]
        return sorted(requests, key=lambda r: r.requested_at)
