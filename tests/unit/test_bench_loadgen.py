"""The API load generator's counting: a request counts only when its answer is the expected
202, and its recipients are the ones that answer accepted."""

from __future__ import annotations

import uuid

import orjson

from bench import workload
from bench.loadgen import ACCEPTED, UNCOUNTED, Answer, Recorder, Tally, answer_of, progress_line
from services.api import sending
from shared.delivery import validation
from shared.infra.http import wire


def _accepted(count: int) -> Answer:
    return answer_of(202, orjson.dumps({"batch_id": str(uuid.uuid4()), "accepted": count}))


def _recorded(*answers: Answer, started: float = 10.0) -> Recorder:
    rec = Recorder(window_start=10.0, window_end=20.0)
    for answer in answers:
        rec.record(started, 0.005, answer)
    return rec


def test_the_apis_own_202_body_is_read_for_the_recipients_it_accepted() -> None:
    """The body services.api.sending.answer builds for the bench's request counts its 100."""
    parsed = validation.parse_batch_request(workload.request_body(0, 100), max_recipients=100)
    body = wire(sending.answer(uuid.uuid4(), parsed))

    assert answer_of(202, body) == Answer(ACCEPTED, 100)


def test_recipients_are_those_the_answers_accepted_not_requests_times_n() -> None:
    """Three 202s accepting 100, 100 and 40 count 240 recipients, 24 a second over 10 s."""
    result = _recorded(_accepted(100), _accepted(100), _accepted(40)).result(10.0)

    assert (result["ok"], result["recipients"], result["recipients_per_s"]) == (3, 240, 24.0)


def test_an_answer_other_than_202_counts_no_request_and_no_recipient() -> None:
    """A 503, a 429 and a connection error are errors, not throughput."""
    result = _recorded(
        answer_of(503, b'{"accepted": 100}'), answer_of(429, b""), Answer("ClientOSError")
    ).result(10.0)

    assert (result["ok"], result["recipients"], result["errors"]) == (0, 0, 3)


def test_a_202_that_does_not_say_what_it_accepted_is_not_counted() -> None:
    """A 202 with an empty, foreign or negative count is labelled apart and counts nothing."""
    answers = [
        answer_of(202, b""),
        answer_of(202, b'{"status": "success"}'),
        answer_of(202, b'{"accepted": true}'),
        answer_of(202, b'{"accepted": -1}'),
    ]
    result = _recorded(*answers).result(10.0)

    assert all(a == Answer(UNCOUNTED) for a in answers)
    assert (result["ok"], result["recipients"], result["statuses"]) == (0, 0, {UNCOUNTED: 4})


def test_progress_lines_count_only_accepted_requests() -> None:
    """Two 202s and three 503s in a second are 2 accepted/s, the 503s shown apart."""
    rec = _recorded(_accepted(100), _accepted(100), *[answer_of(503, b"")] * 3)

    line = progress_line("closed c=32", "measuring", Tally(), rec.tally, 1.0, 4.0)

    assert line == (
        "closed c=32 measuring: 2 accepted/s (200 recipients/s), 3 other answers, p99 4.0 ms"
    )


def test_answers_to_requests_started_outside_the_window_count_only_in_progress() -> None:
    """A request started in the warm-up adds to the progress tally, not to the result."""
    rec = _recorded(_accepted(100), started=9.99)

    assert (rec.result(10.0)["ok"], rec.result(10.0)["recipients"]) == (0, 0)
    assert rec.tally == Tally(accepted=1, recipients=100)


def test_the_timeline_gives_each_seconds_tail_and_keeps_the_warm_up_apart() -> None:
    """Each second of the window shows its p50, p99, worst latency and worst lag; the warm-up's
    seconds are listed apart, so a slow first second shows whether the load's start or the
    window's came with it."""
    rec = Recorder(window_start=10.0, window_end=20.0)
    for i in range(100):
        rec.record(10.0 + i / 100, (i + 1) / 1000, _accepted(100), lag=0.001)
    rec.record(9.5, 0.300, _accepted(100), lag=0.040)
    rec.record(11.2, 0.007, _accepted(100))

    result = rec.result(10.0)

    assert result["timeline"] == [
        {"t": 10.0, "second": 0, "n": 100, "p50": 50.5, "p99": 99.0, "max": 100.0, "lag_max": 1.0},
        {"t": 11.0, "second": 1, "n": 1, "p50": 7.0, "p99": 7.0, "max": 7.0, "lag_max": 0.0},
    ]
    assert result["warmup_timeline"] == [
        {"t": 9.0, "second": -1, "n": 1, "p50": 300.0, "p99": 300.0, "max": 300.0, "lag_max": 40.0}
    ]
    assert result["latency_ms"]["count"] == 101
