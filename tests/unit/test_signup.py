"""The sign-up rule: who gets an account by logging in with GitHub, under each policy."""

from __future__ import annotations

import pytest

from shared.signup import Allowlist, decide, needs_orgs

ALLOW = Allowlist.parse(" Alice, bob ,org:Acme,, ")


def test_an_allowlist_holds_logins_and_organisations_in_lower_case() -> None:
    assert Allowlist(logins=frozenset({"alice", "bob"}), orgs=frozenset({"acme"})) == ALLOW


@pytest.mark.parametrize("policy", ["open", "closed", "allowlist", "approval"])
def test_an_existing_user_is_let_in_under_every_policy(policy: str) -> None:
    assert decide(policy, existing=True, login="zed") == "admit"  # type: ignore[arg-type]


def test_open_admits_a_newcomer() -> None:
    assert decide("open", existing=False, login="zed") == "admit"


def test_closed_refuses_a_newcomer_even_one_on_the_allowlist() -> None:
    assert decide("closed", existing=False, login="alice", allowlist=ALLOW) == "refuse"


@pytest.mark.parametrize(
    ("login", "orgs", "decision"),
    [
        ("ALICE", [], "admit"),
        ("zed", ["other", "ACME"], "admit"),
        ("zed", ["other"], "refuse"),
        ("alice-evil", [], "refuse"),
        ("org:acme", [], "refuse"),
    ],
)
def test_allowlist_admits_listed_logins_and_members_of_listed_organisations(
    login: str, orgs: list[str], decision: str
) -> None:
    assert decide("allowlist", existing=False, login=login, orgs=orgs, allowlist=ALLOW) == decision


@pytest.mark.parametrize(
    ("request_state", "decision"),
    [(None, "pending"), ("pending", "pending"), ("approved", "admit"), ("refused", "refuse")],
)
def test_approval_admits_a_newcomer_only_once_an_operator_approved(
    request_state: str | None, decision: str
) -> None:
    assert (
        decide("approval", existing=False, login="zed", request=request_state)  # type: ignore[arg-type]
        == decision
    )


def test_organisations_are_fetched_only_when_an_allowlist_names_one() -> None:
    assert needs_orgs("allowlist", ALLOW)
    assert not needs_orgs("allowlist", Allowlist.parse("alice"))
    assert not needs_orgs("approval", ALLOW)
