"""Crash-proof acceptance: whatever fails or dies, a client retrying with its Idempotency-Key
gets exactly one batch id, and the batch is sent exactly once; a batch the client was told
failed (a 5xx without a key) is never sent."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import orjson
import pytest
from cassandra.query import Statement
from cassandra.util import uuid_from_time

from services.api.idempotency import IdempotencyStore
from services.api.sending import build_batch
from shared.core.errors import DependencyUnavailable
from shared.delivery import validation
from shared.delivery.acceptance import Acceptance
from shared.delivery.batchstore import BatchStore, Content, NewBatch
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.integration.faults import FaultyDatabase, before
from tests.integration.harness import eventually
from tests.integration.stack import Stack, emails, fast_settings, full_stack


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    fast = fast_settings(settings)
    fast = fast.model_copy(
        update={
            "api": fast.api.model_copy(
                update={"outbox_grace": 0.3, "outbox_relay_interval": 0.2, "commit_budget": 3.0}
            )
        }
    )
    async with full_stack(fast, db) as s:
        yield s


def _body(to: list[str]) -> bytes:
    return orjson.dumps({"from": "shop@example.com", "to": to, "subject": "Hi", "text": "Hello"})


async def _post(stack: Stack, raw: bytes, key: str | None) -> tuple[int, dict[str, object]]:
    headers = {**stack.auth, "Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    resp = await stack.api.post("/v1/batches", content=raw, headers=headers)
    return resp.status_code, resp.json()


async def _sent_once(stack: Stack, batch_id: str, to: list[str]) -> None:
    async with stack.consuming():
        logs = await stack.final(batch_id, len(to))
    for email in to:
        assert logs[email]["state"] == "success"
        assert sum((await stack.accepted(email)).values()) == 1


async def test_api_killed_after_claiming_the_key_the_retry_finishes_the_same_batch(
    stack: Stack,
) -> None:
    """The holder of a key died before storing anything: a retry gets 409 with Retry-After
    while its lease runs, then takes the claim over and stores the batch under the id the
    claim fixed."""
    to = emails(2)
    raw, key = _body(to), uuid.uuid4().hex
    claimed_id = uuid_from_time(time.time())
    keys = IdempotencyStore(stack.db, lease=stack.settings.api.idempotency_lease)
    await keys.claim(
        stack.user_id, key, validation.body_hash(orjson.loads(raw)), claimed_id, uuid.uuid4()
    )

    status, body = await _post(stack, raw, key)
    assert status == 409 and body["error"]["code"] == "idempotency_in_progress"  # type: ignore[index]

    async def taken_over() -> dict[str, object] | None:
        status, body = await _post(stack, raw, key)
        return body if status == 202 else None

    body = await eventually(taken_over, timeout=20, interval=0.5)
    assert body["batch_id"] == str(claimed_id)
    await _sent_once(stack, str(claimed_id), to)
    assert (await _post(stack, raw, key))[1]["batch_id"] == str(claimed_id)


@pytest.mark.simulated  # the World carries it (README: what carries the moved cases)
async def test_api_killed_after_storing_the_batch_the_retry_returns_it(stack: Stack) -> None:
    """The holder stored the batch and died before publishing or answering: the retry gets
    the same batch at once (finishing its acceptance), and it is sent once."""
    to = emails(2)
    raw, key = _body(to), uuid.uuid4().hex
    keys = IdempotencyStore(stack.db, lease=60)
    claim = await keys.claim(
        stack.user_id,
        key,
        validation.body_hash(orjson.loads(raw)),
        uuid_from_time(time.time()),
        uuid.uuid4(),
    )
    batch_id = claim.batch_id
    # What the dead request had done: its batch stored under the claimed id, nothing else.
    api = stack.api_app.state
    parsed = validation.parse_batch_request(orjson.loads(raw), max_recipients=100)
    stored = build_batch(stack.settings, stack.user_id, batch_id, parsed)
    await Acceptance(api.batches, api.outbox, api.acceptance.broker).store(stored)

    status, body = await _post(stack, raw, key)

    assert status == 202 and body["batch_id"] == str(batch_id)
    await _sent_once(stack, str(batch_id), to)


async def test_a_failure_after_the_batch_is_stored_is_still_a_202(stack: Stack) -> None:
    """Recording the key's answer fails after the batch is stored: the client still gets 202
    (nothing stored may turn into an error), and a retry gets the same batch id."""
    to = emails(2)
    raw, key = _body(to), uuid.uuid4().hex
    api = stack.api_app.state
    faulty = FaultyDatabase(api.resources.db, before("SET response = ?"))
    keys = IdempotencyStore(faulty, lease=stack.settings.api.idempotency_lease)
    api.sending = dataclasses.replace(api.sending, idempotency=keys)

    status, first = await _post(stack, raw, key)
    again_status, again = await _post(stack, raw, key)

    assert faulty.rules[0].fired == 1
    assert (status, again_status) == (202, 202)
    assert again["batch_id"] == first["batch_id"]
    await _sent_once(stack, str(first["batch_id"]), to)


class _SlowWrite(BatchStore):
    """The batch partition's mutation lands ``delay`` seconds after the outbox row sent in the
    same request (the coordinator applies a batch's partitions independently)."""

    def __init__(self, db: Database, delay: float) -> None:
        super().__init__(db)
        self.delay = delay

    async def write(
        self,
        batch: NewBatch,
        *,
        also: Sequence[Statement] = (),
        content: Content | None = None,
        indexed: bool = False,
    ) -> None:
        await self.db.batch(also)
        await asyncio.sleep(self.delay)
        await super().write(batch, content=content, indexed=indexed)


class _LostAnswer(BatchStore):
    """The batch partition's write applies, but the client hears a timeout."""

    async def write(
        self,
        batch: NewBatch,
        *,
        also: Sequence[Statement] = (),
        content: Content | None = None,
        indexed: bool = False,
    ) -> None:
        await super().write(batch, also=also, content=content, indexed=indexed)
        raise DependencyUnavailable("cassandra", "WriteTimeout (injected)")


async def test_the_relay_never_discards_a_batch_still_being_written(stack: Stack) -> None:
    """The outbox relay sees a batch's outbox row before its (slow) write lands: it waits
    for it instead of discarding it, so the 202 has every recipient, sent once."""
    to = emails(3)
    api = stack.api_app.state
    api.acceptance.batches = _SlowWrite(api.resources.db, delay=1.5)

    status, body = await _post(stack, _body(to), None)

    assert status == 202
    batch_id = str(body["batch_id"])
    assert len(await stack.logs(batch_id)) == 3
    await _sent_once(stack, batch_id, to)


async def test_a_503_without_a_key_is_never_sent(stack: Stack) -> None:
    """The batch write applied but timed out: the client without a key gets 503 and may send
    again, so the stored batch is cancelled and never sent (the relay skips it)."""
    to = emails(2)
    api = stack.api_app.state
    api.acceptance.batches = _LostAnswer(api.resources.db)

    status, _ = await _post(stack, _body(to), None)

    assert status == 503
    await asyncio.sleep(1.5)  # several relay passes
    async with stack.consuming():
        await asyncio.sleep(2)
    for email in to:
        assert sum((await stack.accepted(email)).values()) == 0


@pytest.mark.simulated  # the World carries it (README: what carries the moved cases)
async def test_a_503_without_a_key_is_never_sent_even_if_its_cancel_fails_too(
    stack: Stack,
) -> None:
    """The batch write applied but timed out, and the API's cancel fails in the same
    Cassandra pause: the client was told 503, so the relay must never publish the batch
    (it cancels it once its request can no longer commit it)."""
    to = emails(2)
    api = stack.api_app.state
    api.acceptance.batches = _LostAnswer(api.resources.db)
    faulty = FaultyDatabase(
        api.resources.db, before("SET status = 'cancelled'"), before("IF status IN")
    )
    api.batches = BatchStore(faulty, api.stats)
    api.sending = dataclasses.replace(api.sending, batches=api.batches)

    status, _ = await _post(stack, _body(to), None)

    assert status == 503
    assert sum(rule.fired for rule in faulty.rules) == 1
    await asyncio.sleep(5)  # relay passes past the request's budget and the grace
    async with stack.consuming():
        await asyncio.sleep(2)
    for email in to:
        assert sum((await stack.accepted(email)).values()) == 0


@pytest.mark.simulated  # the World carries it (README: what carries the moved cases)
async def test_a_503_with_a_key_is_finished_by_the_retry(stack: Stack) -> None:
    """The batch write applied but timed out: the client with a key gets 503, and its retry
    gets the very batch that was stored, sent once."""
    to = emails(2)
    raw, key = _body(to), uuid.uuid4().hex
    api = stack.api_app.state
    real = api.acceptance.batches
    api.acceptance.batches = _LostAnswer(api.resources.db)

    status, _ = await _post(stack, raw, key)
    api.acceptance.batches = real
    again_status, again = await _post(stack, raw, key)

    assert (status, again_status) == (503, 202)
    await _sent_once(stack, str(again["batch_id"]), to)
