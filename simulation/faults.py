"""The fault model: which faults each kind of I/O step can suffer, and schedules of them.

A *step* is one I/O of one simulated process: a store round trip (``read``, ``write``,
``lwt``), a publish, an ack, a provider call (``send``) or query (``lookup``), a provider's
webhook delivery to us (``webhook``), a delivery to a user's endpoint (``hook``), or the API's
answer to its client (``answer``). Steps are numbered in the order a run takes them, which a
seed makes the same on every run: so "``lands`` at step 41" names one fault exactly.

Every step can also be the last one of its process (``kill``: it took effect, then the
process died with everything it held in memory; its unacked messages are delivered again and
its leases lapse). Clock skew is a fault of a whole run: a process's clock, or Cassandra's,
runs ahead or behind.

Pure data and pure functions: schedules are values, encoded as text for replay
(:func:`encode` / :func:`decode` round-trip).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

StepKind = Literal[
    "read", "write", "lwt", "publish", "ack", "send", "lookup", "webhook", "hook", "answer"
]

#: The faults of each kind of step, each said in a few words (what the README's table says).
FAULTS: Final[dict[StepKind, dict[str, str]]] = {
    "read": {
        "fail": "the read times out",
    },
    "write": {
        "fail": "the write fails before it applies",
        "lands": "the write applies, then times out",
    },
    "lwt": {
        "fail": "the lightweight transaction times out without applying",
        "lands": "the lightweight transaction applies, then times out",
    },
    "publish": {
        "lost": "the publish is not confirmed and the broker dropped it",
        "unconfirmed": "the broker routed the message, but its confirm is lost",
    },
    "ack": {
        "lost": "the ack is lost: the broker delivers the message again",
    },
    "send": {
        "refused": "the provider refuses the request cleanly (429)",
        "reject_5xx": "the provider answers 500 without having accepted it",
        "accept_5xx": "the provider accepts the request, then answers 504",
        "accept_reset": "the provider accepts the request, then the connection resets",
        "accept_silent": "the provider accepts the request and never answers",
        "lost_silent": "the request is lost on the way: nothing is accepted, no answer comes",
    },
    "lookup": {
        "fail": "the provider's query API fails",
    },
    "webhook": {
        "fail": "the delivery fails on the way: the provider retries it later",
        "duplicate": "the provider delivers the event twice",
        "late": "the event arrives two days late (after the later ones)",
    },
    "hook": {
        "fail": "the user's endpoint answers 503: the worker retries",
        "accept_fail": "the user's endpoint takes the event, then the answer is lost",
    },
    "answer": {
        "lost": "the API's answer never reaches the client (it retries)",
    },
}

#: The faults every step of a process can suffer besides its own: the process dies right
#: after it, or its broker connection drops (what it had not acked goes to another consumer
#: while it carries on: two deliveries of one message at once).
KILL: Final = "kill"
DISCONNECT: Final = "disconnect"
GENERAL: Final = {
    KILL: "the process dies right after it",
    DISCONNECT: "the process's broker connection drops right after it",
}


def kinds_for(step: StepKind) -> tuple[str, ...]:
    """The faults a step of this kind can suffer, the general ones last."""
    return (*FAULTS[step], *GENERAL)


@dataclass(frozen=True, slots=True, order=True)
class Fault:
    """Fault ``kind`` at step ``step`` of a run; ``kind`` ``"*<n>"`` means the ``n``-th
    (modulo their number) of whatever faults that step turns out to allow (swarm runs draw
    steps before knowing what they are).

    With ``where`` set, ``step`` counts instead the steps whose ``<process>/<point>``
    contains ``where`` (the ``step``-th of them, from 1): a schedule that still names the
    same step when code elsewhere takes a step more or less (regression tests use these).
    """

    step: int
    kind: str
    where: str = ""

    def text(self) -> str:
        return f"{self.where}#{self.step}={self.kind}" if self.where else f"{self.step}={self.kind}"

    def resolve(self, step_kind: StepKind) -> str:
        """The concrete fault for a step of ``step_kind``."""
        if not self.kind.startswith("*"):
            return self.kind
        choices = kinds_for(step_kind)
        return choices[int(self.kind[1:]) % len(choices)]


@dataclass(frozen=True, slots=True, order=True)
class Skew:
    """``target``'s clock (a process name, or ``cassandra``) runs ``seconds`` off."""

    target: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Schedule:
    """One run: a scenario, the faults injected into it, and the seed of its world."""

    scenario: str
    faults: tuple[Fault, ...] = ()
    skews: tuple[Skew, ...] = ()
    seed: int = 0
    jitter: bool = False
    """Whether steps take small random extra time (swarm runs: other interleavings)."""
    notes: tuple[str, ...] = field(default=(), compare=False)

    def without(self, fault: Fault | Skew) -> Schedule:
        return Schedule(
            self.scenario,
            tuple(f for f in self.faults if f != fault),
            tuple(s for s in self.skews if s != fault),
            self.seed,
            self.jitter,
        )


def encode(schedule: Schedule) -> str:
    """``scenario@seed[~]:12=lands,consumers-b/publish#1=lost;skew:api=-30`` (``~``: with
    jitter)."""
    head = f"{schedule.scenario}@{schedule.seed}{'~' if schedule.jitter else ''}"
    faults = ",".join(f.text() for f in sorted(schedule.faults))
    skews = "".join(f";skew:{s.target}={s.seconds:g}" for s in sorted(schedule.skews))
    return f"{head}:{faults}{skews}"


def decode(text: str) -> Schedule:
    """The schedule :func:`encode` wrote (raises ValueError on anything else)."""
    text = text.strip()
    head, _, rest = text.partition(":")
    scenario, _, seed_text = head.partition("@")
    jitter = seed_text.endswith("~")
    seed = int(seed_text.rstrip("~") or 0)
    parts = rest.split(";")
    faults = []
    for item in filter(None, parts[0].split(",")):
        step, _, kind = item.rpartition("=")
        if not kind or not step:
            raise ValueError(f"not a fault: {item!r} (want STEP=KIND or WHERE#N=KIND)")
        where, _, count = step.rpartition("#")
        faults.append(Fault(int(count), kind, where) if where else Fault(int(step), kind))
    skews = []
    for item in parts[1:]:
        if not item.startswith("skew:"):
            raise ValueError(f"not a skew: {item!r} (want skew:TARGET=SECONDS)")
        target, _, seconds = item.removeprefix("skew:").partition("=")
        skews.append(Skew(target, float(seconds)))
    if not scenario:
        raise ValueError(f"no scenario in {text!r}")
    return Schedule(scenario, tuple(faults), tuple(skews), seed, jitter)
