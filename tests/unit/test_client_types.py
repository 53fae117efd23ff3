"""The typed client's shapes are the API's: ``_types.py`` is what ``tests/client_types.py``
renders from the committed OpenAPI document (itself checked against the models)."""

from __future__ import annotations

import json
import typing

import safedelivr_client
from safedelivr_client import _types

from tests.client_types import DOCUMENT, TYPES, render


def test_the_committed_client_types_are_rendered_from_the_committed_document() -> None:
    assert TYPES.read_text() == render(json.loads(DOCUMENT.read_text()))


def test_every_schema_of_the_document_is_a_client_type() -> None:
    schemas = json.loads(DOCUMENT.read_text())["components"]["schemas"]

    assert {name for name in schemas if name in vars(_types)} == set(schemas)


def test_a_shape_keeps_required_and_optional_keys_apart() -> None:
    """``LogEntry``: ``email`` is always there, ``template_version`` only for templates."""
    entry = _types.LogEntry

    assert "email" in entry.__required_keys__
    assert "template_version" in entry.__optional_keys__
    assert safedelivr_client.LogEntry is entry


def test_a_key_that_is_no_identifier_is_kept_as_the_api_spells_it() -> None:
    hints = typing.get_type_hints(_types.BatchIn)

    assert "from" in hints
    assert "from_" not in hints
