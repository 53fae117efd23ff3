"""The sign-up rule: who gets an account by logging in with GitHub, under each policy."""

from __future__ import annotations

import pytest

from shared.accounts.signup import Allowlist, decide, needs_orgs

ALICE, BOB, ZED, ACME = 1001, 1002, 9999, 77
ALLOW = Allowlist.parse(" alice:1001, 1002 ,org:acme:77,, ")


def test_an_allowlist_holds_account_and_organisation_ids() -> None:
    """Logins and organisation names written beside the ids are reminders, not kept."""
    assert Allowlist(accounts=frozenset({ALICE, BOB}), orgs=frozenset({ACME})) == ALLOW


@pytest.mark.parametrize("policy", ["open", "closed", "allowlist", "approval"])
def test_an_existing_user_is_let_in_under_every_policy(policy: str) -> None:
    assert decide(policy, existing=True, github_id=ZED) == "admit"  # type: ignore[arg-type]


def test_open_admits_a_newcomer() -> None:
    assert decide("open", existing=False, github_id=ZED) == "admit"


def test_closed_refuses_a_newcomer_even_one_on_the_allowlist() -> None:
    assert decide("closed", existing=False, github_id=ALICE, allowlist=ALLOW) == "refuse"


@pytest.mark.parametrize(
    ("github_id", "orgs", "decision"),
    [
        (ALICE, [], "admit"),
        (ZED, [5, ACME], "admit"),
        (ZED, [5], "refuse"),
        (ACME, [], "refuse"),
    ],
)
def test_allowlist_admits_listed_accounts_and_members_of_listed_organisations(
    github_id: int, orgs: list[int], decision: str
) -> None:
    assert (
        decide("allowlist", existing=False, github_id=github_id, orgs=orgs, allowlist=ALLOW)
        == decision
    )


def test_allowlist_admits_an_account_by_its_id_whatever_login_it_has_now() -> None:
    """The rule sees only ids: a renamed account stays admitted, and one that registered a
    listed login is no one the list names (the login cannot even reach the decision)."""
    assert decide("allowlist", existing=False, github_id=ALICE, allowlist=ALLOW) == "admit"
    assert decide("allowlist", existing=False, github_id=ZED, allowlist=ALLOW) == "refuse"


@pytest.mark.parametrize(
    ("request_state", "decision"),
    [(None, "pending"), ("pending", "pending"), ("approved", "admit"), ("refused", "refuse")],
)
def test_approval_admits_a_newcomer_only_once_an_operator_approved(
    request_state: str | None, decision: str
) -> None:
    assert (
        decide("approval", existing=False, github_id=ZED, request=request_state)  # type: ignore[arg-type]
        == decision
    )


def test_organisations_are_fetched_only_when_an_allowlist_names_one() -> None:
    assert needs_orgs("allowlist", ALLOW)
    assert not needs_orgs("allowlist", Allowlist.parse("alice:1001"))
    assert not needs_orgs("approval", ALLOW)
