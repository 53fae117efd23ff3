"""Live settings applied to the consumers (``services.consumers.live``) over the in-memory
twins: a paused provider is never called and its work moves on, the chain's order decides
where new chunks go, every provider paused leaves work in the queues, and max_attempts
bounds the decisions made from then on."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

from shared.core.batch_ids import accepted_at
from shared.core.models import Chunk
from shared.core.webhook_events import ProviderEvent
from shared.delivery.batchstore import NewBatch
from shared.delivery.domain_capacity import CapacityGate, CapacityRules
from shared.delivery.recipients import log_id_for
from shared.ops.livesettings import LiveSettings
from shared.providers.base import Receipt
from tests.fakes.delivery import FakeDomainVolumes
from tests.fakes.world import World, refused
from tests.unit.consumers.settings_applier import consumer_settings

A, B = "a@example.org", "b@example.org"


def deferred(batch: NewBatch, email: str) -> ProviderEvent:
    """SendGrid's report that it deferred ``email``'s first attempt."""
    return ProviderEvent(
        provider="sg", event_id=uuid.uuid4().hex, kind="deferred", raw_event="deferred",
        email=email, occurred_at=accepted_at(batch.batch_id) + timedelta(seconds=10),
        batch_id=batch.batch_id, chunk=0, log_id=log_id_for(batch.batch_id, email),
        attempt="c.0", message_id="sg-1", reason="421 try later", provider_side=False,
        suppress=False,
    )  # fmt: skip


async def test_new_work_skips_a_paused_provider_without_calling_it() -> None:
    """With SendGrid paused, a new batch goes straight to Mailgun: no attempt via SendGrid."""
    w = World()
    await consumer_settings(w)(LiveSettings(chain=("sg", "mg"), paused=frozenset({"sg"})))

    batch = await w.accept(A, B)
    await w.settle()

    assert w.providers["sg"].sent == []
    assert sorted(w.providers["mg"].emails()) == [A, B]
    rows = await w.rows(batch)
    assert dict(rows[A]["providers"]) == {"mg": "sent"}  # type: ignore[call-overload]


async def test_work_already_queued_for_a_paused_provider_moves_on_saying_why() -> None:
    """A job that reached SendGrid's queue before the pause is not sent through SendGrid: its
    attempt is recorded as refused ("paused by an operator") and Mailgun sends it at once."""
    w = World()
    batch = await w.accept(A, B)
    assert await w.step()  # the splitter: the chunk's job is in SendGrid's queue
    await consumer_settings(w)(LiveSettings(chain=("sg", "mg"), paused=frozenset({"sg"})))

    await w.settle()

    assert w.providers["sg"].sent == []
    assert sorted(w.providers["mg"].emails()) == [A, B]
    rows = await w.rows(batch)
    providers = dict(rows[A]["providers"])  # type: ignore[call-overload]
    assert providers == {"sg": "failed: paused by an operator", "mg": "sent"}
    to_mailgun = [m for m in w.broker.published if m.routing_key.startswith("mg.")]
    assert to_mailgun and all(m.delay is None for m in to_mailgun)  # at once, no backoff


async def test_the_chains_order_decides_where_new_chunks_go() -> None:
    w = World()
    await consumer_settings(w)(LiveSettings(chain=("mg", "sg")))

    await w.accept(A)
    await w.settle()

    assert (w.providers["mg"].emails(), w.providers["sg"].sent) == ([A], [])


async def test_failover_follows_the_reordered_chain() -> None:
    """Mailgun first, failing: the work goes to SendGrid."""
    w = World()
    await consumer_settings(w)(LiveSettings(chain=("mg", "sg")))
    w.providers["mg"].answers.append(refused("mg"))

    await w.accept(A)
    await w.settle()

    assert w.providers["sg"].emails() == [A]


async def test_max_attempts_bounds_the_decisions_made_after_it_changed() -> None:
    w = World(max_attempts=6)
    await consumer_settings(w)(LiveSettings(chain=("sg", "mg"), max_attempts=2))
    for code in ("sg", "mg"):
        w.providers[code].answers += [refused(code)] * 6

    batch = await w.accept(A)
    await w.settle()

    assert len(w.providers["sg"].sent) + len(w.providers["mg"].sent) == 2
    assert await w.states(batch) == {A: "failed"}


async def test_a_deferral_deadline_hands_over_along_the_chain_in_force_at_the_deadline() -> None:
    """SendGrid defers the recipient; Mailgun is paused before the deadline: the deadline
    check finds no provider left in the running chain and gives the recipient up."""
    w = World()
    batch = await w.sent(A)
    await w.ingest.apply(deferred(batch, A))
    await consumer_settings(w)(LiveSettings(chain=("sg", "mg"), paused=frozenset({"mg"})))

    await w.settle()  # past the deadline

    assert w.providers["mg"].sent == []
    assert await w.states(batch) == {A: "failed"}
    row = (await w.rows(batch))[A]
    assert row["superseded"] == frozenset({"c.0"})
    assert "no other provider is left to try" in str(row["gave_up_reason"])


async def test_a_refused_call_gives_back_its_count_under_the_rules_it_was_admitted_by() -> None:
    """Capacity rules turned off while SendGrid is being called: its refusal still gives
    back the recipients the admission counted (the rules in force at the admission), and
    Mailgun's call, admitted with no rules, counts nothing."""
    volumes = FakeDomainVolumes()
    w = World(
        capacity=CapacityGate(volumes), capacity_rules=CapacityRules(enabled=True, initial=1000)
    )

    async def turned_off_then_refused(chunk: Chunk) -> Receipt:
        w.running.set(replace(w.running(), capacity=CapacityRules(enabled=False)))
        raise refused("sg")

    w.providers["sg"].answers.append(turned_off_then_refused)
    await w.accept(A, B)
    await w.settle()

    assert sorted(w.providers["mg"].emails()) == [A, B]
    assert [day["sent"] for day in volumes.days.values()] == [0]


async def test_with_every_provider_paused_the_provider_queues_are_not_consumed() -> None:
    """Work waits in the broker, not in memory, and resuming one provider consumes again:
    both lanes and the re-sends, the bulk lane with its own smaller prefetch."""
    w = World()
    applier = consumer_settings(w)
    t = w.broker.topology
    queues = {q for c in ("sg", "mg") for q in t.sender_queues(c)}
    assert {t.bulk_queue("sg"), t.bulk_queue("mg")} <= queues
    await applier(LiveSettings(chain=("sg", "mg")))
    for queue in queues:
        await w.broker.consume(queue, None, prefetch=4)

    await applier(LiveSettings(chain=("sg", "mg"), paused=frozenset({"sg", "mg"})))
    paused = set(w.broker.consumers)
    await applier(LiveSettings(chain=("sg", "mg"), paused=frozenset({"sg"})))

    assert not queues & paused
    assert queues <= set(w.broker.consumers)
    assert w.broker.consumers[t.bulk_queue("sg")][1] == applier.bulk_prefetch


async def test_the_settings_in_force_are_on_metrics() -> None:
    w = World()
    applier = consumer_settings(w)

    await applier(LiveSettings(chain=("mg", "sg"), paused=frozenset({"sg"})))

    paused, position = applier.metrics.paused, applier.metrics.position
    assert paused.labels("sg")._value.get() == 1 and paused.labels("mg")._value.get() == 0
    assert (position.labels("mg")._value.get(), position.labels("sg")._value.get()) == (1, 0)


async def test_providers_answers_count_for_their_domains_only_while_capacity_is_on() -> None:
    """The consumers' ingest (providers' answers recipient by recipient) counts deliveries
    and bounces per sending domain as the live capacity rules say, like the webhooks'."""
    w = World()
    apply = consumer_settings(w)
    assert w.dispatcher.ingest is not None
    await apply(LiveSettings(chain=("sg", "mg"), capacity=CapacityRules(enabled=True)))
    assert w.dispatcher.ingest.count_outcomes
    await apply(LiveSettings(chain=("sg", "mg"), capacity=CapacityRules(enabled=False)))
    assert not w.dispatcher.ingest.count_outcomes
