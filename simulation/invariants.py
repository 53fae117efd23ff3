"""What must hold once a simulated run is quiet, whatever faults it met.

Each check reads the world's final state (the twins' tables, the providers' ledger, what each
client was told, the broker) and returns violations, one line each. Acceptances the README's
at-least-once windows allow are not violations; they are counted apart, with their reason.

* ``final``: every recipient of every batch a client was told was accepted (and of every
  other batch that exists and was not cancelled) ended ``success`` or ``failed``;
* ``once``: the providers accepted each recipient of each client request at most once;
* ``told_503``: nothing of a keyless try that was answered 503 was sent;
* ``one_batch``: a client retrying with its key got one batch id;
* ``evidence``: nothing is ``success`` that no provider accepted and reported delivered, and
  nothing a provider delivered is shown ``failed``;
* ``stats``: each user's daily counts equal the outcome of their recipients;
* ``quota``: each user's quota holds exactly the recipients of their batches that were not
  cancelled;
* ``queues``: no message is left in a queue, in flight or delayed, and none was dead-lettered;
  no provider gave up posting an event (we answered errors for its whole retry horizon);
* ``lines``: no attempt line grew past a bound;
* ``canary``: every canary is judged once, batches made after a verdict use what it left
  live, and no chunk is called with a rolled-back canary once its verdict is in (but for a
  call that keeps the copy of an earlier one that may have reached the provider);
* ``errors``: no service logged an unexpected error.
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from services.consumers.template_rollouts import KEEP_FOR
from services.hooks.schedule import Occurrence, occurred
from shared.audience.campaigns import METADATA_KEY
from shared.core.batch_ids import accepted_at
from shared.core.models import Message
from shared.delivery import recipient_answers
from shared.delivery.attempts import chunk_line, from_row
from shared.delivery.precedence import visible
from shared.delivery.stats import batch_day
from shared.templates.canary_store import Outcome
from shared.templates.template_use import kept_version
from simulation.clients import Request
from simulation.providers import Acceptance
from simulation.world import World

#: Seconds an event may have been ready before an event that happened later and still arrive
#: after it: the pass that sent the later one read the queue just before (its sending time).
HOOK_PASS_SLACK = 5.0
#: The longest an attempt line may grow (attempts of one chunk or one recipient's re-sends).
LINE_BOUND = 12


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    at_least_once: Counter[str] = field(default_factory=Counter)
    """Duplicates the README allows, by reason."""

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, check: str, what: str) -> None:
        self.violations.append(f"{check}: {what}")


async def judge(world: World, requests: list[Request], *, quiet: bool) -> Verdict:
    """Every check over the world as it is now."""
    verdict = Verdict()
    if not quiet:
        verdict.add("quiescence", "the world was still busy at the horizon")
    if world.errors:
        for error in world.errors[:5]:
            verdict.add("errors", error)
    batches = await _batches(world)
    await _final(world, batches, verdict)
    _once(world, requests, verdict)
    _clients(requests, batches, verdict)
    await _evidence(world, batches, verdict)
    await _stats(world, batches, verdict)
    _quota(world, batches, verdict)
    _queues(world, verdict)
    _lines(world, verdict)
    _campaigns(world, batches, verdict)
    _canaries(world, batches, verdict)
    _rollbacks(world, batches, verdict)
    await _audience(world, requests, batches, verdict)
    _user_hooks(world, verdict)
    return verdict


@dataclass(frozen=True)
class _Batch:
    batch_id: uuid.UUID
    user_id: uuid.UUID
    status: str
    rows: list[dict[str, object]]
    request: str | None
    """The client request it was stored for (``metadata.sim_request``)."""
    campaign: str | None
    """The campaign it is a slice of."""
    message: Message | None = None
    created: datetime | None = None


async def _batches(world: World) -> list[_Batch]:
    out = []
    for batch_id in sorted(world.db.headers, key=lambda b: b.bytes):
        header = await world.batches.header(batch_id)
        if header is None:
            continue
        rows = await world.recipients.batch_rows(batch_id)
        metadata = header.message.metadata
        out.append(
            _Batch(
                batch_id,
                header.user_id,
                header.status,
                rows,
                metadata.get("sim_request"),
                metadata.get(METADATA_KEY),
                header.message,
                header.created_at,
            )
        )
    return out


async def _final(world: World, batches: list[_Batch], verdict: Verdict) -> None:
    for b in batches:
        if b.status in ("cancelled", "scheduled"):
            continue
        stuck = [r for r in b.rows if visible(r).state == "queued"]
        for r in stuck[:3]:
            verdict.add(
                "final",
                f"batch {b.batch_id} ({b.status}): {r['email']} still queued "
                f"(event {r.get('event') or 'queued'}, providers {r.get('providers') or {}})",
            )


def _request_of(metadata: tuple[tuple[str, str], ...], batch_id: uuid.UUID) -> str:
    """Whose mail it was: a client request, or a campaign (each contact once per campaign)."""
    found = dict(metadata)
    if METADATA_KEY in found:
        return f"campaign {found[METADATA_KEY]}"
    return found.get("sim_request") or f"batch {batch_id}"


def _once(world: World, requests: list[Request], verdict: Verdict) -> None:
    seen: dict[tuple[str, str], list[Acceptance]] = defaultdict(list)
    for a in world.ledger.accepted:
        if a.sent:
            seen[(_request_of(a.metadata, a.batch_id), a.email)].append(a)
    for (request, email), sends in sorted(seen.items()):
        if len(sends) < 2:
            continue
        if any(a.deferred for a in sends[:-1]):
            verdict.at_least_once["a deferral outlived its deadline and was handed over"] += 1
            continue
        if any(_unproven(world, a) for a in sends[:-1]):
            verdict.at_least_once[
                "no query API, and no webhook within the window, for an accepted request"
            ] += 1
            continue
        said = ", ".join(f"{a.provider} {a.tag}" for a in sends)
        verdict.add("once", f"{request}: {email} accepted {len(sends)} times ({said})")
    cancelled = {r.name for r in requests if r.cancelled is not None and r.cancelled.status == 200}
    for a in world.ledger.accepted:
        request = _request_of(a.metadata, a.batch_id)
        if request in cancelled:
            verdict.add("cancelled", f"{request}: {a.email} sent though its cancel answered 200")
    told = {t for r in requests for t in r.told_503}
    for a in world.ledger.accepted:
        sim_try = dict(a.metadata).get("sim_try")
        if sim_try in told:
            verdict.add("told_503", f"{sim_try}: {a.email} was sent though the client was told 503")


def _unproven(world: World, a: Acceptance) -> bool:
    """Whether an acceptance was concluded unaccepted for want of evidence, through no fault
    of ours: its provider has no query API and reported nothing within the webhook window
    (the README's window (1)), and the attempt had not recorded its answer that it took it
    (a relay's "accepted": once stored, nothing excuses sending it again)."""
    if a.provider in world.config.query_api or "." not in a.tag:
        return False
    kind, _, number = a.tag.partition(".")
    lines = [
        rows
        for (batch_id, line), rows in world.db.attempts.items()
        if batch_id == a.batch_id and line[0] == kind
    ]
    return any(
        (row := rows.get(int(number))) is not None
        and row.get("resolution") == "not_accepted"
        and not _recorded_accepted(row, a.email)
        for rows in lines
    )


def _recorded_accepted(row: dict[str, object], email: str) -> bool:
    """Whether an attempt's row recorded the provider's answer that it took ``email``."""
    raw = row.get("answers")
    answers = recipient_answers.decode(raw if isinstance(raw, str) else None)
    return answers is not None and any(
        x.outcome == "accepted" and x.email.lower() == email for x in answers.recipients
    )


def _clients(requests: list[Request], batches: list[_Batch], verdict: Verdict) -> None:
    """A keyed client's last answer says what happened: a 202 with the one batch stored
    for its request, or an error and no batch of its request going out."""
    stored: dict[str, set[str]] = defaultdict(set)
    cancelled_by_client = {r.name for r in requests if r.cancelled and r.cancelled.status == 200}
    for b in batches:
        if b.request and (b.status != "cancelled" or b.request in cancelled_by_client):
            stored[b.request].add(str(b.batch_id))
    for r in requests:
        if r.key is None:
            continue
        if len(r.batch_ids) > 1:
            verdict.add("one_batch", f"{r.name}: key {r.key} answered {sorted(r.batch_ids)}")
        last = r.final
        if last is None or last.status == 0:
            continue  # the client gave up without an answer
        if last.status == 202:
            if stored[r.name] != r.batch_ids:
                verdict.add(
                    "outcome",
                    f"{r.name}: answered {sorted(r.batch_ids)}, stored {sorted(stored[r.name])}",
                )
        elif stored[r.name]:
            verdict.add(
                "outcome",
                f"{r.name}: last answered {last.status} {last.code}, yet batch "
                f"{sorted(stored[r.name])} goes out",
            )


async def _evidence(world: World, batches: list[_Batch], verdict: Verdict) -> None:
    accepted = {(a.batch_id, a.email) for a in world.ledger.accepted}
    for b in batches:
        for r in b.rows:
            email = str(r["email"]).lower()
            state = visible(r).state
            if state == "success" and (b.batch_id, email) not in accepted:
                verdict.add("evidence", f"batch {b.batch_id}: {email} success, never accepted")


async def _stats(world: World, batches: list[_Batch], verdict: Verdict) -> None:
    expected: dict[tuple[uuid.UUID, object], Counter[str]] = defaultdict(Counter)
    for b in batches:
        key = (b.user_id, batch_day(b.batch_id))
        if b.status == "cancelled":
            expected.setdefault(key, Counter())
            continue
        expected[key]["queued"] += len(b.rows)
        for r in b.rows:
            state = visible(r).state
            if state in ("success", "failed"):
                expected[key][state] += 1
    for (user_id, day), counts in expected.items():
        got = await world.stats.day(user_id, day)  # type: ignore[arg-type]
        shown = {k: got.get(k, 0) for k in ("queued", "success", "failed")}
        want = {k: counts.get(k, 0) for k in ("queued", "success", "failed")}
        if shown != want:
            verdict.add("stats", f"user {user_id} {day}: stats {shown}, recipients {want}")


def _quota(world: World, batches: list[_Batch], verdict: Verdict) -> None:
    """Charged exactly what the batches hold; more only after a fault in the API, since a
    counter write whose answer is lost, or a request that dies after charging, keeps its
    charge (the quota errs towards refusing, never towards allowing more)."""
    used: Counter[uuid.UUID] = Counter()
    for b in batches:
        if b.status != "cancelled":
            used[b.user_id] += len(b.rows)
    charged: Counter[uuid.UUID] = Counter()
    for (user_id, _), count in world.db.quota.items():
        charged[user_id] += count
    for (user_id, _), refunds in world.db.refunds.items():
        charged[user_id] -= sum(refunds.values())
    api_faulted = "api" in world.faulted_processes()
    for user_id in set(used) | set(charged):
        if charged[user_id] > used[user_id] and api_faulted:
            verdict.at_least_once["quota: kept after a failed request"] += 1
        elif charged[user_id] != used[user_id]:
            verdict.add(
                "quota", f"user {user_id}: charged {charged[user_id]}, batches hold {used[user_id]}"
            )


def _queues(world: World, verdict: Verdict) -> None:
    for lost in world.ledger.webhooks_lost[:3]:
        verdict.add("webhooks", f"a provider gave up posting an event: {lost}")
    broker = world.broker
    for queue, count in broker.leftovers().items():
        verdict.add("queues", f"{count} message(s) left in {queue}")
    if broker.unacked:
        verdict.add("queues", f"{len(broker.unacked)} message(s) still unacked")
    if broker.delayed:
        verdict.add("queues", f"{len(broker.delayed)} message(s) still delayed")
    for letter in broker.dead[:3]:
        verdict.add("queues", f"dead-lettered {letter.envelope.routing_key} ({letter.reason})")


def _campaigns(world: World, batches: list[_Batch], verdict: Verdict) -> None:
    """A campaign ends sent, each contact of its list in exactly one of its slices' batches,
    and every batch it made recorded as one of its slices."""
    tables = world.campaign_tables
    for (_, campaign_id), campaign in tables.campaigns.items():
        if campaign.state not in ("sent", "cancelled"):
            verdict.add("campaign", f"campaign {campaign_id} ended {campaign.state}")
            continue
        mine = [b for b in batches if b.campaign == str(campaign_id) and b.status != "cancelled"]
        slots = Counter(str(r["email"]).lower() for b in mine for r in b.rows)
        contacts = {
            email
            for (list_id, _), part in world.lists.rows.items()
            if list_id == campaign.list_id
            for email in part
        }
        for email in sorted(contacts):
            if campaign.state == "sent" and slots[email] != 1:
                verdict.add("campaign", f"campaign {campaign_id}: {email} in {slots[email]} slices")
        recorded = {str(s.batch_id) for s in tables.slices.get(campaign_id, {}).values()}
        made = {str(b.batch_id) for b in mine}
        if made - recorded:
            verdict.add(
                "campaign", f"campaign {campaign_id}: batches {sorted(made - recorded)} unrecorded"
            )


def _canaries(world: World, batches: list[_Batch], verdict: Verdict) -> None:
    """Every canary is judged once (no rollout left waiting, one verdict each), and a batch
    made after a verdict uses the version it left live."""
    for namespace, waiting in world.canary_tables.rollouts.items():
        for key in waiting:
            verdict.add("canary", f"{namespace}: the rollout {key} was never judged")
    for (_, template_id), row in world.templates.rows.items():
        template = row.template
        if template.canary_version is not None:
            verdict.add("canary", f"template {template_id} still has a canary")
        judged = world.canary_tables.verdicts.get(template_id, {})
        if world.schedule.skews:
            continue  # a batch's time is the API's clock, a verdict's the judge's
        for since, outcome in judged.items():
            kept = outcome.live_version if outcome.decision == "rollback" else None
            if kept is not None and template.live_version != kept and len(judged) == 1:
                verdict.add(
                    "canary",
                    f"template {template_id}: rolled back to {kept}, yet {template.live_version}"
                    " is live",
                )
            for b in batches:
                use = b.message.template if b.message else None
                if use is None or use.id != template_id or b.created is None:
                    continue
                if b.created <= outcome.at:
                    continue
                if use.canary is not None or use.version != template.live_version:
                    verdict.add(
                        "canary",
                        f"batch {b.batch_id} after the verdict on {since} used version "
                        f"{use.version} (canary {use.canary.version if use.canary else None})",
                    )


#: How long after a verdict's time a sender may still send a rolled-back canary: its
#: rollouts' cache (``services.consumers.template_rollouts``), and the judge's count between
#: its verdict's time and its conditional update.
STOPS_WITHIN = timedelta(seconds=KEEP_FOR + 10)


def _rollbacks(world: World, batches: list[_Batch], verdict: Verdict) -> None:
    """Every canary rolled back stopped at once (:func:`_stopped`)."""
    if world.schedule.skews:
        return  # a verdict's time is the judge's clock, a call's its sender's
    for template_id, judged in world.canary_tables.verdicts.items():
        for outcome in judged.values():
            if outcome.decision == "rollback":
                _stopped(world, batches, template_id, outcome, verdict)


def _stopped(
    world: World, batches: list[_Batch], template_id: uuid.UUID, outcome: Outcome, verdict: Verdict
) -> None:
    """A rolled-back canary stops at once: no chunk of its batches is called with it once
    the verdict is in (plus :data:`STOPS_WITHIN`), unless an earlier call of the chunk that
    may have reached the provider was made with it (that copy is kept)."""
    for b in batches:
        use = b.message.template if b.message else None
        if use is None or use.id != template_id or use.canary is None:
            continue
        if use.canary.version != outcome.canary_version:
            continue
        for chunk in range(use.canary_chunks):
            rows = world.db.attempts.get((b.batch_id, chunk_line(chunk)), {})
            line = [from_row(chunk_line(chunk), rows[n]) for n in sorted(rows)]
            for a in line:
                earlier = [(e.state, e.template_version) for e in line if e.attempt < a.attempt]
                if (
                    a.template_version == outcome.canary_version
                    and a.calling_at is not None
                    and a.calling_at > outcome.at + STOPS_WITHIN
                    and kept_version(earlier) != a.template_version
                ):
                    verdict.add(
                        "canary",
                        f"batch {b.batch_id} chunk {chunk} attempt {a.attempt} was called with "
                        f"version {a.template_version} at {a.calling_at}, rolled back at "
                        f"{outcome.at}",
                    )


async def _audience(
    world: World, requests: list[Request], batches: list[_Batch], verdict: Verdict
) -> None:
    """Nobody is mailed by a batch accepted after they unsubscribed; nobody is mailed twice
    within their sender's cooldown (except when the record of the first mail was lost in a
    failure of the API: the README's window)."""
    created = {b.batch_id: b.created for b in batches}
    owner = {b.batch_id: b.user_id for b in batches}
    # When each batch's request was sent (by the true clock: a batch id's time is the API's).
    asked = {
        uuid.UUID(r.body["batch_id"]): r.asked_at
        for request in requests
        for r in request.replies
        if r.status == 202 and r.body
    }
    for user_id, email, at in world.unsubscribed:
        for a in world.ledger.accepted:
            if a.email != email or owner.get(a.batch_id) != user_id:
                continue
            if asked.get(a.batch_id, -1.0) > at:
                verdict.add("unsubscribed", f"{email} mailed by {a.batch_id} after unsubscribing")
    api_faulted = "api" in world.faulted_processes()
    mailed: dict[tuple[uuid.UUID, str], list[datetime]] = defaultdict(list)
    for a in world.ledger.accepted:
        when = created.get(a.batch_id)
        if a.sent and when is not None:
            mailed[(owner[a.batch_id], a.email)].append(when)
    for (user_id, email), times in mailed.items():
        prefs = world.db.preferences.get(user_id)
        if prefs is None or prefs.cooldown_seconds <= 0:
            continue
        firsts = sorted(set(times))
        for early, late in itertools.pairwise(firsts):
            if (late - early).total_seconds() < prefs.cooldown_seconds:
                if api_faulted:
                    verdict.at_least_once["cooldown: the record of a mail lost in a failure"] += 1
                else:
                    verdict.add("cooldown", f"{email} mailed at {early} and again at {late}")


def _user_hooks(world: World, verdict: Verdict) -> None:
    """Every event queued for a user's endpoint reached it, and in order: no event arrived
    before one that happened earlier and had been queued for the order window by then (the
    worker's promise, ``services.hooks.schedule``: what is ready goes by occurrence)."""
    now = world.db.now()
    for user_id, endpoints in world.hook_store.rows.items():
        for endpoint_id, row in endpoints.items():
            if (row.read(now) or {}).get("url") is None:
                continue
            events = _queued_events(world, endpoint_id)
            got = world.endpoint.first_at
            missing = [m for _, _, m in events if m not in got]
            if missing:
                verdict.add("hooks", f"user {user_id}: {len(missing)} event(s) never delivered")
            elif not world.schedule.skews:  # queue times are the emitters' skewed clocks
                _in_order(world, user_id, events, verdict)


def _queued_events(world: World, endpoint_id: uuid.UUID) -> list[tuple[Occurrence, datetime, str]]:
    """Each event queued for the endpoint: (when it happened, when queued, webhook-id)."""
    now = world.db.now()
    events = []
    for (e, _), rows in world.hook_queue.queue.items():
        if e != endpoint_id:
            continue
        for seq, r in rows.items():
            live = r.read(now) or {}
            if live.get("msg_id"):
                queued = accepted_at(seq)
                events.append((occurred(_Item(queued, live["body"])), queued, live["msg_id"]))
    return events


def _in_order(
    world: World,
    user_id: uuid.UUID,
    events: list[tuple[Occurrence, datetime, str]],
    verdict: Verdict,
) -> None:
    # Events of one second are ordered by the worker's guess at their stage; only a whole
    # second apart is an order it can be held to. And a pass sorts what was ready when it
    # read the queue: an event ready a moment later waits for the next pass (the slack).
    window = timedelta(seconds=world.settings.hooks.order_window + HOOK_PASS_SLACK)
    got = world.endpoint.first_at
    for early, queued, first in events:
        for late, _, second in events:
            later = early[0] < late[0]
            if later and got[second] < got[first] and queued + window <= got[second]:
                verdict.add("hooks", f"user {user_id}: {second} arrived before {first}")
                return


@dataclass(frozen=True)
class _Item:
    at: datetime
    body: bytes


def _lines(world: World, verdict: Verdict) -> None:
    for (batch_id, line), rows in world.db.attempts.items():
        if len(rows) > LINE_BOUND:
            verdict.add("lines", f"batch {batch_id} line {line}: {len(rows)} attempts")
