"""Each user's suppression list: addresses never sent to again (hard bounce, complaint,
unsubscribe, or added by hand), with the reason, the source event and the time; and the
suppressions of one list or campaign (``scope``: an unsubscribe from mail that named a list
stops only mail naming that list). The one writer of ``suppressions`` and
``list_suppressions``.

Who may lift an entry
---------------------
An unsubscribe or a complaint is the recipient withdrawing their consent: it is theirs, and
a sender who could delete it (a ``send`` key) could mail them again at once. So an entry the
recipient made (``by_recipient``: ``unsubscribed``, ``complained``) is lifted only by an
operator (an ``operator`` key; the recipient has no page to subscribe again yet). The mark
is written only by the recipient's events and no later write of the row clears it (a
sender's own ``POST /v1/suppressions``, a bounce), so re-adding an address by hand does not
make its suppression the sender's. A sender still lifts what they added themselves, and
bounces: a bounce is a fact about the mailbox that can stop being true (a typo fixed, a
mailbox restored, a block misread as a bounce), the next hard bounce suppresses it again,
and a sender whose bounce rate rises is slowed by its domains' capacity
(``shared.delivery.domain_capacity``); the cost of a mistake is one more bounce, not mail a person
asked not to get. Entries written before the mark existed are judged by their source and
reason (:func:`by_recipient`); a SendGrid drop for its own list, whose reason we did not
keep, counts as the recipient's (``provider_list``).

Deleting is the version read (the row's write time): an unsubscribe landing between the
check and the delete writes a newer row, which survives.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from shared.core.addresses import address_key
from shared.core.catalog import TRACKER
from shared.infra.db import Database

#: Addresses looked up per query when checking a batch's recipients.
LOOKUP_CHUNK = 100
#: Addresses looked up per query at send time: a provider request's most (to, cc and bcc
#: together, ``shared.providers.limits``), so one chunk's check is one read of one partition.
SEND_LOOKUP = 1000
#: Sources of the entries a sender made by hand.
SENDER_SOURCES: Final = frozenset({"api", "dashboard"})
#: What each recipient-made mark means, in a refusal to lift it.
_MADE: Final = {
    "unsubscribed": "unsubscribed from your mail",
    "complained": "reported your mail as spam",
    "provider_list": "is on a provider's own unsubscribe, complaint or bounce list (it did "
    "not say which)",
}


def by_recipient(kind: str, raw_event: str, reason: str | None = None) -> str | None:
    """The recipient's own act behind a suppressing event (``unsubscribed``,
    ``complained``), or None (a bounce). A provider dropping mail for its own list says
    which list in its reason (SendGrid ``Unsubscribed Address``, Mailgun
    ``suppress-complaint``)."""
    if kind in ("unsubscribed", "complained"):
        return kind
    if kind != "dropped":
        return None
    said = f"{raw_event} {reason or ''}".lower()
    if "unsubscribe" in said:
        return "unsubscribed"
    if "complain" in said or "spam report" in said:
        return "complained"
    return None


def made_by_recipient(entry: Mapping[str, Any]) -> str | None:
    """The recipient's act behind a stored entry: its mark, or for an entry written before
    marks existed, what its source and reason say (None: the sender's own, or a bounce)."""
    mark = entry.get("by_recipient")
    if mark:
        return str(mark)
    source, reason = str(entry.get("source") or ""), str(entry.get("reason") or "").lower()
    if source in SENDER_SOURCES:
        return None
    if source == TRACKER or "unsubscribe" in reason:
        return "unsubscribed"
    if "complain" in reason or "spamreport" in reason:
        return "complained"
    if reason == "dropped":  # SendGrid's drop for its own list; which one was not kept
        return "provider_list"
    return None


def lift_refusal(entry: Mapping[str, Any], *, operator: bool) -> str | None:
    """Why the holder of a ``send`` key (``operator``: of an operator key) may not lift
    ``entry``, or None when they may (see the module docstring)."""
    made = made_by_recipient(entry)
    if made is None or operator:
        return None
    what = _MADE.get(made, made)
    return (
        f"{entry.get('email')} {what}: a suppression the recipient made is theirs, only an "
        "operator may lift it"
    )


class SuppressionChecks(Protocol):
    """What the send and webhook paths use of :class:`SuppressionStore` (the store, or its
    in-memory twins): record a suppression, check addresses against the list."""

    async def add(
        self,
        user_id: uuid.UUID,
        email: str,
        *,
        reason: str,
        source: str,
        event_id: str | None = None,
        at: datetime | None = None,
        scope: str | None = None,
        by_recipient: str | None = None,
    ) -> None: ...

    async def suppressed(
        self,
        user_id: uuid.UUID,
        emails: Iterable[str],
        scope: str | None = None,
        *,
        per_query: int = LOOKUP_CHUNK,
    ) -> dict[str, str]: ...

    async def listed(
        self, user_id: uuid.UUID, most: int, scope: str | None = None
    ) -> dict[str, str] | None: ...


class Suppressions(SuppressionChecks, Protocol):
    """All that callers use of :class:`SuppressionStore` (the store, or its in-memory twin):
    the checks, and reading and lifting single entries."""

    async def entry(
        self, user_id: uuid.UUID, email: str, scope: str | None = None
    ) -> dict[str, Any] | None: ...

    async def forget(
        self, user_id: uuid.UUID, email: str, scope: str | None = None, *, version: int
    ) -> None: ...

    async def remove(self, user_id: uuid.UUID, email: str, scope: str | None = None) -> bool: ...

    async def page(
        self, user_id: uuid.UUID, limit: int, after: str | None, scope: str | None = None
    ) -> list[dict[str, Any]]: ...


class SuppressionStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(
        self,
        user_id: uuid.UUID,
        email: str,
        *,
        reason: str,
        source: str,
        event_id: str | None = None,
        at: datetime | None = None,
        scope: str | None = None,
        by_recipient: str | None = None,
    ) -> None:
        """Put ``email`` on the list (again: the newest reason wins). ``by_recipient`` marks
        an entry the recipient made; a write without it leaves an earlier mark as it is."""
        table, _, key = _where(user_id, scope)
        columns = ["user_id", *(["scope"] if scope is not None else []), "email", "reason"]
        columns += ["source", "event_id", "created_at"]
        values = [*key, address_key(email), reason, source, event_id or "", at or datetime.now(UTC)]
        if by_recipient is not None:
            columns.append("by_recipient")
            values.append(by_recipient)
        await self.db.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) "  # noqa: S608 - fixed names
            f"VALUES ({', '.join('?' * len(columns))})",
            tuple(values),
            idempotent=True,
        )

    async def entry(
        self, user_id: uuid.UUID, email: str, scope: str | None = None
    ) -> dict[str, Any] | None:
        """The entry of ``email`` (as :meth:`page` lists it, with its ``version``: the write
        time of its newest write), or None."""
        table, where, key = _where(user_id, scope)
        row = await self.db.one(
            f"SELECT {_COLUMNS}, WRITETIME(reason) AS version FROM {table} "  # noqa: S608
            f"WHERE {where} AND email = ?",
            (*key, address_key(email)),
        )
        return dict(row) if row is not None else None

    async def forget(
        self, user_id: uuid.UUID, email: str, scope: str | None = None, *, version: int
    ) -> None:
        """Delete the entry as it was at ``version`` (:meth:`entry`'s): a write after it (a
        new unsubscribe) survives the delete."""
        table, where, key = _where(user_id, scope)
        await self.db.execute(
            f"DELETE FROM {table} USING TIMESTAMP ? "  # noqa: S608 - fixed names
            f"WHERE {where} AND email = ?",
            (version, *key, address_key(email)),
            idempotent=True,
        )

    async def remove(self, user_id: uuid.UUID, email: str, scope: str | None = None) -> bool:
        """Delete the entry of ``email`` whoever made it; False when there was none."""
        found = await self.entry(user_id, email, scope)
        if found is None:
            return False
        await self.forget(user_id, email, scope, version=int(found["version"]))
        return True

    async def suppressed(
        self,
        user_id: uuid.UUID,
        emails: Iterable[str],
        scope: str | None = None,
        *,
        per_query: int = LOOKUP_CHUNK,
    ) -> dict[str, str]:
        """The subset of ``emails`` (compared lower-case) on the list, or on the list of
        ``scope``, with their reasons; ``per_query`` addresses are asked per query (of the
        user's partition; a second query per part for ``scope``)."""
        wanted = sorted({address_key(e) for e in emails})
        found: dict[str, str] = {}
        for i in range(0, len(wanted), per_query):
            part = wanted[i : i + per_query]
            rows = await self.db.rows(
                "SELECT email, reason FROM suppressions WHERE user_id = ? AND email IN ?",
                (user_id, part),
            )
            found.update({r["email"]: r["reason"] for r in rows})
            if scope is not None:
                rows = await self.db.rows(
                    "SELECT email, reason FROM list_suppressions WHERE user_id = ? "
                    "AND scope = ? AND email IN ?",
                    (user_id, scope, part),
                )
                found.update(
                    {
                        r["email"]: f"{r['reason']} ({scope})"
                        for r in rows
                        if r["email"] not in found
                    }
                )
        return found

    async def listed(
        self, user_id: uuid.UUID, most: int, scope: str | None = None
    ) -> dict[str, str] | None:
        """The whole list (or ``scope``'s): address key -> reason, read in one query of at
        most ``most + 1`` rows; None when it holds more than ``most`` entries."""
        table, where, key = _where(user_id, scope)
        rows = await self.db.rows(
            f"SELECT email, reason FROM {table} WHERE {where} LIMIT ?",  # noqa: S608
            (*key, most + 1),
            page_size=most + 1,
        )
        if len(rows) > most:
            return None
        return {r["email"]: r["reason"] for r in rows}

    async def page(
        self, user_id: uuid.UUID, limit: int, after: str | None, scope: str | None = None
    ) -> list[dict[str, Any]]:
        table, where, key = _where(user_id, scope)
        query = f"SELECT {_COLUMNS} FROM {table} WHERE {where}"  # noqa: S608 - fixed names
        params: tuple[Any, ...] = key
        if after:
            query += " AND email > ?"
            params += (after,)
        return await self.db.rows(query + " LIMIT ?", (*params, limit))


#: The columns of an entry as it is listed.
_COLUMNS: Final = "email, reason, source, event_id, created_at, by_recipient"


def _where(user_id: uuid.UUID, scope: str | None) -> tuple[str, str, tuple[Any, ...]]:
    """The table, partition condition and its values of the whole list or one list's."""
    if scope is None:
        return "suppressions", "user_id = ?", (user_id,)
    return "list_suppressions", "user_id = ? AND scope = ?", (user_id, scope)
