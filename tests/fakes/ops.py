"""Twins of the stores of :mod:`shared.ops`: the live settings with their audit
(:class:`FakeSettings`) and the dead-letter archive (:class:`FakeLetters`).

They keep the Cassandra semantics their callers depend on:

* every round trip yields to the event loop, so concurrent callers interleave where they
  would in production, and a lightweight transaction applies only when its condition holds
  at that moment (a letter archived twice is stored once; a claim, a finish or a release
  lands only for the owner, or the state, it names);
* timestamps come back as Cassandra returns them: aware UTC, millisecond precision;
* the audit reads newest first and the archive in its clustering order (newest death first,
  then the id, descending), as the tables' ``CLUSTERING ORDER BY`` has them.

The canonical form of a setting comes from the production :func:`shared.ops.livesettings.check`,
so a twin cannot store a value the real store refuses. ``tests/contracts/test_ops_stores.py``
runs one suite over each twin and its real store.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from shared.ops.deadletters import REPLAY_LEASE, Letter, LetterArchive, parse_id
from shared.ops.livesettings import Change, StoredSettings, check
from tests.fakes.cassandra import interleave, ms


@dataclass
class FakeSettings(StoredSettings):
    """``live_settings`` and ``settings_audit`` for one scope (a deployment's exchange)."""

    scope: str
    values: dict[str, str] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    """The audit, oldest first (read back newest first)."""

    async def stored(self) -> dict[str, str]:
        await interleave()
        return dict(self.values)

    async def change(self, changes: Mapping[str, str], by: str) -> list[Change]:
        done: list[Change] = []
        for name, raw in changes.items():
            value = check(name, raw)
            await interleave()
            old = self.values.get(name)
            if old == value:
                continue
            now = datetime.now(UTC)
            await interleave()
            self.values[name] = value
            await interleave()
            self.changes.append(Change(name, old, value, by, ms(now)))
            done.append(Change(name, old, value, by, now))
        return done

    async def audit(self, limit: int = 50) -> list[Change]:
        await interleave()
        return list(reversed(self.changes))[:limit]


@dataclass
class _Claim:
    owner: uuid.UUID
    until: datetime


@dataclass
class FakeLetters(LetterArchive):
    """The ``dead_letters`` table: one partition, newest death first."""

    letters: dict[str, Letter] = field(default_factory=dict)
    claims: dict[str, _Claim] = field(default_factory=dict)

    def _ordered(self) -> list[Letter]:
        return sorted(self.letters.values(), key=lambda x: (x.dead_at, x.id), reverse=True)

    async def archive(self, letter: Letter) -> bool:
        await interleave()
        if letter.id in self.letters:
            return False
        self.letters[letter.id] = dataclasses.replace(
            letter,
            dead_at=ms(letter.dead_at),
            archived_at=ms(letter.archived_at),
            state="waiting",
            replayed_at=None,
        )
        return True

    async def page(self, limit: int, after: str | None = None) -> list[Letter]:
        await interleave()
        key = parse_id(after) if after else None
        ordered = self._ordered()
        if key is not None:
            cursor = self.letters.get(key[1])
            at = cursor.dead_at if cursor is not None else key[0]
            ordered = [x for x in ordered if (x.dead_at, x.id) < (at, key[1])]
        return ordered[:limit]

    async def get(self, letter_id: str) -> Letter | None:
        await interleave()
        key = parse_id(letter_id)
        found = self.letters.get(letter_id)
        return found if key is not None and found is not None else None

    async def claim(self, letter: Letter, owner: uuid.UUID, now: datetime) -> bool:
        await interleave()
        stored = self.letters.get(letter.id)
        if stored is None:
            return False  # no resurrection: a deleted letter stays deleted
        held = self.claims.get(letter.id)
        if stored.state == "waiting" or (
            stored.state == "replaying" and held is not None and held.until < now
        ):
            self.claims[letter.id] = _Claim(owner, ms(now + REPLAY_LEASE))
            self.letters[letter.id] = dataclasses.replace(stored, state="replaying")
            return True
        return False

    async def finish(self, letter: Letter, owner: uuid.UUID, now: datetime) -> None:
        await interleave()
        stored, held = self.letters.get(letter.id), self.claims.get(letter.id)
        if stored is not None and held is not None and held.owner == owner:
            self.letters[letter.id] = dataclasses.replace(
                stored, state="replayed", replayed_at=ms(now)
            )

    async def release(self, letter: Letter, owner: uuid.UUID) -> None:
        await interleave()
        stored, held = self.letters.get(letter.id), self.claims.get(letter.id)
        if stored is not None and held is not None and held.owner == owner:
            del self.claims[letter.id]
            self.letters[letter.id] = dataclasses.replace(stored, state="waiting")

    async def delete(self, letter_id: str) -> bool:
        await interleave()
        if parse_id(letter_id) is None or letter_id not in self.letters:
            return False
        del self.letters[letter_id]
        self.claims.pop(letter_id, None)
        return True

    async def waiting(self) -> int:
        await interleave()
        return sum(1 for x in self.letters.values() if x.state != "replayed")
