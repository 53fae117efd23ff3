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
from typing import Literal

from shared.db import Database

Policy = Literal["open", "closed", "allowlist", "approval"]
Decision = Literal["admit", "pending", "refuse"]
RequestState = Literal["pending", "approved", "refused"]

#: The prefix of an organisation in ``SAFEDELIVR_SIGNUP_ALLOW``.
ORG_PREFIX = "org:"


@dataclass(frozen=True, slots=True)
class Allowlist:
    """GitHub logins and organisations admitted under ``allowlist`` (lower case)."""

    logins: frozenset[str] = frozenset()
    orgs: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str) -> Allowlist:
        """``"alice, Bob, org:acme"``: logins, and organisations after ``org:``."""
        entries = [e.strip().lower() for e in text.split(",") if e.strip()]
        return cls(
            logins=frozenset(e for e in entries if not e.startswith(ORG_PREFIX)),
            orgs=frozenset(e[len(ORG_PREFIX) :] for e in entries if e.startswith(ORG_PREFIX)),
        )

    def admits(self, login: str, orgs: Iterable[str]) -> bool:
        return login.lower() in self.logins or any(o.lower() in self.orgs for o in orgs)


def decide(
    policy: Policy,
    *,
    existing: bool,
    login: str,
    orgs: Iterable[str] = (),
    allowlist: Allowlist = Allowlist(),
    request: RequestState | None = None,
) -> Decision:
    """Whether a GitHub account that just logged in gets (or keeps) an account.

    ``existing``: the account already has a user; ``request``: the state of its sign-up
    request, if it made one (only ``approval`` reads it).
    """
    if existing or policy == "open":
        return "admit"
    if policy == "allowlist":
        return "admit" if allowlist.admits(login, orgs) else "refuse"
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

    async def answer(self, login: str, state: RequestState, operator: str) -> bool:
        """Approve or refuse the request of ``login``; False when there is none."""
        found = [r for r in await self.all() if r.login.lower() == login.lower()]
        if not found:
            return False
        await self.db.execute(
            "UPDATE signup_requests SET state = ?, decided_at = ?, decided_by = ? "
            "WHERE github_id = ?",
            (state, datetime.now(UTC), operator, found[0].github_id),
            idempotent=True,
        )
        return True

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
