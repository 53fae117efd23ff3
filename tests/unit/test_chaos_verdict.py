"""The soak's verdict over clients, stored rows and the providers' record (pure)."""

from __future__ import annotations

from chaos.clients import addresses
from chaos.verdict import Recipient, Submission, address_class, deliveries, verdict


def sub(batch: str | None, emails: tuple[str, ...], started: float = 100.0) -> Submission:
    s = Submission("k", emails, started)
    if batch:
        s.batch_ids.add(batch)
    return s


def stored(batch: str, email: str, state: str, at: float | None = 101.0) -> Recipient:
    return Recipient(batch, email, state, at)


def test_addresses_are_unique_and_mix_the_three_fates() -> None:
    emails = addresses("run", 7, 40)
    assert len(set(emails)) == 40
    assert {address_class(e) for e in emails} == {"deliver", "bounce", "sgdrop"}


def test_a_chain_of_three_adds_the_addresses_only_the_third_provider_delivers() -> None:
    emails = addresses("run", 7, 40, walk=True)
    assert {address_class(e) for e in emails} == {"deliver", "bounce", "sgdrop", "sgmgdrop"}


def test_a_sendgrid_drop_is_delivered_only_by_mailgun() -> None:
    assert deliveries("sgdrop", {"sendgrid": 1, "mailgun": 1}) == (1, 1, 1)
    assert deliveries("bounce", {"sendgrid": 1}) == (0, 1, 1)


def test_an_address_two_providers_drop_is_delivered_by_the_third_and_passes_each_once() -> None:
    assert deliveries("sgmgdrop", {"sendgrid": 1, "mailgun": 1, "ses": 1}) == (1, 2, 1)


def test_an_address_two_providers_drop_counts_twice_when_one_accepts_it_twice() -> None:
    emails = ("sgmgdrop-1@x.example",)
    accepted = {emails[0]: {"sendgrid": 1, "mailgun": 2, "ses": 1}}
    stats = {"queued": 1, "success": 1, "failed": 0}
    rows = [stored("b1", emails[0], "success")]
    out = verdict([sub("b1", emails)], ["b1"], rows, accepted, stats, check_violations=0)
    assert (out["sent_twice"], out["never_sent"]) == (1, 0)


def test_a_clean_run_counts_zero_everywhere() -> None:
    emails = (
        "user-1@x.example",
        "bounce-2@x.example",
        "sgdrop-3@x.example",
        "sgmgdrop-4@x.example",
    )
    accepted = {
        "user-1@x.example": {"sendgrid": 1},
        "bounce-2@x.example": {"sendgrid": 1},
        "sgdrop-3@x.example": {"sendgrid": 1, "mailgun": 1},
        "sgmgdrop-4@x.example": {"sendgrid": 1, "mailgun": 1, "ses": 1},
    }
    rows = [
        stored("b1", emails[0], "success"),
        stored("b1", emails[1], "failed"),
        stored("b1", emails[2], "success", 111.0),
        stored("b1", emails[3], "success", 103.0),
    ]
    stats = {"queued": 4, "success": 3, "failed": 1}
    out = verdict([sub("b1", emails)], ["b1"], rows, accepted, stats, check_violations=0)
    assert out["accepted_recipients"] == 4
    bad = {k: v for k, v in out.items() if isinstance(v, int) and v and k != "accepted_recipients"}
    assert bad == {}
    assert out["p99_seconds_to_final"] == 11.0


def test_every_kind_of_violation_is_counted() -> None:
    emails = ("user-1@x.example", "user-2@x.example", "user-3@x.example")
    accepted = {
        "user-1@x.example": {"sendgrid": 1, "mailgun": 1},
        "user-3@x.example": {"sendgrid": 1},
    }
    rows = [
        stored("b1", emails[0], "success"),
        stored("b1", emails[1], "queued", None),
        stored("b1", emails[2], "failed"),
    ]
    subs = [sub("b1", emails), sub(None, ("user-9@x.example",))]
    out = verdict(
        subs, ["b1", "b2"], rows, accepted, {"queued": 3, "success": 2}, check_violations=4
    )
    assert out["sent_twice"] == 1
    assert out["never_sent"] == 1
    assert out["not_final"] == 1
    assert out["delivered_but_failed"] == 1
    assert out["clients_without_batch_id"] == 1
    assert out["batches_unknown_to_clients"] == 1
    assert out["stats_minus_outcomes"] == 2  # success 2 vs 1, failed 0 vs 1
    assert out["check_violations"] == 4
