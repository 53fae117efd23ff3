"""``/v1/openapi.json``: valid OpenAPI 3.1, in step with the routes, the models and the
committed copy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from openapi_spec_validator import validate
from pydantic import BaseModel, ValidationError
from starlette.routing import Route

from services.api import schema
from services.api.app import create_app
from services.api.openapi import OPERATIONS, document, reference, type_text
from shared.infra.config import Settings

COMMITTED = Path(__file__).resolve().parents[2] / "services" / "api" / "openapi.json"
#: Routes under /v1 that are not operations of the API itself.
NOT_OPERATIONS = {("/v1/openapi.json", "GET"), ("/v1/docs", "GET")}


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(document())  # raises on any error


def test_the_committed_document_is_the_built_one() -> None:
    built = json.dumps(document(), indent=2, sort_keys=True) + "\n"
    assert COMMITTED.read_text() == built, "run `make openapi` and review the diff"


def test_every_v1_route_is_documented_and_nothing_else() -> None:
    app = create_app(Settings())
    served = {
        (route.path, method)
        for route in app.routes
        if isinstance(route, Route) and route.path.startswith("/v1/")
        for method in (route.methods or set()) - {"HEAD"}
    }
    documented = {(op.path, op.method.upper()) for op in OPERATIONS}
    assert served - NOT_OPERATIONS == documented


def test_operation_ids_are_unique() -> None:
    ids = [op.operation_id for op in OPERATIONS]
    assert len(ids) == len(set(ids))


def test_every_path_parameter_is_declared_by_its_operation() -> None:
    for op in OPERATIONS:
        in_path = set(re.findall(r"{(\w+)}", op.path))
        declared = {p.name for p in op.params if p.where == "path"}
        assert in_path == declared, op.operation_id


def test_every_operation_answers_401_429_and_503_in_the_error_envelope() -> None:
    for methods in document()["paths"].values():
        for op in methods.values():
            for status in ("401", "429", "503"):
                ref = op["responses"][status]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorBody")


@pytest.mark.parametrize("model", [schema.BatchIn, schema.Accepted, schema.AddressIn])
def test_every_example_in_a_model_is_valid_for_it(model: type[BaseModel]) -> None:
    examples = model.model_json_schema().get("examples", [])
    for example in examples:
        model.model_validate(example)


@pytest.mark.parametrize(
    "body",
    [
        {
            "from": "a@example.com",
            "to": "b@example.com",
            "subject": "s",
            "text": "t",
            "bulk": "true",
        },
        {"from": "a@example.com", "to": [5], "subject": "s", "text": "t"},
        {"from": "a@example.com", "to": ["b@example.com"], "subject": "s", "extra": 1},
        {"from": {"email": "a@example.com", "nick": "x"}, "to": "b@example.com", "subject": "s"},
    ],
)
def test_the_batch_schema_is_strict(body: object) -> None:
    with pytest.raises(ValidationError):
        schema.BatchIn.model_validate(body)


def test_type_text_reads_unions_lists_refs_and_maps() -> None:
    node = {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"$ref": "#/components/schemas/RecipientIn"}},
            {"type": "object", "additionalProperties": {"type": "string"}},
            {"type": "null"},
        ]
    }
    assert type_text(node) == "string | list[RecipientIn] | map[string, string] | null"


def test_the_reference_page_lists_every_operation_and_schema() -> None:
    doc = document()
    page = reference(doc)
    assert {(o["method"], o["path"]) for o in page["operations"]} == {
        (op.method.upper(), op.path) for op in OPERATIONS
    }
    assert {s["name"] for s in page["schemas"]} == set(doc["components"]["schemas"])
