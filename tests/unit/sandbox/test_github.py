"""The GitHub OAuth stand-in: authorize, PKCE token exchange and the user APIs."""

from __future__ import annotations

import secrets
from urllib.parse import parse_qs, urlsplit

import httpx

from sandbox.oauth import pkce_challenge
from tests.unit.sandbox.conftest import Harness

CALLBACK = "http://app.local/auth/github/callback"
JSON = {"Accept": "application/json"}


async def _authorize(sandbox: Harness, verifier: str = "v" * 43, **params: str) -> dict[str, str]:
    query = {
        "client_id": "client-1",
        "redirect_uri": CALLBACK,
        "scope": "read:user user:email",
        "state": "st-1",
        "code_challenge": pkce_challenge(verifier),
        "code_challenge_method": "S256",
        **params,
    }
    response = await sandbox.client.get("/github/login/oauth/authorize", params=query)
    assert response.status_code == 302
    location = urlsplit(response.headers["location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == CALLBACK
    return {k: v[0] for k, v in parse_qs(location.query).items()}


async def _exchange(sandbox: Harness, code: str, **params: str) -> httpx.Response:
    form = {
        "client_id": "client-1",
        "client_secret": "secret-1",
        "code": code,
        "redirect_uri": CALLBACK,
        "code_verifier": "v" * 43,
        **params,
    }
    return await sandbox.client.post("/github/login/oauth/access_token", data=form, headers=JSON)


def test_pkce_challenge_matches_rfc_7636() -> None:
    """The S256 challenge is the one of RFC 7636's appendix B example."""
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"

    assert pkce_challenge(verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


async def test_full_login_flow(sandbox: Harness) -> None:
    """authorize → code + state, exchange with PKCE → token, then /user and /user/emails."""
    verifier = secrets.token_urlsafe(48)
    redirect = await _authorize(sandbox, verifier)

    token = await _exchange(sandbox, redirect["code"], code_verifier=verifier)
    auth = {"Authorization": f"Bearer {token.json()['access_token']}"}
    user = await sandbox.client.get("/github/api/user", headers=auth)
    emails = await sandbox.client.get("/github/api/user/emails", headers=auth)

    assert redirect["state"] == "st-1"
    assert token.json()["token_type"] == "bearer"
    assert token.json()["scope"] == "read:user,user:email"
    assert (user.json()["login"], user.json()["id"]) == ("sandbox-user", 1_000_001)
    assert emails.json() == [
        {
            "email": "sandbox-user@example.com",
            "primary": True,
            "verified": True,
            "visibility": "public",
        }
    ]


async def test_pkce_mismatch_is_refused(sandbox: Harness) -> None:
    """A wrong code_verifier gets GitHub's 200 error document, not a token."""
    redirect = await _authorize(sandbox)

    response = await _exchange(sandbox, redirect["code"], code_verifier="w" * 43)

    assert response.status_code == 200
    assert response.json()["error"] == "bad_verification_code"
    assert "access_token" not in response.json()


async def test_code_is_single_use(sandbox: Harness) -> None:
    """A code that was exchanged once is refused the second time."""
    redirect = await _authorize(sandbox)

    first = await _exchange(sandbox, redirect["code"])
    second = await _exchange(sandbox, redirect["code"])

    assert "access_token" in first.json()
    assert second.json()["error"] == "bad_verification_code"


async def test_redirect_uri_must_match(sandbox: Harness) -> None:
    """A different redirect_uri at the exchange is redirect_uri_mismatch."""
    redirect = await _authorize(sandbox)

    response = await _exchange(sandbox, redirect["code"], redirect_uri="http://evil.local/cb")

    assert response.json()["error"] == "redirect_uri_mismatch"


async def test_wrong_client_secret_is_refused(sandbox: Harness) -> None:
    """The secret ``invalid`` is incorrect_client_credentials."""
    redirect = await _authorize(sandbox)

    response = await _exchange(sandbox, redirect["code"], client_secret="invalid")

    assert response.json()["error"] == "incorrect_client_credentials"


async def test_form_encoded_answer_without_accept_json(sandbox: Harness) -> None:
    """Without Accept: application/json the token comes form-encoded, as GitHub does."""
    redirect = await _authorize(sandbox)

    response = await sandbox.client.post(
        "/github/login/oauth/access_token",
        data={
            "client_id": "client-1",
            "client_secret": "s",
            "code": redirect["code"],
            "code_verifier": "v" * 43,
        },
    )

    fields = parse_qs(response.text)
    assert fields["token_type"] == ["bearer"]
    assert fields["access_token"][0].startswith("gho_")


async def test_json_body_is_accepted(sandbox: Harness) -> None:
    """The exchange also takes a JSON body."""
    redirect = await _authorize(sandbox)

    response = await sandbox.client.post(
        "/github/login/oauth/access_token",
        json={
            "client_id": "client-1",
            "client_secret": "s",
            "code": redirect["code"],
            "code_verifier": "v" * 43,
        },
        headers=JSON,
    )

    assert "access_token" in response.json()


async def test_login_picks_a_user_with_an_unverified_email(sandbox: Harness) -> None:
    """``login=unverified-user`` signs in a user whose only address is unverified."""
    redirect = await _authorize(sandbox, login="unverified-user")
    token = (await _exchange(sandbox, redirect["code"])).json()["access_token"]
    auth = {"Authorization": f"token {token}"}

    user = (await sandbox.client.get("/github/api/user", headers=auth)).json()
    emails = (await sandbox.client.get("/github/api/user/emails", headers=auth)).json()

    assert (user["login"], user["email"]) == ("unverified-user", None)
    assert [(e["verified"], e["primary"]) for e in emails] == [(False, True)]


async def test_emails_need_the_email_scope(sandbox: Harness) -> None:
    """Without user:email (or user) the emails API answers 404, as GitHub does."""
    redirect = await _authorize(sandbox, scope="read:user")
    token = (await _exchange(sandbox, redirect["code"])).json()["access_token"]

    response = await sandbox.client.get(
        "/github/api/user/emails", headers={"Authorization": f"Bearer {token}"}
    )

    assert response.status_code == 404


async def test_unknown_token_is_bad_credentials(sandbox: Harness) -> None:
    """An unknown token gets 401 Bad credentials."""
    response = await sandbox.client.get(
        "/github/api/user", headers={"Authorization": "Bearer gho_nope"}
    )

    assert response.status_code == 401
    assert response.json()["message"] == "Bad credentials"


async def test_denied_authorization_redirects_with_error(sandbox: Harness) -> None:
    """``deny=1`` plays a user refusing: access_denied with the same state."""
    redirect = await _authorize(sandbox, deny="1")

    assert (redirect["error"], redirect["state"]) == ("access_denied", "st-1")
    assert "code" not in redirect


async def test_plain_pkce_method_is_refused(sandbox: Harness) -> None:
    """Only the S256 challenge method is supported."""
    redirect = await _authorize(sandbox, code_challenge_method="plain")

    assert redirect["error"] == "invalid_request"


async def test_an_account_id_plays_a_renamed_account_or_one_that_took_a_login(
    sandbox: Harness,
) -> None:
    """``id=<n>`` keeps the login asked for and gives the account that id."""
    redirect = await _authorize(sandbox, login="departed", id="4242")
    token = (await _exchange(sandbox, redirect["code"])).json()["access_token"]

    user = (
        await sandbox.client.get("/github/api/user", headers={"Authorization": f"token {token}"})
    ).json()

    assert (user["login"], user["id"]) == ("departed", 4242)


async def test_organisations_have_stable_ids_or_the_ids_given(sandbox: Harness) -> None:
    """``orgs=acme,beta:77``: acme with the id its name gives, beta with 77."""
    ids = []
    for _ in range(2):
        redirect = await _authorize(
            sandbox, orgs="acme,beta:77", scope="read:user user:email read:org"
        )
        token = (await _exchange(sandbox, redirect["code"])).json()["access_token"]
        auth = {"Authorization": f"token {token}"}
        orgs = (await sandbox.client.get("/github/api/user/orgs", headers=auth)).json()
        ids.append([(o["login"], o["id"]) for o in orgs])

    assert ids[0] == ids[1]
    assert ids[0][1] == ("beta", 77) and ids[0][0][0] == "acme"
