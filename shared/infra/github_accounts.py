"""GitHub accounts as the configuration names them (``SAFEDELIVR_OPERATORS``,
``SAFEDELIVR_SIGNUP_ALLOW``): by numeric id, never by login.

A login is a name its owner may change at any time and that anyone may register once it is
free again (renamed, deleted, mistyped in the configuration, a departed colleague's), so a
list of logins hands whatever it grants to whoever holds that name next. An account's id never
changes and is never given to another account.

An entry is ``ID`` or ``LOGIN:ID`` (``octocat:583231``): the login only tells a reader whose
id it is and is compared with nothing. An organisation is ``org:ID`` or ``org:NAME:ID``. A
bare login is refused at start-up, naming where to read its id, so an upgrade from the
releases that named logins fails loudly rather than keeping the hole or silently dropping
everyone it named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The prefix of an organisation.
ORG_PREFIX = "org:"
#: GitHub's logins: letters, digits and inner hyphens, at most 39 characters.
_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$")
#: GitHub's ids are positive 64-bit integers.
_MAX_ID = 2**63 - 1


class AccountError(ValueError):
    """An entry that names no account by id; the message says how to write it."""


@dataclass(frozen=True, slots=True)
class Account:
    """One account (or organisation) a setting names."""

    github_id: int
    label: str | None = None
    """The login written beside the id, for readers; never compared."""
    org: bool = False


def parse_accounts(text: str, *, orgs: bool = False) -> tuple[Account, ...]:
    """The accounts of a comma-separated setting (``orgs``: ``org:`` entries allowed).

    Raises:
        AccountError: naming the first entry that is not ``ID``, ``LOGIN:ID`` (or, with
            ``orgs``, ``org:ID``, ``org:NAME:ID``), and how to find the id it needs.
    """
    return tuple(parse_entry(e, orgs=orgs) for e in text.split(",") if e.strip())


def parse_entry(text: str, *, orgs: bool = False) -> Account:
    entry = text.strip()
    org = entry.lower().startswith(ORG_PREFIX)
    if org and not orgs:
        raise AccountError(f"{entry!r}: organisations are not accepted here")
    rest = entry[len(ORG_PREFIX) :] if org else entry
    label, _, number = rest.rpartition(":")
    if label and not _LOGIN.match(label):
        raise AccountError(f"{entry!r}: {label!r} is not a GitHub login")
    if not number.isascii() or not number.isdecimal():
        raise AccountError(_needs_id(entry, rest, org))
    github_id = int(number)
    if not 0 < github_id <= _MAX_ID:
        raise AccountError(f"{entry!r}: {number} is not a GitHub id")
    return Account(github_id, label or None, org)


def _needs_id(entry: str, name: str, org: bool) -> str:
    kind, where = ("organisation", "orgs") if org else ("login", "users")
    written = f"{ORG_PREFIX}{name}:<id>" if org else f"{name}:<id>"
    if not _LOGIN.match(name):
        return f"{entry!r} is not an id, LOGIN:ID or {ORG_PREFIX}NAME:ID"
    return (
        f"{entry!r} is a GitHub {kind}, and accounts are named by their numeric id here (a "
        f"{kind} can be renamed, and then registered by anyone): write {written}, the id "
        f'being the "id" of https://api.github.com/{where}/{name}'
    )


def ids(accounts: tuple[Account, ...], *, org: bool = False) -> frozenset[int]:
    """The ids of the accounts (``org``: of the organisations) among ``accounts``."""
    return frozenset(a.github_id for a in accounts if a.org == org)
