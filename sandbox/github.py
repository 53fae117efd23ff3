"""HTTP handlers of the GitHub stand-in: OAuth authorize and access_token, ``/user`` APIs.

Mounted at ``/github``: ``/login/oauth/authorize`` and ``/login/oauth/access_token`` play
``https://github.com``; ``/api/user`` and ``/api/user/emails`` play ``https://api.github.com``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from sandbox import oauth
from sandbox.state import state_of
from sandbox.wire import json_response

_DOCS = "https://docs.github.com/rest"


def routes() -> list[BaseRoute]:
    """Routes mounted at ``/github``."""
    return [
        Route("/login/oauth/authorize", authorize, methods=["GET"]),
        Route("/login/oauth/access_token", access_token, methods=["POST"]),
        Route("/api/user", api_user, methods=["GET"]),
        Route("/api/user/emails", api_user_emails, methods=["GET"]),
        Route("/api/user/orgs", api_user_orgs, methods=["GET"]),
    ]


async def authorize(request: Request) -> Response:
    """Approve at once as the chosen user and redirect back with ``code`` and ``state``.

    ``login=<name>`` picks the user; ``id=<n>`` gives them that account id instead of the
    login's own (an account renamed to ``login`` keeps its id; one that registered a released
    login has another); ``orgs=a,b:77`` makes them a member of those organisations (``b``
    with the id 77); ``deny=1`` plays a user who refuses access.
    """
    query = request.query_params
    client_id = query.get("client_id", "")
    redirect_uri = query.get("redirect_uri", "")
    if not client_id:
        return json_response({"error": "invalid_request", "error_description": "no client_id"}, 400)
    if urlsplit(redirect_uri).scheme not in ("http", "https"):
        return json_response(oauth.token_error("redirect_uri_mismatch"), 400)
    state = {"state": query["state"]} if "state" in query else {}
    challenge = query.get("code_challenge")
    if challenge is not None and query.get("code_challenge_method", "plain") != "S256":
        return _redirect(
            redirect_uri,
            error="invalid_request",
            error_description="code_challenge_method must be S256",
            **state,
        )
    if query.get("deny"):
        return _redirect(
            redirect_uri,
            error="access_denied",
            error_description="The user has denied your application access.",
            **state,
        )
    sandbox = state_of(request)
    user = oauth.find_user(query.get("login") or sandbox.tuning.github_default_login)
    if user is None:
        return json_response({"error": "invalid_request", "error_description": "bad login"}, 400)
    account = query.get("id", "")
    if account:
        if not account.isascii() or not account.isdecimal() or not 0 < int(account) < 2**63:
            return json_response({"error": "invalid_request", "error_description": "bad id"}, 400)
        user = replace(user, id=int(account))
    if query.get("orgs"):
        user = replace(user, orgs=tuple(o for o in query["orgs"].split(",") if o))
    grant = oauth.Grant(
        client_id=client_id,
        redirect_uri=redirect_uri,
        code_challenge=challenge,
        user=user,
        scopes=oauth.parse_scopes(query.get("scope")),
        expires_at=time.monotonic() + oauth.CODE_TTL,
    )
    return _redirect(redirect_uri, code=sandbox.oauth.issue_code(grant), **state)


async def access_token(request: Request) -> Response:
    """Exchange a code; errors come with status 200, as GitHub sends them."""
    params = dict(request.query_params)
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("application/json"):
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            return json_response({"error": "invalid_request"}, 400)
        params.update({k: v for k, v in body.items() if isinstance(v, str)})
    else:
        async with request.form() as form:
            params.update({k: v for k, v in form.items() if isinstance(v, str)})
    answer = state_of(request).oauth.exchange(params, now=time.monotonic())
    if "application/json" in request.headers.get("accept", ""):
        return json_response(answer)
    return Response(urlencode(answer), media_type="application/x-www-form-urlencoded")


async def api_user(request: Request) -> Response:
    """``GET /user`` for the token's user."""
    found = _authenticate(request)
    if found is None:
        return _bad_credentials()
    return json_response(found[0].as_json())


async def api_user_emails(request: Request) -> Response:
    """``GET /user/emails``; needs the ``user:email`` (or ``user``) scope, else 404."""
    found = _authenticate(request)
    if found is None:
        return _bad_credentials()
    user, scopes = found
    if not oauth.can_read_emails(scopes):
        return json_response(
            {"message": "Not Found", "documentation_url": _DOCS, "status": "404"}, 404
        )
    return json_response([e.as_json() for e in user.emails])


async def api_user_orgs(request: Request) -> Response:
    """``GET /user/orgs``: the memberships a token with ``read:org`` may see (this stand-in
    plays every membership as private, so without the scope the list is empty)."""
    found = _authenticate(request)
    if found is None:
        return _bad_credentials()
    user, scopes = found
    orgs = user.orgs if "read:org" in scopes or "admin:org" in scopes else ()
    return json_response([oauth.org_json(entry) for entry in orgs])


def _authenticate(request: Request) -> tuple[oauth.GitHubUser, tuple[str, ...]] | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() not in ("bearer", "token") or not token.strip():
        return None
    return state_of(request).oauth.token(token.strip())


def _bad_credentials() -> Response:
    return json_response(
        {"message": "Bad credentials", "documentation_url": _DOCS, "status": "401"}, 401
    )


def _redirect(uri: str, **params: str) -> Response:
    parts = urlsplit(uri)
    query = urlencode([*parse_qsl(parts.query, keep_blank_values=True), *params.items()])
    return RedirectResponse(urlunsplit(parts._replace(query=query)), status_code=302)
