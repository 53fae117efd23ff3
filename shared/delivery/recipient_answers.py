"""A provider's answers recipient by recipient (``shared.providers.base.RecipientAnswer``):
their stored form, and the provider events they stand for (pure).

An SMTP relay answers each RCPT on its own, and an API called once per recipient answers
each call: some recipients accepted, some refused for now, some refused for good, some not
known. Those answers are the provider's word about each recipient, as a webhook event would
be, so they become events and go through the same ingest (``shared.ingest.ingest``):

* accepted: ``sent`` (the attempt's tag on the recipient's row is the evidence that settles
  it should the call be ambiguous for others), or ``delivered`` with the reason
  :data:`ACCEPTED_BY_RELAY` when the provider says that answer is all there will ever be
  (``Receipt.final``: a relay with no event feed);
* refused for now: a provider-side ``dropped``, which hands the recipient to another
  provider exactly as a webhook's would;
* refused for good: ``dropped``, final, suppressing the address when the answer says so;
* unknown: no event; the attempt is then ambiguous (:func:`unknown_error`) and resolution
  looks for evidence of those recipients only.

The answers are stored with the call's answer (``send_attempts.answers``, :func:`encode`)
and the events built again from them wherever they are applied (:func:`events`): each has an
id fixed by the attempt and the address, so applying them again after a crash rewrites the
same cells.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, get_args

import orjson

from shared.core.addresses import address_key
from shared.core.errors import TransientProviderError
from shared.core.webhook_events import Kind, ProviderEvent
from shared.delivery.attempts import Attempt
from shared.infra.db import Row
from shared.providers.base import Outcome, Receipt, RecipientAnswer

#: The reason of a recipient a relay without events accepted: nothing more will be known.
ACCEPTED_BY_RELAY: Final = "accepted by relay (no delivery report)"
#: Every outcome an answer may have.
OUTCOMES: Final[tuple[Outcome, ...]] = get_args(Outcome)
#: The raw event of a recipient refused for now: handed over, and never counted as the
#: provider's own drop of it (it may be asked again: ``shared.delivery.handoff``).
REFUSED_FOR_NOW: Final = "answer/refused_transient"
#: Longest provider text kept per answer.
MAX_TEXT = 300


@dataclass(frozen=True, slots=True)
class Answers:
    """A call's answers as stored: each recipient's, and whether an accepted one is final."""

    recipients: tuple[RecipientAnswer, ...]
    final: bool = False

    @property
    def unknown(self) -> tuple[RecipientAnswer, ...]:
        return tuple(a for a in self.recipients if a.outcome == "unknown")


def of(receipt: Receipt | None) -> Answers | None:
    """The answers a receipt carries (None: it answered for the whole chunk)."""
    if receipt is None or receipt.recipients is None:
        return None
    return Answers(receipt.recipients, receipt.final)


def encode(answers: Answers) -> str:
    """The stored form (JSON)."""
    return orjson.dumps(
        {
            "final": answers.final,
            "recipients": [
                {
                    "email": a.email,
                    "outcome": a.outcome,
                    "code": a.code,
                    "text": a.text[:MAX_TEXT],
                    "message_id": a.message_id,
                    "suppress": a.suppress,
                }
                for a in answers.recipients
            ],
        }
    ).decode()


class Unreadable(ValueError):
    """Stored answers that cannot be read: what the provider said of each recipient is not
    known, and guessing (all accepted, or none) could lose or double a send."""


def decode(raw: str | None) -> Answers | None:
    """The answers stored on an attempt (None: it has none); :class:`Unreadable` when the
    cell holds something else."""
    if not raw:
        return None
    try:
        data = orjson.loads(raw)
        return Answers(tuple(_answer(a) for a in data["recipients"]), bool(data.get("final")))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise Unreadable(f"stored answers cannot be read: {exc}") from exc


def complete(receipt: Receipt, emails: Iterable[str]) -> Receipt:
    """``receipt`` answering for every one of ``emails`` (the chunk's recipients): one it
    says nothing of is ``unknown`` (the call may have reached the provider for them), never
    taken as accepted. A receipt for the whole chunk is left as it is."""
    if receipt.recipients is None:
        return receipt
    answered = {address_key(a.email) for a in receipt.recipients}
    missing = tuple(
        RecipientAnswer(email=e, outcome="unknown", text="the provider's answer left it out")
        for e in dict.fromkeys(address_key(e) for e in emails)
        if e not in answered
    )
    return replace(receipt, recipients=receipt.recipients + missing) if missing else receipt


def _answer(a: dict[str, Any]) -> RecipientAnswer:
    outcome = a["outcome"]
    if outcome not in OUTCOMES:
        raise ValueError(f"not an outcome: {outcome}")
    code = a.get("code")
    return RecipientAnswer(
        email=str(a["email"]),
        outcome=outcome,
        code=code if isinstance(code, int) else None,
        text=str(a.get("text") or ""),
        message_id=a.get("message_id"),
        suppress=bool(a.get("suppress")),
    )


def unknown_error(provider: str, answers: Answers) -> TransientProviderError | None:
    """The error that makes a call ambiguous when some recipients' answers are unknown (the
    call may have reached the provider for them); None when every answer is known."""
    unknown = answers.unknown
    if not unknown:
        return None
    return TransientProviderError(
        provider,
        f"answer unknown for {len(unknown)} of {len(answers.recipients)} recipient(s)",
        outcome_unknown=True,
    )


def answered_unknown(receipt: Receipt) -> TransientProviderError | None:
    """The error that goes with a receipt some of whose recipients' answers are unknown."""
    answers = of(receipt)
    return None if answers is None else unknown_error(receipt.provider, answers)


def refused_count(receipt: Receipt) -> int:
    """How many recipients the provider refused (for now or for good): not sent by it."""
    return sum(1 for a in receipt.recipients or () if a.outcome.startswith("refused"))


def answers_column(receipt: Receipt | None) -> dict[str, str]:
    """The ``answers`` column to write with a call's answer (nothing when it has none)."""
    answers = of(receipt)
    return {} if answers is None else {"answers": encode(answers)}


def event_id(attempt: Attempt, batch_id: uuid.UUID, email: str) -> str:
    """The id of the event an answer stands for: the same each time it is built."""
    key = address_key(email)
    return f"answer:{attempt.provider}:{batch_id}:{attempt.line}:{attempt.attempt}:{key}"


def events(
    attempt: Attempt, batch_id: uuid.UUID, rows: Sequence[Row], answers: Answers
) -> list[ProviderEvent]:
    """The events ``answers`` stand for, each naming the attempt (its tag) and, when the
    address is one of ``rows``, the recipient's ids; unknown answers stand for none."""
    log_ids = {address_key(str(r["email"])): r["log_id"] for r in rows}
    # When the call was made: never changes, so each re-application writes the same cells
    # (a resolution rewrites ``finished_at``: stamped with it, an answer applied again would
    # outrank the provider's own later events, a bounce put back to "sent").
    when = attempt.started_at
    out: list[ProviderEvent] = []
    for a in answers.recipients:
        if a.outcome == "unknown":
            continue
        email = address_key(a.email)
        kind, raw, reason, provider_side = _verdict(a, final=answers.final)
        out.append(
            ProviderEvent(
                provider=attempt.provider,
                event_id=event_id(attempt, batch_id, email),
                kind=kind,
                raw_event=raw,
                email=email,
                occurred_at=when,
                batch_id=batch_id,
                chunk=attempt.chunk,
                log_id=log_ids.get(email),
                attempt=attempt.tag,
                message_id=a.message_id or attempt.message_id,
                reason=reason,
                provider_side=provider_side,
                suppress=a.outcome == "refused_permanent" and a.suppress,
            )
        )
    return out


def _verdict(a: RecipientAnswer, *, final: bool) -> tuple[Kind, str, str | None, bool]:
    """Kind, raw event, reason and whether the failure is the provider's own."""
    words = " ".join(p for p in (str(a.code) if a.code else "", a.text.strip()) if p)
    said = words[:MAX_TEXT] or None
    if a.outcome == "accepted":
        if final:
            return "delivered", "answer/accepted", ACCEPTED_BY_RELAY, False
        return "sent", "answer/accepted", said, False
    if a.outcome == "refused_transient":
        return "dropped", REFUSED_FOR_NOW, said or "refused for now", True
    return "dropped", "answer/refused_permanent", said or "refused", False
