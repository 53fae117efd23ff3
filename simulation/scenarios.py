"""The scenarios: what clients, providers and recipients do in a simulated run.

Each scenario sets up the deployment (:class:`simulation.world.Config`), runs its clients
and returns their requests; the world then runs until it is quiet and the invariants judge
it. Recipients' fates come from their addresses, as in the sandbox (``bounce…@`` hard bounce,
``sgdrop…@`` dropped by SendGrid only, ``sgdefer…@`` deferred by SendGrid only...).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from services.api.contacts_csv import Contact
from shared.accounts.preferences import Preferences
from shared.audience.campaigns import Action
from shared.core.catalog import TRACKER
from shared.core.webhook_events import ProviderEvent
from shared.delivery.recipients import log_id_for
from shared.infra.http import ApiError
from shared.outbound.user_hooks import ALL, parse_events
from shared.templates.canary import in_canary
from simulation.clients import Request, send
from simulation.config import Config
from simulation.front import Reply
from simulation.world import ApiState, WebhookState, World

Script = Callable[[World], Awaitable[list[Request]]]


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    script: Script
    config: Config = field(default_factory=Config)


def body(*to: str, **extra: Any) -> dict[str, Any]:
    return {
        "from": "news@shop.example",
        "to": list(to),
        "subject": "Your order",
        "text": "It ships today.",
        **extra,
    }


def user(n: int = 1) -> uuid.UUID:
    return uuid.UUID(int=n)


ANN, BOB = "ann@example.org", "bob@example.org"


async def _one(world: World, *to: str, key: str | None = "k-order", **extra: Any) -> list[Request]:
    request = Request("order", user(), body(*to, **extra), key=key)
    return [await send(world, request)]


async def _two_recipients(world: World) -> list[Request]:
    return await _one(world, ANN, BOB)


async def _keyless(world: World) -> list[Request]:
    return await _one(world, ANN, BOB, key=None)


async def _dropped(world: World) -> list[Request]:
    # SendGrid drops the first for a reason of its own (a provider-side failure: handed over
    # to Mailgun through the recipient's own line); the second bounces (final, suppressed).
    return await _one(world, "sgdrop.ann@example.org", "bounce.bob@example.org", ANN)


async def _deferred(world: World) -> list[Request]:
    # SendGrid defers her and says nothing more: past the deadline she goes to Mailgun.
    return await _one(world, "sgdefer.ann@example.org", BOB)


async def _retry_after_bounce(world: World) -> list[Request]:
    # The 202 is lost; the client retries with its key a minute later, when the one
    # recipient has bounced (and joined the suppression list) meanwhile.
    request = Request(
        "order", user(), body("bounce.ann@example.org"), key="k-order", backoff=(60.0,)
    )
    return [await send(world, request)]


async def _act(world: World, user_id: uuid.UUID, campaign_id: uuid.UUID, action: Action) -> None:
    """A campaign lifecycle step from the dashboard, clicked again until it is answered."""

    async def step(state: ApiState) -> object:
        return await state.campaigns.act(user_id, campaign_id, action, None)

    for _ in range(20):
        reply = await world.call(f"POST /v1/campaigns/{{id}}/{action}", step)
        if reply.status == 200:
            return
        await asyncio.sleep(2.0)


async def _cancel(world: World, user_id: uuid.UUID, batch_id: str) -> Reply:
    """``POST /v1/batches/{id}/cancel``, asked again after a broken connection or a 5xx."""

    async def cancel(state: ApiState) -> object:
        header = await state.sending.batches.header(uuid.UUID(batch_id))
        if header is None or header.user_id != user_id:
            raise ApiError(404, "not_found", "no such batch")
        await state.sending.cancel(header)
        return {"batch_id": batch_id, "status": "cancelled"}

    reply = Reply(0)
    for _ in range(20):
        reply = await world.call("POST /v1/batches/{id}/cancel", cancel)
        if reply.status in (200, 404, 409):
            return reply
        await asyncio.sleep(5.0)
    return reply


async def _scheduled(world: World) -> list[Request]:
    """Two batches for 40 seconds from now; the first is cancelled 20 seconds later."""
    when = (datetime.now(UTC) + timedelta(seconds=40)).isoformat()
    later = Request("later", user(), body(ANN, BOB, send_at=when), key="k-later")
    kept = Request("kept", user(), body("cat@example.org", send_at=when), key="k-kept")
    await send(world, later)
    await send(world, kept)
    await asyncio.sleep(20.0)
    if later.batch_ids:
        (batch_id,) = later.batch_ids
        later.cancelled = await _cancel(world, later.user_id, batch_id)
    return [later, kept]


async def _canary(world: World) -> list[Request]:
    """Version 2 of a template goes out as a canary to half the recipients; its recipients
    bounce, the live version's are delivered: the judge rolls it back, a batch accepted
    during the canary and due after the verdict goes out as version 1 only (its canary's
    share too), and so does a batch sent after it."""
    owner = user()
    template_id = await world.templates.create(
        owner, "receipt", "Your receipt", None, "Thanks for your order.", {}
    )
    template = await world.templates.get(owner, template_id)
    assert template is not None  # noqa: S101
    template = await world.templates.publish(template, 1)
    await world.templates.add_version(template, "Your receipt!", None, "Thanks!", {})
    template = await world.templates.publish(template, 2, canary_percent=50)
    canary = [e for e in _pool("bounce") if in_canary(template_id, e, 50)][:2]
    live = [e for e in _pool("ok") if not in_canary(template_id, e, 50)][:2]
    first = Request("first", owner, _templated(template_id, *canary, *live), key="k-first")
    await send(world, first)
    # Accepted with the canary shortly before its verdict, sent 45 s later.
    await asyncio.sleep(world.settings.consumers.canary_window + 40)
    due = datetime.now(UTC) + timedelta(seconds=45)
    held_to = [e for e in _pool("held") if in_canary(template_id, e, 50)][:1]
    held_to += [e for e in _pool("held") if not in_canary(template_id, e, 50)][:1]
    held = Request(
        "held",
        owner,
        {**_templated(template_id, *held_to), "send_at": due.isoformat()},
        key="k-held",
    )
    await send(world, held)
    await asyncio.sleep(20)
    after = Request("after", owner, _templated(template_id, "late@example.org"), key="k-after")
    await send(world, after)
    return [first, held, after]


def _pool(prefix: str) -> list[str]:
    return [f"{prefix}.{n}@example.org" for n in range(40)]


def _templated(template_id: uuid.UUID, *to: str) -> dict[str, Any]:
    return {"from": "shop@shop.example", "to": list(to), "template_id": str(template_id)}


async def _unsubscribe(world: World, owner: uuid.UUID, batch_id: str, email: str) -> Reply:
    """A reader's mail client posts the one-click unsubscribe of ``email``'s copy (RFC
    8058), again after a broken connection or a 503, as a reader clicking again would."""
    log_id = log_id_for(uuid.UUID(batch_id), email)

    async def one_click(state: WebhookState) -> None:
        event = ProviderEvent(
            provider=TRACKER,
            event_id=f"unsubscribe:{log_id}:",
            kind="unsubscribed",
            raw_event="one-click unsubscribe",
            email=email,
            occurred_at=datetime.now(UTC),
            batch_id=uuid.UUID(batch_id),
            chunk=0,
            log_id=log_id,
            attempt=None,
            message_id=None,
            reason=None,
            provider_side=False,
            suppress=True,
        )
        await state.ingest.apply(event)

    reply = Reply(0)
    for _ in range(10):
        reply = await world.tracked(one_click)
        if reply.status == 200:
            world.unsubscribed.append((owner, email, asyncio.get_running_loop().time()))
            return reply
        await asyncio.sleep(10.0)
    return reply


async def _unsubscribe_cooldown(world: World) -> list[Request]:
    """A user with an hour's cooldown mails Ann and Bob; Ann unsubscribes (one click); then
    a second batch to Ann, Bob and Cat: Ann is suppressed, Bob cools down, Cat is sent."""
    owner = user()
    await world.preferences.put(owner, Preferences(cooldown_seconds=3600))
    first = Request("first", owner, body(ANN, BOB), key="k-first")
    await send(world, first)
    await asyncio.sleep(20.0)
    if first.batch_ids:
        (batch_id,) = first.batch_ids
        await _unsubscribe(world, owner, batch_id, ANN)
    await asyncio.sleep(20.0)
    second = Request("second", owner, body(ANN, BOB, "cat@example.org"), key="k-second")
    await send(world, second)
    return [first, second]


async def _user_webhooks(world: World) -> list[Request]:
    """A user with a webhook endpoint for every event: a delivery, a hard bounce and a
    provider-side drop handed over to Mailgun, each event reaching the endpoint in order."""
    owner = user()
    await world.hook_store.create(
        owner, "https://hooks.shop.example/safedelivr", parse_events([ALL]), datetime.now(UTC)
    )
    request = Request(
        "order", owner, body(ANN, "bounce.bob@example.org", "sgdrop.cat@example.org"), "k"
    )
    return [await send(world, request)]


async def _campaign(world: World) -> list[Request]:
    """Four contacts, one a second, paused after the first slices; meanwhile a contact's
    field changes and the template gets a new live version; then resumed."""
    owner = user()
    template_id = await world.templates.create(
        owner, "news", "Hi {{ first }}", None, "News for {{ first }}.", {"first": "Ann"}
    )
    template = await world.templates.get(owner, template_id)
    assert template is not None  # noqa: S101
    await world.templates.publish(template, 1)
    contacts = world.lists
    made = await contacts.create(owner, "customers")
    people = ["ann", "bob", "cat", "dan"]
    await contacts.put(
        made.list_id,
        [Contact(f"{p}@example.org", {"first": p.title()}) for p in people],
    )
    campaign = await world.campaign_store.create(
        owner, "spring", template_id, made.list_id, {"email": "news@shop.example"}, {}, 2, None
    )
    await _act(world, owner, campaign.campaign_id, "schedule")
    await asyncio.sleep(1.2)
    await _act(world, owner, campaign.campaign_id, "pause")
    # A change while paused: a contact's field, and the template's live version.
    await contacts.put(made.list_id, [Contact("dan@example.org", {"first": "Daniel"})])
    version = await world.templates.add_version(
        template, "Hello {{ first }}", None, "More news for {{ first }}.", {"first": "Ann"}
    )
    current = await world.templates.get(owner, template_id)
    assert current is not None  # noqa: S101
    await world.templates.publish(current, version)
    await asyncio.sleep(30.0)
    await _act(world, owner, campaign.campaign_id, "resume")
    return []


async def _walk(world: World) -> list[Request]:
    return await _one(world, "sgmgdrop.ann@example.org", BOB)


async def _relay(world: World) -> list[Request]:
    # SendGrid answers each recipient as an SMTP relay does: takes Ann (and that is all that
    # will be known: delivered, "accepted by relay"), refuses Bob for now (handed over to
    # Mailgun), Cat for good (failed, suppressed), and Dan's answer is lost (taken in truth:
    # without a query API or events he is resent through Mailgun after the webhook window).
    return await _one(
        world,
        ANN,
        "rcpt4xx.bob@example.org",
        "rcpt5xx.cat@example.org",
        "rcptlost.dan@example.org",
    )


async def _two_clients(world: World) -> list[Request]:
    first = Request("first", user(1), body(ANN, BOB), key="k-1")
    second = Request("second", user(2), body(ANN, "cat@example.org"), key=None)
    done = [await send(world, first)]
    done.append(await send(world, second))
    return done


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("plain", "one keyed batch of two recipients, delivered", _two_recipients),
        Scenario(
            "keyless",
            "a batch without an Idempotency-Key: a 503 must mean nothing is sent",
            _keyless,
        ),
        Scenario(
            "failover",
            "SendGrid refuses the chunk (429): Mailgun sends it",
            _two_recipients,
            Config(scripts={"sg": ("refused",)}),
        ),
        Scenario(
            "timeout_query",
            "SendGrid takes the chunk and never answers: its query API shows it was accepted",
            _two_recipients,
            Config(scripts={"sg": ("accept_silent",)}),
        ),
        Scenario(
            "timeout_no_query",
            "SendGrid takes the chunk and never answers; no query API: its webhooks decide",
            _two_recipients,
            Config(scripts={"sg": ("accept_silent",)}, query_api=("mg",)),
        ),
        Scenario(
            "slow_evidence",
            "SendGrid takes the chunk and never answers; its events come late: checks wait "
            "until its query API (after query_after) shows the chunk was taken",
            _two_recipients,
            Config(scripts={"sg": ("accept_silent",)}, event_delays=(400.0, 420.0, 440.0)),
        ),
        Scenario(
            "silent_no_query",
            "SendGrid takes the chunk and never answers; no query API, and its events come "
            "15 minutes later: checks wait for them",
            _two_recipients,
            Config(
                scripts={"sg": ("accept_silent",)},
                query_api=("mg",),
                event_delays=(900.0, 920.0, 940.0),
                resolve_interval=300,
            ),
        ),
        Scenario(
            "lost_request",
            "SendGrid never gets the request and the call times out: its query API (after "
            "query_after) shows nothing, so Mailgun sends the chunk",
            _two_recipients,
            Config(scripts={"sg": ("lost_silent",)}),
        ),
        Scenario(
            "lost_request_no_query",
            "SendGrid never gets the request and the call times out; no query API: after "
            "the webhook window Mailgun sends the chunk",
            _two_recipients,
            Config(scripts={"sg": ("lost_silent",)}, query_api=("mg",), resolve_interval=600),
        ),
        Scenario(
            "lost_no_query",
            "SendGrid answers 500 having taken nothing; no query API: after the webhook "
            "window the chunk goes to Mailgun",
            _two_recipients,
            Config(scripts={"sg": ("reject_5xx",)}, query_api=("mg",), resolve_interval=600),
        ),
        Scenario(
            "webhooks_early",
            "the provider's events arrive before its answer is recorded",
            _two_recipients,
            Config(event_delays=(0.0, 0.0, 0.0)),
        ),
        Scenario(
            "webhooks_reordered",
            "every event is posted twice, and delivery comes before processing",
            _two_recipients,
            Config(event_delays=(6.0, 2.0, 9.0), duplicate_posts=True),
        ),
        Scenario(
            "webhooks_late",
            "delivery is reported two days after processing",
            _two_recipients,
            Config(event_delays=(1.0, 2 * 24 * 3600.0, 2 * 24 * 3600.0 + 60)),
        ),
        Scenario(
            "resend",
            "a provider-side drop (handed over to Mailgun), a hard bounce and a delivery",
            _dropped,
        ),
        Scenario(
            "deferral",
            "SendGrid defers a recipient past the deadline: she is handed over to Mailgun",
            _deferred,
            Config(deferred_deadline=600),
        ),
        Scenario(
            "intake_outage",
            "Cassandra is down while the webhooks arrive: the intake queues them",
            _two_recipients,
            Config(outages=((1.5, 40.0),)),
        ),
        Scenario(
            "retry_after_bounce",
            "the 202 is lost; by the time the client retries with its key, its one recipient "
            "has bounced: the retry still gets the batch that was sent",
            _retry_after_bounce,
            Config(answers_lost=1),
        ),
        Scenario(
            "scheduled",
            "two batches for 40 seconds ahead; the first is cancelled after 20 seconds",
            _scheduled,
        ),
        Scenario(
            "canary",
            "a template's canary bounces where its live version is delivered: rolled back, "
            "and the next batch goes out as the live version",
            _canary,
        ),
        Scenario(
            "unsubscribe_cooldown",
            "a recipient unsubscribes (one click) between two batches of a user with a "
            "cooldown: the second skips her (suppressed) and the other (cooling down)",
            _unsubscribe_cooldown,
        ),
        Scenario(
            "user_webhooks",
            "a user's webhook endpoint gets every event of a delivery, a bounce and a "
            "hand-off, in order",
            _user_webhooks,
        ),
        Scenario(
            "campaign",
            "a campaign of four contacts, one a second: paused after its first slices, a "
            "contact and the template changed meanwhile, then resumed",
            _campaign,
        ),
        Scenario(
            "relay",
            "SendGrid answers recipient by recipient, as a relay: one taken, one refused for "
            "now (Mailgun sends it), one for good (failed, suppressed), one answer lost",
            _relay,
            Config(relays=("sg",), query_api=("mg",), resolve_interval=600),
        ),
        Scenario(
            "walk",
            "a chain of three: SendGrid and Mailgun each drop Ann on their side, the SMTP "
            "relay takes her (accepted by relay); Bob goes through SendGrid",
            _walk,
            Config(chain="sg,mg,smtp", relays=("smtp",), max_attempts=4),
        ),
        Scenario(
            "two_clients",
            "a keyed and a keyless client of two users, one address in common",
            _two_clients,
        ),
    )
}
