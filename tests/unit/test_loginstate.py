"""The logins in flight that a browser's login cookie holds: decoding is total, expiry and the
cap hold, and a state is taken once."""

from __future__ import annotations

import base64

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.api import loginstate
from services.api.loginstate import LOGIN_TTL, MAX_PENDING, PendingLogin
from services.api.session_store import new_token

NOW = 1_800_000_000


def _login(started: int = NOW, next_path: str = "/") -> PendingLogin:
    return PendingLogin(new_token(), new_token(), next_path, started)


def test_a_login_survives_the_round_trip_through_the_cookie() -> None:
    """What the login start encodes, the callback decodes."""
    pending = [_login(next_path="/batches?page=2"), _login()]

    assert loginstate.decode(loginstate.encode(pending), NOW) == pending


@given(st.text(max_size=300))
def test_any_cookie_value_decodes_to_a_list_without_raising(value: str) -> None:
    """A forged or damaged cookie is no login, never an error."""
    assert isinstance(loginstate.decode(value, NOW), list)


@pytest.mark.parametrize(
    "rows",
    [
        {"state": "x"},
        [["short", new_token(), "/", NOW]],
        [[new_token(), new_token(), "/", "yesterday"]],
        [[new_token(), new_token(), "/", True]],
        [[new_token(), new_token(), 5, NOW]],
        [[new_token(), new_token(), "/"]],
    ],
)
def test_ill_formed_entries_are_left_out(rows: object) -> None:
    """Entries of the wrong shape or type are not logins."""
    value = base64.urlsafe_b64encode(orjson.dumps(rows)).decode()

    assert loginstate.decode(value, NOW) == []


def test_a_login_older_than_the_ttl_is_dropped() -> None:
    """GitHub's codes live 10 minutes; so does our side of the login."""
    fresh, stale = _login(NOW - LOGIN_TTL + 1), _login(NOW - LOGIN_TTL)

    assert loginstate.decode(loginstate.encode([fresh, stale]), NOW) == [fresh]


def test_a_login_dated_in_the_future_is_dropped() -> None:
    """A start time after now is not one we wrote."""
    value = loginstate.encode([_login(NOW + 5)])

    assert loginstate.decode(value, NOW) == []


def test_at_most_a_few_logins_are_kept_newest_first() -> None:
    """A new login pushes out the oldest beyond the cap."""
    pending: list[PendingLogin] = []
    logins = [_login() for _ in range(MAX_PENDING + 2)]
    for login in logins:
        pending = loginstate.add(pending, login)

    assert pending == logins[::-1][:MAX_PENDING]


def test_a_long_next_path_is_not_kept() -> None:
    """The cookie stays small: a very long ``next`` becomes ``/``."""
    (kept,) = loginstate.add([], _login(next_path="/" + "a" * 2000))

    assert kept.next_path == "/"
    assert len(loginstate.encode([_login(next_path="/" + "a" * 511)] * MAX_PENDING)) < 4096


def test_taking_a_state_removes_it_and_keeps_the_others() -> None:
    """The callback spends exactly the login it finishes."""
    first, second = _login(), _login()

    taken, left = loginstate.take([first, second], second.state)

    assert taken == second
    assert left == [first]
    assert loginstate.take(left, second.state) == (None, left)


@pytest.mark.parametrize(
    # A well-formed token that was never issued (fixed: parallel workers collect the same ids).
    "state",
    [None, "", "not a token!", "Ab3_dE5-gH7kLm9nPq2rSt4uVw6xYz8AbCdEfGhIjKl"],
)
def test_an_unknown_or_malformed_state_takes_nothing(state: str | None) -> None:
    """Only a state this browser holds finishes a login."""
    pending = [_login()]

    assert loginstate.take(pending, state) == (None, pending)
