"""The dashboard's Operations page, for the GitHub accounts (by id) of
``SAFEDELIVR_OPERATORS``: each provider's health, circuit and pause, the live settings and
their audit, dead letters (the latest here, every one a page at a time and by queue on
``/operations/dead-letters``), sign-up requests and who claims a sending domain, each with the
action an operator takes at 2 a.m. from a phone. Every action is the same use case as its API
route or CLI command; to anyone else the page does not exist (404)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.api import queries
from services.api.dashboard.pages import checked_form, page, page_user, render, see_other
from services.api.domains import operator_claims
from services.api.providers import provider_rows
from services.api.sessions import SessionUser, is_operator
from services.api.settings import change_settings, settings_store
from shared.accounts import domains, signup
from shared.core.catalog import CATALOG, CODES
from shared.infra.config import Settings
from shared.infra.http import ApiError
from shared.ops.alerts import SYSTEM_LOGIN
from shared.ops.deadletters import DeadLetters, LetterArchive, ReplayRefused, view
from shared.ops.livesettings import SettingsError, check, defaults, resolve

DEAD_SHOWN = 50
#: Letters on a page of the dead letters page.
LETTERS_PER_PAGE: Final = 25
#: Letters read from the archive at a time while filtering by queue, and at most per page
#: (past that the page ends early and its "Older" link goes on from where it stopped).
SCAN_CHUNK: Final = 200
SCAN_BUDGET: Final = 2_000


@dataclass(frozen=True, slots=True)
class LetterPage:
    letters: list[dict[str, Any]]
    next_after: str | None
    """The id to go on after (None: nothing older)."""


async def letter_page(
    store: LetterArchive, queue: str | None, after: str | None, limit: int = LETTERS_PER_PAGE
) -> LetterPage:
    """Up to ``limit`` letters, newest first, after the letter ``after``, of ``queue`` only
    when it is given: the archive is read as ``/v1/dead-letters`` pages it, a chunk at a
    time, and at most :data:`SCAN_BUDGET` letters per page."""
    if queue is None:
        found = await store.page(limit + 1, after)
        shown = found[:limit]
        more = len(found) > limit
        return LetterPage([view(x) for x in shown], shown[-1].id if more and shown else None)
    kept: list[dict[str, Any]] = []
    scanned = 0
    cursor = after
    while scanned < SCAN_BUDGET:
        chunk = await store.page(SCAN_CHUNK, cursor)
        for letter in chunk:
            scanned += 1
            cursor = letter.id
            if letter.queue == queue:
                kept.append(view(letter))
                if len(kept) == limit:
                    # Whether anything older is left is known on the next page.
                    return LetterPage(kept, cursor)
        if len(chunk) < SCAN_CHUNK:
            return LetterPage(kept, None)
    return LetterPage(kept, cursor)


def by(user: SessionUser) -> str:
    """Who an audit names: the GitHub id, which stays theirs, and the login they had then."""
    return f"dashboard:{user.login}#{user.github_id}"


async def _operator(request: Request) -> tuple[SessionUser, dict[str, str] | None]:
    """The logged-in operator and, for a POST, its CSRF-checked form; 404 for anyone else."""
    user = await page_user(request)
    if not is_operator(request.app.state.settings, user):
        raise ApiError(404, "not_found", "There is no such page.")
    if request.method != "POST":
        return user, None
    form = await checked_form(request, user)
    return user, form


@page
async def operations(request: Request) -> Response:
    await _operator(request)
    settings: Settings = request.app.state.settings
    db = request.app.state.resources.db
    store = settings_store(request)
    live = resolve(await store.stored(), settings.providers)
    letters: DeadLetters = request.app.state.dead_letters
    requests = await signup.SignupRequests(db).all(200)
    claims_domain = _domain_asked(request.query_params.get("claims", ""))
    claims = (
        await operator_claims(request.app.state.domains, db, claims_domain) if claims_domain else []
    )
    context: dict[str, Any] = {
        "title": "Operations",
        "active": "operations",
        "providers": await provider_rows(settings, db),
        "live": live,
        "chain": ",".join(CATALOG[c].name.lower() for c in live.chain),
        "limits": live.limits(),
        "codes": CODES,
        "catalog": CATALOG,
        "system_login": SYSTEM_LOGIN,
        "changes": await store.audit(20),
        "letters": [view(x) for x in await letters.store.page(DEAD_SHOWN)],
        "letters_shown": DEAD_SHOWN,
        "signups": [r for r in requests if r.state == "pending"],
        "claims_domain": claims_domain,
        "claims": claims,
        "notice": _NOTICES.get(request.query_params.get("done", "")),
    }
    return render(request, "operations.html", context)


def _domain_asked(raw: str) -> str | None:
    try:
        return domains.normalize_domain(raw) if raw.strip() else None
    except domains.DomainError:
        return None


_NOTICES = {
    "settings": "Settings changed: every process applies them within a second.",
    "unchanged": "Nothing was changed.",
    "replayed": "The dead letter was published again.",
    "deleted": "The dead letter was deleted.",
    "approved": "The sign-up request was approved: they can log in now.",
    "refused": "The sign-up request was refused.",
}


@page
async def change(request: Request) -> Response:
    """The settings form and the pause buttons: only fields sent, and only values that
    differ, are changed (and audited)."""
    user, form = await _operator(request)
    assert form is not None  # noqa: S101 - POST only
    names = {
        "chain": "providers.chain",
        "max_attempts": "providers.max_attempts",
        "alert_url": "alerts.webhook_url",
        "alert_cool_off": "alerts.cool_off",
        "alert_queue_depth": "alerts.queue_depth",
        "alert_error_burst": "alerts.error_burst",
        "alert_email_to": "alerts.email_to",
        "alert_email_from": "alerts.email_from",
        "health_open_below": "providers.health.open_below",
        "health_demote_below": "providers.health.demote_below",
        "health_cool_down": "providers.health.cool_down",
        "health_probe_share": "providers.health.probe_share",
        "capacity_enabled": "capacity.enabled",
        "capacity_initial": "capacity.initial",
        "capacity_bounce": "capacity.max_bounce_rate",
        "capacity_complaint": "capacity.max_complaint_rate",
        **{f"{c}_rate_limit": f"providers.{c}.rate_limit" for c in CODES},
        **{f"{c}_paused": f"providers.{c}.paused" for c in CODES},
    }
    changes: dict[str, str] = {}
    problems: list[str] = []
    for field, name in names.items():
        if field not in form:
            continue
        try:
            changes[name] = check(name, form[field])
        except SettingsError as exc:
            problems += [f"{k}: {v}" for k, v in exc.fields.items()]
    if problems:
        raise ApiError(422, "invalid_fields", "; ".join(problems))
    # The form sends every field: only those that differ from what is in force (stored, or
    # the environment's default) are changes, so saving one field audits that one.
    settings: Settings = request.app.state.settings
    in_force = {**defaults(settings.providers), **await settings_store(request).stored()}
    changes = {k: v for k, v in changes.items() if in_force.get(k) != v}
    if not changes:
        return see_other("/operations", done="unchanged")
    await change_settings(request, changes, by=by(user))
    return see_other("/operations", done="settings")


@page
async def dead_letters_page(request: Request) -> Response:
    """Every dead letter, newest first, a page at a time, of one queue when asked."""
    await _operator(request)
    letters: DeadLetters = request.app.state.dead_letters
    queue = request.query_params.get("queue", "").strip()[:200] or None
    cursor = queries.decode_cursor(request.query_params.get("cursor"))
    after = str(cursor.get("after")) if cursor else None
    found = await letter_page(letters.store, queue, after)
    next_cursor = queries.encode_cursor({"after": found.next_after}) if found.next_after else None
    context: dict[str, Any] = {
        "title": "Dead letters",
        "active": "operations",
        "letters": found.letters,
        "queue": queue,
        "next_cursor": next_cursor,
        "paged": after is not None,
        "waiting": await letters.store.waiting(),
        "notice": _NOTICES.get(request.query_params.get("done", "")),
    }
    return render(request, "dead_letters.html", context)


@page
async def dead_letter(request: Request) -> Response:
    _, form = await _operator(request)
    assert form is not None  # noqa: S101 - POST only
    letters: DeadLetters = request.app.state.dead_letters
    letter_id, action = form.get("id", ""), form.get("action")
    # The dead letters page sends its filter along, to come back to it.
    from_page = form.get("back") == "letters"
    path = "/operations/dead-letters" if from_page else "/operations"
    queue = form.get("queue", "").strip()
    back = {"queue": queue} if from_page and queue else {}
    if action == "replay":
        try:
            await letters.replay(letter_id)
        except ReplayRefused as exc:
            raise ApiError(409 if exc.code != "not_found" else 404, exc.code, exc.message) from None
        return see_other(path, done="replayed", **back)
    if action == "delete":
        if not await letters.delete(letter_id):
            raise ApiError(404, "not_found", "There is no such dead letter.")
        return see_other(path, done="deleted", **back)
    raise ApiError(400, "bad_form", "replay or delete?")


@page
async def answer_signup(request: Request) -> Response:
    user, form = await _operator(request)
    assert form is not None  # noqa: S101 - POST only
    answers: dict[str, signup.RequestState] = {"approved": "approved", "refused": "refused"}
    answer = answers.get(form.get("answer", ""))
    if answer is None:
        raise ApiError(400, "bad_form", "approve or refuse?")
    requests = signup.SignupRequests(request.app.state.resources.db)
    account = form.get("github_id", "")
    if not account.isascii() or not account.isdecimal() or len(account) > 19:
        raise ApiError(404, "not_found", "There is no such sign-up request.")
    if not await requests.answer(int(account), answer, by(user)):
        raise ApiError(404, "not_found", "There is no such sign-up request.")
    return see_other("/operations", done=answer)


def operations_routes() -> list[BaseRoute]:
    return [
        Route("/operations", operations, methods=["GET"], name="dashboard_operations"),
        Route("/operations/settings", change, methods=["POST"]),
        Route("/operations/dead-letters", dead_letter, methods=["POST"]),
        Route(
            "/operations/dead-letters",
            dead_letters_page,
            methods=["GET"],
            name="dashboard_dead_letters",
        ),
        Route("/operations/signups", answer_signup, methods=["POST"]),
    ]
