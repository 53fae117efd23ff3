"""What an owner is shown of other accounts' claims on their domain
(``services.api.domain_claims``): that they exist, on which name and in which state; never who, and
nothing before the owner's own claim is verified."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from services.api.domain_claims import MAX_SHOWN, others, related, state_of
from shared.accounts.domains import Claim, SendingDomain

T0 = datetime(2026, 11, 26, 2, 0, tzinfo=UTC)
ME, ANN, BOB = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def domain(
    name: str,
    *,
    verified: bool = True,
    missing_since: datetime | None = None,
    unverified_at: datetime | None = None,
    unverified_reason: str | None = None,
) -> SendingDomain:
    return SendingDomain(
        name,
        "tok",
        T0,
        verified_at=T0 if verified else None,
        missing_since=missing_since,
        unverified_at=unverified_at,
        unverified_reason=unverified_reason,
    )


MINE = domain("mail.example.com")


@pytest.mark.parametrize(
    ("other", "concerns"),
    [
        ("mail.example.com", True),
        ("example.com", True),
        ("eu.mail.example.com", True),
        ("news.example.com", False),
        ("mail-x.example.com", False),
        ("xmail.example.com", False),
        ("mail.example.com.evil.net", False),
    ],
)
def test_a_claim_concerns_the_domain_its_parents_and_its_subdomains(
    other: str, concerns: bool
) -> None:
    assert related("mail.example.com", other) is concerns


def test_the_states_a_claim_is_shown_in() -> None:
    assert [
        state_of(domain("a.com", verified=False)),
        state_of(domain("a.com")),
        state_of(domain("a.com", missing_since=T0)),
        state_of(domain("a.com", verified=False, unverified_at=T0, unverified_reason="x")),
    ] == ["pending", "verified", "record_missing", "unverified"]


def test_nothing_is_shown_before_the_owners_claim_is_verified() -> None:
    """Adding a name proves nothing: it must not tell who else sends as it."""
    found = [Claim(ANN, domain("mail.example.com"))]

    assert others(ME, domain("mail.example.com", verified=False), found) is None


def test_an_owner_sees_how_many_accounts_claim_and_in_which_state_never_who() -> None:
    found = [
        Claim(ME, MINE),
        Claim(ANN, domain("mail.example.com", verified=False)),
        Claim(ANN, domain("eu.mail.example.com")),
        Claim(BOB, domain("example.com", missing_since=T0)),
    ]

    shown = others(ME, MINE, found)

    assert shown is not None
    assert shown.view() == {
        "accounts": 2,
        "verified": 2,
        "claims": [
            {"domain": "eu.mail.example.com", "state": "verified"},
            {"domain": "example.com", "state": "record_missing"},
            {"domain": "mail.example.com", "state": "pending"},
        ],
        "more": False,
    }
    words = str(shown.view())
    assert all(str(u) not in words for u in (ANN, BOB)) and "tok" not in words


def test_an_owner_alone_on_their_domain_sees_no_other_claim() -> None:
    shown = others(ME, MINE, [Claim(ME, MINE), Claim(ME, domain("eu.mail.example.com"))])

    assert shown is not None and (shown.accounts, shown.claims) == (0, ())


def test_the_list_is_capped_and_says_so() -> None:
    found = [Claim(uuid.uuid4(), domain(f"s{i}.mail.example.com")) for i in range(MAX_SHOWN + 5)]

    shown = others(ME, MINE, found)

    assert shown is not None
    assert (shown.accounts, len(shown.claims), shown.more) == (MAX_SHOWN + 5, MAX_SHOWN, True)
