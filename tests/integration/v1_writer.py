"""The writes of data model v1 (main before data model v2, commit fc763f5), frozen here so a
test can store a keyspace exactly as that release did and upgrade it.

Only the statements are copied; their values follow the same rules: one recipient row per
recipient at the ``queued`` stamp, the address index, ``queued`` marks, outcome marks with the
state's stamp (and the opposite mark deleted), engagement marks.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from shared.core import batch_ids
from shared.core.models import Message
from shared.delivery import precedence
from shared.delivery.recipients import log_id_for
from shared.delivery.stats import batch_day
from shared.infra.db import Database


@dataclass(frozen=True)
class V1Recipient:
    email: str
    name: str | None = None
    substitutions: str | None = None


class V1Writer:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def batch(
        self,
        batch_id: uuid.UUID,
        user_id: uuid.UUID,
        message: Message,
        recipients: list[V1Recipient],
    ) -> dict[str, uuid.UUID]:
        created = batch_ids.accepted_at(batch_id)
        queued = precedence.queued_stamp(batch_id)
        header_stamp = int(created.timestamp() * 1_000_000)
        await self.db.execute(
            "INSERT INTO batches (batch_id, user_id, created_at, subject, message, "
            "recipient_count, chunk_size, chunk_count, status, updated_at, accept_response) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'accepted', ?, ?) USING TIMESTAMP ?",
            (
                batch_id,
                user_id,
                created,
                message.subject,
                message.encode(),
                len(recipients),
                2,
                -(-len(recipients) // 2),
                created,
                b"{}",
                header_stamp,
            ),
        )
        ids = {}
        for i, r in enumerate(recipients):
            log_id = log_id_for(batch_id, r.email)
            ids[r.email] = log_id
            await self.db.execute(
                "INSERT INTO batches (batch_id, chunk, log_id, email, name, substitutions, "
                "state, event, last_update) VALUES (?, ?, ?, ?, ?, ?, 'queued', 'queued', ?) "
                "USING TIMESTAMP ?",
                (batch_id, i // 2, log_id, r.email, r.name, r.substitutions, created, queued),
            )
            await self.db.execute(
                "INSERT INTO batch_emails (batch_id, email, chunk, log_id) VALUES (?, ?, ?, ?)",
                (batch_id, r.email.lower(), i // 2, log_id),
            )
            await self.mark(user_id, batch_id, "queued", log_id)
        await self.db.execute(
            "INSERT INTO batches_by_user (user_id, month, batch_id, subject, recipient_count) "
            "VALUES (?, ?, ?, ?, ?)",
            (user_id, created.strftime("%Y-%m"), batch_id, message.subject, len(recipients)),
        )
        return ids

    async def mark(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, metric: str, key: uuid.UUID
    ) -> None:
        await self.db.execute(
            "INSERT INTO stat_marks (user_id, day, metric, key) VALUES (?, ?, ?, ?)",
            (user_id, batch_day(batch_id), metric, str(key)),
        )

    async def sent(
        self, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID, provider: str, when: datetime
    ) -> None:
        await self.db.execute(
            "UPDATE batches USING TIMESTAMP ? SET evidence = evidence + ?, event = ?, "
            "last_update = ?, providers[?] = ?, message_ids[?] = ? "
            "WHERE batch_id = ? AND chunk = ? AND log_id = ?",
            (
                precedence.provider_stamp(batch_id, when, 0),
                {"c.0"},
                "sent",
                when,
                provider,
                "sent",
                provider,
                "msg-1",
                batch_id,
                chunk,
                log_id,
            ),
        )

    async def outcome(
        self,
        user_id: uuid.UUID,
        batch_id: uuid.UUID,
        chunk: int,
        log_id: uuid.UUID,
        *,
        event: str,
        state: str,
        rank: int,
        when: datetime,
    ) -> None:
        stamp = precedence.provider_stamp(batch_id, when, rank)
        await self.db.execute(
            "UPDATE batches USING TIMESTAMP ? SET event = ?, last_update = ?, state = ? "
            "WHERE batch_id = ? AND chunk = ? AND log_id = ?",
            (stamp, event, when, state, batch_id, chunk, log_id),
        )
        other = "failed" if state == "success" else "success"
        day = batch_day(batch_id)
        await self.db.execute(
            "INSERT INTO stat_marks (user_id, day, metric, key) VALUES (?, ?, ?, ?) "
            "USING TIMESTAMP ?",
            (user_id, day, state, str(log_id), stamp),
        )
        await self.db.execute(
            "DELETE FROM stat_marks USING TIMESTAMP ? "
            "WHERE user_id = ? AND day = ? AND metric = ? AND key = ?",
            (stamp, user_id, day, other, str(log_id)),
        )

    async def give_up(
        self, user_id: uuid.UUID, batch_id: uuid.UUID, chunk: int, log_id: uuid.UUID, when: datetime
    ) -> None:
        stamp = precedence.give_up_stamp(batch_id)
        await self.db.execute(
            "UPDATE batches USING TIMESTAMP ? SET gave_up_reason = ?, gave_up_at = ? "
            "WHERE batch_id = ? AND chunk = ? AND log_id = ?",
            (stamp, "every provider failed", when, batch_id, chunk, log_id),
        )
        await self.db.execute(
            "INSERT INTO stat_marks (user_id, day, metric, key) VALUES (?, ?, ?, ?) "
            "USING TIMESTAMP ?",
            (user_id, batch_day(batch_id), "failed", str(log_id), stamp),
        )
