"""How configuration names GitHub accounts (``shared.infra.github_accounts``): by id, with the login
as an optional reminder; a bare login is refused, saying how to find its id."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.infra.config import Settings
from shared.infra.github_accounts import Account, AccountError, ids, parse_accounts


def test_accounts_are_ids_with_an_optional_login_beside_them() -> None:
    found = parse_accounts(" 583231, alice:1001 ,,Bob-2:1002 ")

    assert found == (Account(583231), Account(1001, "alice"), Account(1002, "Bob-2"))
    assert ids(found) == {583231, 1001, 1002}


def test_organisations_are_ids_too_where_they_are_accepted() -> None:
    found = parse_accounts("org:77, ORG:acme:78, 1001", orgs=True)

    assert (ids(found, org=True), ids(found)) == (frozenset({77, 78}), frozenset({1001}))


@pytest.mark.parametrize(
    ("text", "orgs", "says"),
    [
        ("alice", False, "https://api.github.com/users/alice"),
        ("1001, departed-colleague", False, "write departed-colleague:<id>"),
        ("org:acme", True, "https://api.github.com/orgs/acme"),
        ("org:77", False, "organisations are not accepted here"),
        ("alice:bob", False, "is not an id, LOGIN:ID"),
        ("not a login:12", False, "is not a GitHub login"),
        ("alice:0", False, "is not a GitHub id"),
        ("alice:-3", False, "is not an id"),
        ("alice:\uff11\uff12", False, "is not an id"),  # full-width digits
    ],
)
def test_an_entry_without_an_id_is_refused_saying_how_to_write_it(
    text: str, orgs: bool, says: str
) -> None:
    with pytest.raises(AccountError) as info:
        parse_accounts(text, orgs=orgs)

    assert says in str(info.value)


def test_operators_named_by_login_stop_the_settings_from_loading() -> None:
    """An upgrade that still names an operator by login fails at start-up, naming the
    variable and where to read the id, instead of trusting whoever holds that login."""
    with pytest.raises(ValidationError) as info:
        Settings(operators="octocat")

    assert "https://api.github.com/users/octocat" in str(info.value)
    assert Settings(operators="octocat:583231, 1001").operator_ids == {583231, 1001}


def test_an_allowlist_naming_a_login_stops_the_settings_from_loading() -> None:
    with pytest.raises(ValidationError, match=r"api\.github\.com/users/alice"):
        Settings(signup_allow="org:acme:77, alice")
