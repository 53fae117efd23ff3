"""``/v1/openapi.json`` (OpenAPI 3.1) and the ``/v1/docs`` page, built from ``schema``'s models
and the routes themselves: :data:`OPERATIONS` is read from ``services.api.routes``, each
endpoint declaring its id, answer, body, parameters and errors
(``services.api.operations.operation``).

Nothing here is written by hand twice: the request and answer shapes are the models the
handlers validate with, and a test fails when an app route under ``/v1`` declares nothing, or
when the committed ``services/api/openapi.json`` is not what :func:`document` builds.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, models_json_schema
from pydantic_core import core_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from services.api import schema
from services.api.operations import ALWAYS, ERRORS, Operation, Param, operations
from services.api.routes import V1_ROUTES

_REF = "#/components/schemas/{model}"


#: Every ``/v1`` operation, read from the routes' endpoints (in the routes' order).
OPERATIONS: tuple[Operation, ...] = operations(V1_ROUTES)


class DocumentSchema(GenerateJsonSchema):
    """The models' JSON schema as the document states it: a union whose member is picked by
    the value's JSON type (the batch body's address forms, ``shared.delivery.batch_in``) is
    the plain ``anyOf`` it validates as (``oneOf`` would say no more, and the clients read
    ``anyOf``)."""

    def tagged_union_schema(self, schema: core_schema.TaggedUnionSchema) -> JsonSchemaValue:
        out = super().tagged_union_schema(schema)
        if "oneOf" in out and "discriminator" not in out:
            out["anyOf"] = out.pop("oneOf")
        return out


def document(server_url: str = "/") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``/v1``."""
    table = OPERATIONS
    models = {op.answer for op in table if op.answer} | {op.body for op in table if op.body}
    models.add(schema.ErrorBody)
    inputs: list[tuple[type[BaseModel], Literal["validation"]]] = [
        (m, "validation") for m in sorted(models, key=lambda m: m.__name__)
    ]
    _, definitions = models_json_schema(inputs, ref_template=_REF, schema_generator=DocumentSchema)
    paths: dict[str, dict[str, Any]] = {}
    for op in table:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Safedelivr",
            "version": "1",
            "description": "Multi-provider email delivery: submit a batch, follow each "
            "recipient's fate, keep suppressions, read daily stats. Every error is "
            '`{"error": {"code", "message", "fields"?, "limit"?}}`.',
        },
        "servers": [{"url": server_url}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key: `sd_live_<key_id>_<secret>`.",
                }
            },
        },
    }


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "parameters": [_parameter(p) for p in op.params],
        "responses": {str(op.status): _answer(op)},
    }
    if op.description:
        out["description"] = op.description
    out.update(op.extra)
    if op.body is not None:
        out["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(op.body)}},
        }
    for status in sorted({*op.errors, *ALWAYS}):
        out["responses"][str(status)] = {
            "description": ERRORS[status],
            "content": {"application/json": {"schema": _ref(schema.ErrorBody)}},
        }
    return out


def _answer(op: Operation) -> dict[str, Any]:
    if op.answer is None:
        return {"description": "Done; no body."}
    return {
        "description": (op.answer.__doc__ or op.summary).strip().splitlines()[0],
        "content": {"application/json": {"schema": _ref(op.answer)}},
    }


def _parameter(p: Param) -> dict[str, Any]:
    return {
        "name": p.name,
        "in": p.where,
        "required": p.required or p.where == "path",
        "description": p.description,
        "schema": {"type": p.type},
    }


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def openapi_doc(request: Request) -> dict[str, Any]:
    """This app's document (built once, on first use)."""
    state = request.app.state
    doc: dict[str, Any] | None = getattr(state, "openapi", None)
    if doc is None:
        doc = state.openapi = document()
    return doc


async def openapi_json(request: Request) -> Response:
    """``GET /v1/openapi.json``: public, like the docs page."""
    return JSONResponse(openapi_doc(request))


# --------------------------------------------------------------------------- the docs page


def type_text(node: dict[str, Any]) -> str:
    """A JSON schema as a short type expression: ``string | RecipientIn``, ``list[string]``."""
    if "$ref" in node:
        return str(node["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in node:
        return " | ".join(type_text(n) for n in node["anyOf"])
    kind = node.get("type", "any")
    if kind == "array":
        return f"list[{type_text(node.get('items', {}))}]"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string, {type_text(node['additionalProperties'])}]"
    return "null" if kind == "null" else str(kind)


def _body_text(body: dict[str, Any]) -> str:
    """A request body's type as the docs page shows it (``text/csv`` ones by their type)."""
    ((media, content),) = body["content"].items()
    text = type_text(content["schema"])
    return text if media == "application/json" else f"{media}: {text}"


def reference(doc: dict[str, Any]) -> dict[str, Any]:
    """What the ``/v1/docs`` page shows, flattened from the document."""
    operations = [
        {
            "method": method.upper(),
            "path": path,
            "id": op["operationId"],
            "summary": op["summary"],
            "description": op.get("description", ""),
            "parameters": op["parameters"],
            "body": _body_text(op["requestBody"]) if "requestBody" in op else None,
            "responses": [
                {
                    "status": status,
                    "description": answer["description"],
                    "schema": type_text(answer["content"]["application/json"]["schema"])
                    if "content" in answer
                    else None,
                }
                for status, answer in op["responses"].items()
            ],
        }
        for path, methods in doc["paths"].items()
        for method, op in methods.items()
    ]
    schemas = []
    for name, node in doc["components"]["schemas"].items():
        required = set(node.get("required", ()))
        schemas.append(
            {
                "name": name,
                "description": node.get("description", ""),
                "fields": [
                    {
                        "name": field_name,
                        "type": type_text(prop),
                        "required": field_name in required,
                        "description": prop.get("description", ""),
                    }
                    for field_name, prop in node.get("properties", {}).items()
                ],
                "examples": node.get("examples", []),
            }
        )
    return {"info": doc["info"], "operations": operations, "schemas": schemas}
