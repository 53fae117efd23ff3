"""Each ``/v1`` operation's documentation, declared on its endpoint with :func:`operation`:
its id, summary, answer and body models, parameters and errors. :func:`operations` reads them
back from the routes, so the route table is written once (``services.api.routes``) and
``services.api.openapi`` builds the document from it.

A leaf: it imports nothing of the API, so every handler module may import it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.routing import BaseRoute, Route

_Endpoint = TypeVar("_Endpoint", bound=Callable[..., Any])
#: The endpoint attribute :func:`operation` sets.
_ATTRIBUTE = "__operation__"

#: Why each error status happens, shared by every operation that can answer it.
ERRORS: dict[int, str] = {
    400: "Malformed JSON, a bad cursor or a bad Idempotency-Key.",
    401: "Missing or invalid API key: unknown, revoked, expired or wrong (one body for every "
    "case).",
    403: "The API key lacks the scope this operation needs (`send`, `read`, `keys` or "
    "`operator`), or "
    "would grant a scope it does not hold; or (`suppressed_by_recipient`) the suppression to "
    "delete is the recipient's own, which only an operator key may lift.",
    404: "No such resource, or not yours.",
    409: "The Idempotency-Key was used with another body, or its first request is still "
    "in progress (retry after `Retry-After`); for a new key or domain, the user holds the "
    "most allowed; for a list import, another import of the list is in progress. A cap "
    "reached (`too_many_lists`, `too_many_templates`, `too_many_versions`, "
    "`too_many_campaigns`, `too_many_imports`) names it and its value in `error.limit`; "
    "deleting one (or an import ending) frees its place.",
    413: "The body is over the size cap (refused while it streams in); for a list import, "
    "also `too_many_contacts`: more rows than one import may carry (`error.limit`); for a "
    "batch, also `batch_too_large`: what it would store is more than one batch may hold "
    "(`error.limit`), and nothing was charged or stored.",
    415: "The body is not JSON (for a CSV import: not `text/csv`).",
    422: "Invalid fields: `error.fields` names each one (a `from` outside your verified "
    "domains included).",
    429: "Over the key's request rate or the user's daily recipient quota; retry after "
    "`Retry-After` seconds.",
    503: "Cassandra or RabbitMQ is unavailable, or the API is overloaded (for a template: "
    "`renderer_unavailable`, every template renderer busy); nothing was "
    "accepted: retry (with the same Idempotency-Key) after `Retry-After`. Except "
    "`acceptance_unknown` (a batch sent without an Idempotency-Key): the batch named by "
    "`error.batch_id` may have been accepted; look it up before sending it again.",
}
#: The errors every operation may answer, declared or not.
ALWAYS = (401, 403, 429, 503)


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "query" | "path" | "header"
    description: str
    type: str = "string"
    required: bool = False


@dataclass(frozen=True)
class Doc:
    """What an endpoint declares about itself: everything but its method and path."""

    operation_id: str
    summary: str
    answer: type[BaseModel] | None
    status: int = 200
    body: type[BaseModel] | None = None
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = ()
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Operation(Doc):
    """A documented endpoint with the method and path its route serves it under."""

    method: str
    path: str


CURSOR = Param("cursor", "query", "`next_cursor` of the previous page.")
LIST = Param(
    "list",
    "query",
    "A list or campaign name (for a contact list: its id): its own suppressions (one-click "
    "unsubscribes from mail that named it) instead of the ones that stop all of your mail.",
)
DOMAIN = Param("domain", "path", "The domain, e.g. `example.com`.", required=True)
BATCH_ID = Param("batch_id", "path", "The batch's id (a time UUID).", required=True)
WEBHOOK_ID = Param("endpoint_id", "path", "The endpoint's id.", required=True)
LIST_ID = Param("list_id", "path", "The list's id.", required=True)
CSV_BODY = {
    "requestBody": {
        "required": True,
        "description": "A CSV file (UTF-8; comma, semicolon or tab separated). The first "
        "row names the columns when one of them is `email` (or `e-mail`, `email address`, "
        "`address`); otherwise the column whose first cell is an address holds the "
        "addresses and the others are named by their position from 0: `field0`, `field1`... "
        "(the address column's number is skipped). Every other column becomes a field of the "
        'contact (its substitutions), `name` its display name. Cells are quoted with `"` '
        '(a doubled `""` inside is a quote); rows end in LF, CRLF or CR.',
        "content": {"text/csv": {"schema": {"type": "string"}}},
    }
}
TEMPLATE_ID = Param("template_id", "path", "The template's id.", required=True)
LETTER_ID = Param("letter_id", "path", "The dead letter's id, from the listing.", required=True)
CAMPAIGN_ID = Param("campaign_id", "path", "The campaign's id.", required=True)


def operation(
    operation_id: str,
    summary: str,
    answer: type[BaseModel] | None,
    *,
    status: int = 200,
    body: type[BaseModel] | None = None,
    params: tuple[Param, ...] = (),
    errors: tuple[int, ...] = (),
    description: str = "",
    extra: dict[str, Any] | None = None,
) -> Callable[[_Endpoint], _Endpoint]:
    """Declare the endpoint an operation of ``/v1``: the document describes it as this says,
    under the method and path of the route that serves it. ``errors`` are the statuses it
    may answer besides :data:`ALWAYS`; ``extra`` is merged into its OpenAPI object as is."""
    doc = Doc(operation_id, summary, answer, status, body, params, errors, description, extra or {})

    def declare(endpoint: _Endpoint) -> _Endpoint:
        setattr(endpoint, _ATTRIBUTE, doc)
        return endpoint

    return declare


def declared(endpoint: object) -> Doc | None:
    """What :func:`operation` declared on the endpoint, if anything."""
    found = getattr(endpoint, _ATTRIBUTE, None)
    return found if isinstance(found, Doc) else None


def operations(routes: Iterable[BaseRoute]) -> tuple[Operation, ...]:
    """Every declared operation of the routes, in route order, with its method and path."""
    found = []
    for route in routes:
        if not isinstance(route, Route):
            continue
        doc = declared(route.endpoint)
        if doc is None:
            continue
        # Field by field: ``asdict`` would turn the ``Param``s into dicts too.
        declared_fields = {f.name: getattr(doc, f.name) for f in fields(doc)}
        for method in sorted((route.methods or set()) - {"HEAD"}):
            found.append(Operation(**declared_fields, method=method.lower(), path=route.path))
    return tuple(found)
