"""Pure parts of GitHub login: authorize URL, PKCE, e-mail choice, ``next`` and origin checks."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from sandbox.oauth import pkce_challenge
from services.api import github
from services.api.session_store import safe_next
from services.api.sessions import same_origin
from shared.infra.config import GitHubSettings

SETTINGS = GitHubSettings(
    client_id="cid",
    oauth_base_url="https://github.example/",
    redirect_uri="https://mail.example/auth/github/callback",
)


def _query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def test_authorize_url_points_at_the_configured_authorize_endpoint() -> None:
    """The URL is the configured base plus GitHub's authorize path."""
    url = github.authorize_url(SETTINGS, state="s" * 43, challenge="c" * 43)

    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == (
        "https://github.example/login/oauth/authorize"
    )


def test_authorize_url_sends_the_exact_redirect_uri() -> None:
    """The registered redirect_uri is sent verbatim."""
    url = github.authorize_url(SETTINGS, state="s", challenge="c")

    assert _query(url)["redirect_uri"] == ["https://mail.example/auth/github/callback"]


def test_authorize_url_asks_only_for_user_email() -> None:
    """The only scope requested is user:email."""
    assert _query(github.authorize_url(SETTINGS, state="s", challenge="c"))["scope"] == [
        "user:email"
    ]


def test_authorize_url_carries_state_and_s256_challenge() -> None:
    """state, code_challenge and code_challenge_method=S256 are all present."""
    query = _query(github.authorize_url(SETTINGS, state="st", challenge="ch"))

    assert query["state"] == ["st"]
    assert query["code_challenge"] == ["ch"]
    assert query["code_challenge_method"] == ["S256"]
    assert query["client_id"] == ["cid"]


def test_code_challenge_matches_an_independent_s256() -> None:
    """Our S256 challenge equals the fake GitHub's own computation."""
    verifier = github.new_verifier()

    assert github.code_challenge(verifier) == pkce_challenge(verifier)


def test_verifier_has_the_length_pkce_requires() -> None:
    """A verifier is 43-128 unreserved characters."""
    verifier = github.new_verifier()

    assert 43 <= len(verifier) <= 128
    assert verifier.replace("-", "").replace("_", "").isalnum()


def test_primary_verified_email_is_chosen() -> None:
    """The primary address is used when GitHub verified it."""
    emails = [
        github.Email("other@example.com", primary=False, verified=True),
        github.Email("main@example.com", primary=True, verified=True),
    ]

    assert github.primary_verified_email(emails) == "main@example.com"


def test_unverified_primary_email_is_not_used() -> None:
    """An unverified primary address gives no e-mail, even if another is verified."""
    emails = [
        github.Email("main@example.com", primary=True, verified=False),
        github.Email("other@example.com", primary=False, verified=True),
    ]

    assert github.primary_verified_email(emails) is None


@pytest.mark.parametrize(
    "candidate",
    [
        "https://evil.com",
        "//evil.com",
        "/\\evil.com",
        "\\\\evil.com",
        "javascript:alert(1)",
        "evil.com",
        "/ok\r\nSet-Cookie: x=1",
        "",
        None,
    ],
)
def test_next_that_leaves_the_site_becomes_root(candidate: str | None) -> None:
    """Absolute, scheme-relative, backslashed or control-character targets become /."""
    assert safe_next(candidate) == "/"


@pytest.mark.parametrize("candidate", ["/", "/keys", "/batches/abc?state=failed"])
def test_local_next_is_kept(candidate: str) -> None:
    """A local path (with its query) is kept as is."""
    assert safe_next(candidate) == candidate


def test_cross_origin_header_is_refused() -> None:
    """An Origin other than ours is refused."""
    assert not same_origin("https://evil.com", None, {"https://mail.example"})


def test_same_origin_header_is_accepted() -> None:
    """Our own Origin is accepted."""
    assert same_origin("https://mail.example", "same-origin", {"https://mail.example"})


def test_null_origin_is_refused() -> None:
    """``Origin: null`` (sandboxed frames, some redirects) is refused."""
    assert not same_origin("null", None, {"https://mail.example"})


def test_cross_site_fetch_metadata_is_refused() -> None:
    """``Sec-Fetch-Site: cross-site`` is refused even without an Origin header."""
    assert not same_origin(None, "cross-site", {"https://mail.example"})
