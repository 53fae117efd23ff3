"""Who the dashboard treats as an operator: the GitHub accounts of ``SAFEDELIVR_OPERATORS``,
by id, whatever login they (or anyone else) hold now."""

from __future__ import annotations

import uuid

from services.api.sessions import SessionUser, is_operator
from shared.infra.config import Settings

SETTINGS = Settings(operators="departed:4242, 583231")


def user(login: str, github_id: int | None) -> SessionUser:
    return SessionUser(uuid.uuid4(), login, None, None, None, "csrf", "session", github_id)


def test_an_account_that_took_a_listed_login_is_no_operator() -> None:
    """The login ``departed`` was let go and registered by someone else: not an operator."""
    assert not is_operator(SETTINGS, user("departed", 999))


def test_a_listed_account_stays_operator_under_a_new_login() -> None:
    assert is_operator(SETTINGS, user("moved-on", 4242))
    assert is_operator(SETTINGS, user("octocat", 583231))


def test_an_account_made_by_the_cli_is_no_operator_whatever_its_name() -> None:
    """CLI accounts have no GitHub id; a name is never enough."""
    assert not is_operator(SETTINGS, user("departed", None))
    assert not is_operator(SETTINGS, None)
