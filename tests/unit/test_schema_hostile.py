"""``services.api.schema`` on hostile input (pure): the strict request models, ``checked`` and
``field_errors``, how ``Sending`` combines the schema with ``shared.delivery.validation``, and that
every refusal renders as the documented error envelope, never as an exception."""

from __future__ import annotations

import functools
from typing import Any, cast

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from services.api.schema import BatchIn, ErrorBody, KeyIn, SuppressionIn, checked
from services.api.sending import Sending
from shared.delivery import validation
from shared.infra.config import ApiSettings, Settings
from shared.infra.http import ApiError, error_response

CODES = {"invalid_fields", "no_recipients", "too_many_recipients"}
GOOD = {"from": "shop@example.com", "to": ["ann@example.com"], "subject": "Hi", "text": "x"}


def refusal(model: type[BaseModel], body: object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        checked(model, body)
    return caught.value


def rendered(error: ApiError) -> dict[str, Any]:
    """The error as a client receives it, checked against the documented envelope."""
    response = error_response(error)
    body: dict[str, Any] = orjson.loads(response.body)
    ErrorBody.model_validate(body)
    assert response.status_code == error.status
    return body


@functools.cache
def sending(max_recipients: int = 50) -> Sending:
    """A Sending for its pure validation step only (its stores are never reached)."""
    unused = cast(Any, None)
    return Sending(
        settings=Settings(api=ApiSettings(max_recipients=max_recipients, sender_domains="any")),
        acceptance=unused,
        batches=unused,
        suppressions=unused,
        idempotency=unused,
        quota=unused,
        metrics=unused,
        background=unused,
    )


# --- checked ---------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [SuppressionIn, KeyIn])
@pytest.mark.parametrize("body", [None, [], ["email"], "a@example.com", 5, True, 1.5])
def test_a_body_that_is_not_an_object_is_a_field_error_on_body(
    model: type[BaseModel], body: object
) -> None:
    """Any non-object JSON is 422 ``invalid_fields`` keyed ``body``."""
    error = refusal(model, body)

    assert (error.status, error.code) == (422, "invalid_fields")
    assert list(error.fields or {}) == ["body"]


@pytest.mark.parametrize(
    ("model", "body", "field"),
    [
        (SuppressionIn, {"email": 5}, "email"),
        (SuppressionIn, {"email": True}, "email"),
        (SuppressionIn, {"email": ["a@example.com"]}, "email"),
        (SuppressionIn, {"email": {"email": "a@example.com"}}, "email"),
        (SuppressionIn, {"email": "a@example.com", "reason": 404}, "reason"),
        (SuppressionIn, {}, "email"),
        (KeyIn, {"name": 1}, "name"),
        (KeyIn, {"name": False}, "name"),
        (KeyIn, {"name": None}, "name"),
    ],
)
def test_types_are_not_coerced(model: type[BaseModel], body: object, field: str) -> None:
    """Numbers, booleans, lists, objects and null are not strings: the field is named."""
    error = refusal(model, body)

    assert list(error.fields or {}) == [field]


@pytest.mark.parametrize("model", [SuppressionIn, KeyIn])
@pytest.mark.parametrize("extra", ["admin", "user_id", "\r\nX-Evil: 1", "\u202e", "a" * 500])
def test_an_unknown_field_is_named_verbatim_and_still_renders(
    model: type[BaseModel], extra: str
) -> None:
    """Extra fields are refused by name, even hostile names, and the envelope still renders."""
    body = {"email": "a@example.com"} if model is SuppressionIn else {}

    error = refusal(model, {**body, extra: True})

    assert error.fields == {extra: "Extra inputs are not permitted"}
    assert rendered(error)["error"]["fields"] == {extra: "Extra inputs are not permitted"}


@pytest.mark.parametrize(
    ("model", "body", "refused"),
    [
        (KeyIn, {"name": "n"}, None),
        (KeyIn, {"name": "n" * 100}, None),
        (KeyIn, {"name": "\U0001f511" * 100}, None),
        (KeyIn, {"name": ""}, "name"),
        (KeyIn, {"name": "n" * 101}, "name"),
        (SuppressionIn, {"email": "a@example.com", "reason": "r" * 200}, None),
        (SuppressionIn, {"email": "a@example.com", "reason": "r" * 201}, "reason"),
        (SuppressionIn, {"email": "a@example.com", "reason": ""}, "reason"),
        (SuppressionIn, {"email": "a" * 308 + "@example.com"}, None),
        (SuppressionIn, {"email": "a" * 309 + "@example.com"}, "email"),
    ],
)
def test_length_limits_are_inclusive_and_count_characters(
    model: type[BaseModel], body: dict[str, str], refused: str | None
) -> None:
    """Names up to 100, reasons up to 200 and addresses up to 320 characters (not bytes)."""
    if refused is None:
        checked(model, body)
    else:
        assert list(refusal(model, body).fields or {}) == [refused]


def test_defaults_fill_absent_optional_fields() -> None:
    """A key without a name is "api"; a suppression without a reason is "manual"."""
    assert checked(KeyIn, {}).name == "api"
    assert checked(SuppressionIn, {"email": "a@example.com"}).reason == "manual"


# --- field_errors ----------------------------------------------------------------------------


def test_list_items_are_keyed_by_index() -> None:
    """An error inside a list is keyed ``field[index]``."""
    error = refusal(BatchIn, {**GOOD, "categories": ["ok", 5, "fine", None]})

    assert error.fields == {
        "categories[1]": "Input should be a valid string",
        "categories[3]": "Input should be a valid string",
    }


def test_every_invalid_field_is_reported_at_once() -> None:
    """The caller learns about all problems in one answer, each field once."""
    error = refusal(BatchIn, {**GOOD, "subject": 1, "bulk": "yes", "html": [], "nope": 0})

    assert set(error.fields or {}) == {"subject", "bulk", "html", "nope"}


def test_errors_inside_union_fields_are_keyed_by_their_documented_path() -> None:
    """``to[0].email``, as the docstring and the ErrorDetail schema promise."""
    error = refusal(BatchIn, {**GOOD, "to": [{"email": 5}]})

    assert "to[0].email" in (error.fields or {})
    assert all("union[" not in path for path in error.fields or {})


# --- properties ------------------------------------------------------------------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
_field_names = st.sampled_from(sorted(validation.FIELDS)) | st.text(max_size=8)
_hostile_objects = st.dictionaries(_field_names, _json, max_size=8)

_ADDRESSES = ["ann@example.com", "Bob <bob@example.com>", "a@b\u00fccher.example", "bad", "", 5]
_RECIPIENTS = [
    *_ADDRESSES,
    {"email": "cy@example.com", "name": "Cy", "substitutions": {"n": "Cy"}},
    {"email": "dee@example.com", "substitutions": {"n": "a\nb"}},
    {"email": "eve@example.com", "name": None},
    {"email": 5},
    {"mail": "x@example.com"},
]
#: Per field, values a client might send: valid ones first, then the mistakes.
_POOLS: dict[str, list[object]] = {
    "from": [*_ADDRESSES, {"email": "shop@example.com", "name": "Shop"}, {"email": None}],
    "to": [
        ["ann@example.com", "bob@example.com"],
        _RECIPIENTS[:3],
        "ann@example.com, Bob <bob@example.com>",
        [_RECIPIENTS[6], _RECIPIENTS[7]],
        [*_RECIPIENTS],
        [],
        "",
        {"email": "ann@example.com"},
    ],
    "subject": ["Hi {{n}}", "\u00e9t\u00e9 \U0001f31e", "=?UTF-8?Q?Hi?=", "", " ", 5, None],
    "html": ["<p>x</p>", None, "", "\x00", 5],
    "text": ["x", None, "", ["x"]],
    "reply_to": [None, "reply@example.com", {"email": "r@example.com"}, "bad", 1],
    "cc": [None, [], ["carl@example.com"], "carl@example.com", ["ann@example.com"], [1]],
    "bcc": [None, ["bea@example.com"], [{"email": "bea@example.com", "name": "B"}], "x"],
    "headers": [None, {}, {"X-A": "v"}, {"X-A": "{{n}}"}, {"Bcc": "x@y.z"}, {"X-A": 1}, []],
    "bulk": [None, True, False, "true", 1],
    "categories": [None, [], ["a", "b"], ["a", "a"], [""], "a", [1]],
    "metadata": [None, {}, {"order_id": "42"}, {"bad key": "v"}, {"k": 1}, ["k"]],
}
_near_valid = st.fixed_dictionaries(
    {}, optional={name: st.sampled_from(pool) for name, pool in _POOLS.items()}
).map(lambda body: {**GOOD, **body})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json | _hostile_objects)
def test_checked_either_validates_or_renders_a_422(body: object) -> None:
    """No JSON value makes ``checked`` raise anything but a renderable 422."""
    for model in (BatchIn, SuppressionIn, KeyIn):
        try:
            checked(model, body)
        except ApiError as error:
            assert (error.status, error.code) == (422, "invalid_fields")
            fields = rendered(error)["error"]["fields"]
            assert fields and all(isinstance(v, str) and v for v in fields.values())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json | _hostile_objects | _near_valid)
def test_accepting_a_batch_validates_or_refuses_with_a_known_code(body: object) -> None:
    """Whatever JSON arrives, validation returns a request or a renderable 422 with one of
    the documented codes and at least one named field: never a crash (a 500)."""
    try:
        parsed = sending(max_recipients=3)._validated(body)
    except ApiError as error:
        assert error.status == 422
        assert error.code in CODES
        assert rendered(error)["error"]["fields"]
    else:
        assert 1 <= parsed.accepted <= 3


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_near_valid)
def test_the_schema_accepts_whatever_validation_accepts(body: dict[str, Any]) -> None:
    """The schema is never stricter than the rules, so refusals are always worded by
    ``shared.delivery.validation`` (field paths like ``to[0]``), never by pydantic."""
    try:
        validation.parse_batch_request(body, max_recipients=10)
    except validation.InvalidRequest:
        return
    BatchIn.model_validate(body)


@pytest.mark.parametrize(
    ("changes", "fields"),
    [
        ({"subject": 5}, {"subject": "must be a string"}),
        ({"to": [{"email": 5}]}, {"to[0].email": "must be a string"}),
        ({"from": {"email": "a@example.com", "x": 1}}, {"from.x": "unknown field"}),
        ({"bulk": "true"}, {"bulk": "must be true or false"}),
    ],
)
def test_validation_words_the_errors_the_schema_also_finds(
    changes: dict[str, Any], fields: dict[str, str]
) -> None:
    """When schema and rules both refuse, the caller gets the rules' paths and words."""
    with pytest.raises(ApiError) as caught:
        sending()._validated({**GOOD, **changes})

    assert caught.value.code == "invalid_fields"
    assert caught.value.fields == fields
