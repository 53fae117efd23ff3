"""The benchmark's workload: a realistic ``POST /v1/batches`` body and the batches built from it.

Every process of the run (load generator, raw loops, feeder) uses this module, so the API and
the raw baselines store and send exactly the same data. A batch is a personalised (``bulk``)
newsletter: sender and reply-to with names, a subject and a ~1.5 kB text and ~4 kB HTML body
with two substitution keys, one custom header, a category and metadata, and ``N`` recipients
with a name and two substitutions each (N=100: a ~19 kB request). Recipients come from a pool
of :data:`POOL` addresses in rotating windows, as a mailing list sent in batches would.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
from cassandra.util import uuid_from_time

from shared.core.models import Chunk, Message, Recipient
from shared.delivery import validation
from shared.delivery.batchstore import NewBatch
from shared.providers.limits import chunk_size

#: Distinct recipient addresses the batches draw from.
POOL = 20_000
#: Distinct request bodies (address windows) each process prepares and rotates through.
VARIANTS = 16
_DOMAINS = ("example.com", "example.org", "mail.example.net", "inbox.example.io")
_PARAGRAPH = (
    "This week we picked a few things we think you will like, from new arrivals to the "
    "last pieces of the season. Prices are valid until Sunday while stock lasts. "
)
_TEXT = "Hi {{first_name}},\n\n" + _PARAGRAPH * 8 + "\nYour code: {{coupon}}\n\nExample Shop\n"
_HTML = (
    "<!doctype html><html><body style='font-family:sans-serif'>"
    "<h1>Hi {{first_name}}</h1>"
    + "".join(
        f"<p>{_PARAGRAPH}<a href='https://shop.example.com/p/{i}'>See more</a></p>"
        for i in range(14)
    )
    + "<p>Your code: <b>{{coupon}}</b></p><p>Example Shop</p></body></html>"
)
#: Node and clock sequence of deterministic log ids (see :func:`log_ids`).
LOG_ID_NODE = 0x5AFEDE11BE9C


def address(k: int) -> str:
    k %= POOL
    return f"reader{k:05d}@{_DOMAINS[k % len(_DOMAINS)]}"


def request_body(variant: int, recipients: int, priority: str | None = None) -> dict[str, Any]:
    """The JSON body of one ``POST /v1/batches`` with ``recipients`` distinct recipients."""
    first = variant * recipients
    lane = {} if priority is None else {"priority": priority}
    return {
        **lane,
        "from": {"email": "news@shop.example.com", "name": "Example Shop"},
        "reply_to": {"email": "care@shop.example.com", "name": "Example Shop Care"},
        "subject": "This week's picks for you",
        "text": _TEXT,
        "html": _HTML,
        "headers": {"X-Campaign": "weekly-picks"},
        "categories": ["newsletter"],
        "metadata": {"campaign": "weekly-picks", "source": "bench"},
        "bulk": True,
        "to": [
            {
                "email": address(first + i),
                "name": f"Reader {(first + i) % POOL}",
                "substitutions": {
                    "{{first_name}}": f"Reader{(first + i) % POOL}",
                    "{{coupon}}": f"C{(first + i) % POOL:06d}",
                },
            }
            for i in range(recipients)
        ],
    }


def encoded_bodies(recipients: int, variants: int = VARIANTS) -> list[bytes]:
    return [orjson.dumps(request_body(v, recipients)) for v in range(variants)]


def log_ids(batch_time: float, count: int) -> list[uuid.UUID]:
    """Time-based log ids that can be recomputed from the batch's time: the same timestamp
    and node, clock sequence = index (what ``uuid_from_time(t, node, clock_seq=i)`` gives;
    the 14-bit clock sequence sits at bits 48-61, under the variant bits)."""
    if count > 1 << 14:
        raise ValueError("at most 16,384 recipients per replayable batch")
    base = uuid_from_time(batch_time, node=LOG_ID_NODE, clock_seq=0).int
    return [uuid.UUID(int=base | (i << 48)) for i in range(count)]


class BatchFactory:
    """Builds :class:`NewBatch` objects exactly as ``services.api.batches._accept`` does."""

    def __init__(
        self,
        recipients: int,
        chain: Sequence[str],
        variants: int = VARIANTS,
        *,
        priority: str | None = None,
    ) -> None:
        self.size = recipients
        self._parsed = [
            validation.parse_batch_request(
                request_body(v, recipients, priority), max_recipients=max(recipients, 1)
            )
            for v in range(variants)
        ]
        message = self._parsed[0].message
        self.chunk_size = chunk_size(chain, copies=len(message.cc) + len(message.bcc))

    @property
    def message(self) -> Message:
        return self._parsed[0].message

    def new(self, seq: int, user_id: uuid.UUID) -> NewBatch:
        """Batch ``seq`` with fresh time-based ids, as the API would build it."""
        parsed = self._parsed[seq % len(self._parsed)]
        now = time.time()
        recipients = [
            Recipient(
                log_id=uuid_from_time(now),
                email=r.email,
                name=r.name,
                substitutions=dict(r.substitutions),
            )
            for r in parsed.recipients
        ]
        return NewBatch(
            batch_id=uuid_from_time(now),
            user_id=user_id,
            message=parsed.message,
            recipients=recipients,
            chunk_size=self.chunk_size,
        )

    def recipients(self, seq: int, batch_time: float) -> list[Recipient]:
        """Recipients of batch ``seq`` with deterministic log ids (see :func:`log_ids`)."""
        parsed = self._parsed[seq % len(self._parsed)]
        ids = log_ids(batch_time, len(parsed.recipients))
        return [
            Recipient(
                log_id=log_id, email=r.email, name=r.name, substitutions=dict(r.substitutions)
            )
            for log_id, r in zip(ids, parsed.recipients, strict=True)
        ]

    def new_replayable(self, seq: int, user_id: uuid.UUID) -> tuple[NewBatch, float]:
        """Batch ``seq`` whose recipients :meth:`recipients` can rebuild from the returned time."""
        batch_time = time.time()
        return (
            NewBatch(
                batch_id=uuid_from_time(batch_time),
                user_id=user_id,
                message=self.message,
                recipients=self.recipients(seq, batch_time),
                chunk_size=self.chunk_size,
            ),
            batch_time,
        )

    def chunk(self, seq: int, batch_id: uuid.UUID, batch_time: float, index: int) -> Chunk:
        """Chunk ``index`` of a replayable batch, built without validation (the raw loop's
        least work; the dispatcher builds and validates the same chunk from its rows)."""
        parsed = self._parsed[seq % len(self._parsed)]
        ids = log_ids(batch_time, len(parsed.recipients))
        lo, hi = index * self.chunk_size, (index + 1) * self.chunk_size
        recipients = tuple(
            Recipient.model_construct(
                log_id=log_id, email=r.email, name=r.name, substitutions=dict(r.substitutions)
            )
            for log_id, r in zip(ids[lo:hi], parsed.recipients[lo:hi], strict=True)
        )
        return Chunk.model_construct(
            batch_id=batch_id, index=index, message=self.message, recipients=recipients
        )
