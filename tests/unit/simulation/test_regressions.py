"""Defects the simulator found, each as the smallest schedule that broke an invariant on the
code it was found in (``make simulate`` prints it): every one must now run clean.

The faults are named by what each step is (``<process>/<point>#<n>``: the n-th such step), so
a schedule keeps naming the same step when code elsewhere takes a step more or less. A
swarm schedule (``@seed~``: jittered) also depends on when steps are taken: when code before
its faults changes, its seed is chosen again among those whose faults all hit, in the same
order, and that still break the code as it was before the fix. A defect made impossible by
construction leaves the list with the step it aimed at (a keyless batch's indexes failing
alone after its header: they are written in the header's own logged batch since issue 34).
"""

from __future__ import annotations

import pytest

from simulation.faults import decode
from simulation.search import describe, run

#: (schedule, what it broke before the fix).
FIXED = [
    (
        "lost_request@0:consumers-b/store:attempts.transition#1=lands",
        "issue 32 defect 1: a check's LWT (checks N -> N+1) applied but timed out; the retry "
        "found checks = N+1 and acked: the attempt stayed ambiguous, its mail never sent",
    ),
    (
        "lost_request@0:consumers-b/store:attempts.transition#1=kill",
        "issue 32 defect 1: the process died after a check's LWT, before publishing the next "
        "check: the redelivery acked, the chain was gone and the mail never sent",
    ),
    (
        "lost_request@0:consumers-b/publish:sg.*#1=lost",
        "issue 32 defect 1: the publish of the next check was not confirmed: the retry "
        "acked, the chain was gone and the mail never sent",
    ),
    (
        "plain@7116~:consumers-a/store:batches.mark_dispatched#1=disconnect,"
        "consumers-a/store:attempts.transition#1=kill,consumers-b/provider:sg.send#1=lost_silent",
        "the long swarm at 62ed1a0 (1 of 100,000): a's connection dropped with the chunk's job "
        "in hand, so its copy went to b, who called; a's stale copy waited for b's lease "
        "(checks 0 -> 1, numbered by their one message) and died before publishing check 1; "
        "b's call got no answer, b recorded it ambiguous, left check 1 to a and acked: the "
        "mail stayed queued for ever",
    ),
    (
        "plain@0:consumers-a/store:recipients.chunk_rows#1=kill,consumers-b/publish:sg.*#1=lost",
        "issue 32 defect 2: the caller died during its call; the redelivery waited for the "
        "lease (checks 0 -> 1) and its check's publish was lost: the attempt stayed calling",
    ),
    (
        "retry_after_bounce@0:",
        "issue 32 defect 4: the 202 was lost and the one recipient bounced before the retry "
        "with the key: the retry was judged again and got 422 no_recipients for a batch that "
        "was sent",
    ),
    (
        "keyless@0:api/store:batches.write#1=lands,api/store:batches.cancel#1=fail",
        "issue 32 defect 5: a keyless store timed out having landed and the cancel failed in "
        "the same pause: the client was told 503, the relay sent the batch, and its retry "
        "sent it again",
    ),
    (
        "plain@0:api/store:batches.write#1=lands",
        "a keyed store timed out having landed: its quota was refunded, the relay sent the "
        "batch anyway, and the user was charged nothing for it",
    ),
    (
        "plain@0:consumers-a/provider:sg.send#1=accept_5xx",
        "issue 32: SendGrid accepted the chunk and answered 504; the attempt was recorded "
        "rejected and the chunk sent again through Mailgun (every recipient twice)",
    ),
    (
        "lost_request@14650~:consumers-a/store:attempts.line#1=disconnect,"
        "consumers-a/ack:batch.*#1=lost,consumers-a/store:attempts.transition#1=lands,"
        "consumers-a/store:attempts.transition#2=kill",
        "found by the swarm: the caller's connection dropped, another delivery of its job "
        "waited for its lease (check 1) and acked the job; the caller then recorded its "
        "unknown answer as check 2 and died before publishing it: check 1 was stale, nothing "
        "held a message that could publish check 2, and the mail was never sent",
    ),
    (
        "walk@0:webhooks/publish:log.smtp.*.retry.1#1=unconfirmed",
        "issue 36, a chain of three: Mailgun's drop handed Ann over to the relay; the re-send's "
        "consumer read her row before the hand-off marked Mailgun's attempt superseded, took "
        "that attempt's acceptance for her own line's, recorded the re-send accepted without "
        "calling, and she stayed queued for ever",
    ),
    (
        "relay@0:consumers-a/store:recipients.reported_many.states#1=lands",
        "issue 36, found while fixing a review finding: a redelivery that applied only the "
        "answers of recipients still waiting skipped Bob, whose row the dead delivery had "
        "written before his hand-off: he stayed queued for ever",
    ),
]


@pytest.mark.parametrize(("schedule", "defect"), FIXED, ids=[f[0] for f in FIXED])
def test_a_schedule_that_broke_an_invariant_now_runs_clean(schedule: str, defect: str) -> None:
    """The run meets every invariant, and the schedule's faults all hit their steps."""
    outcome = run(decode(schedule), record=True)

    assert outcome.ok, "\n".join([defect, *describe(outcome)])
    hit = [s for s in outcome.steps if s.fault is not None]
    assert len(hit) == len(decode(schedule).faults), "a fault missed its step"
