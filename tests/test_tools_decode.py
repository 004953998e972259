"""Bounded strict decoding of model argument strings."""

import json
import math
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from tools import register_tool
from tools.declare import make_tool
from tools.decode import (
    MAX_ARGUMENT_BYTES,
    MAX_DEPTH,
    canonical_json,
    decode_arguments,
    nesting_exceeds,
)
from tools.exceptions import ArgumentError
from tools.registry import Tool, ToolRegistry


class Address(BaseModel):
    city: str
    zip_code: str | None = None


def book_trip(
    destination: str,
    nights: int,
    budget: float = 100.0,
    travel_class: Literal["economy", "business"] = "economy",
    stops: list[Address] | None = None,
) -> str:
    """Book a trip.

    Args:
        destination: Where to go.
        nights: How many nights.
    """
    return destination


TYPED = make_tool(book_trip, effect="write")
SCHEMA_FIRST = register_tool(
    name="tag_items",
    description="Tag items.",
    parameters={
        "type": "object",
        "properties": {
            "ids": {"type": "array", "items": {"type": "integer"}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["ids"],
    },
    handler=lambda ctx, args: None,
    registry=ToolRegistry(),
)


def decode_error(tool: Tool, raw: Any) -> str:
    with pytest.raises(ArgumentError) as caught:
        decode_arguments(tool, raw)
    message = str(caught.value)
    assert len(message) <= 1000
    return message


def test_valid_arguments_are_validated_and_normalized() -> None:
    args = decode_arguments(TYPED, '{"destination": "Pune", "nights": 2, "budget": 50}')
    assert args == {
        "destination": "Pune",
        "nights": 2,
        "budget": 50.0,
        "travel_class": "economy",
        "stops": None,
    }


def test_empty_string_means_no_arguments() -> None:
    ping = register_tool(
        name="ping",
        description="Ping.",
        parameters={"type": "object", "properties": {}},
        handler=lambda ctx, args: "pong",
        registry=ToolRegistry(),
    )
    assert decode_arguments(ping, "") == {}
    assert decode_arguments(ping, "  \n") == {}
    assert "missing required parameter 'destination'" in decode_error(TYPED, "")


def test_unknown_fields_are_rejected() -> None:
    message = decode_error(TYPED, '{"destination": "Pune", "nights": 2, "pets": true}')
    assert "unknown parameter 'pets'" in message
    assert "destination (string, required)" in message
    assert "nights (integer, required)" in message
    assert 'travel_class (one of "economy", "business", default "economy")' in message


def test_extra_property_in_nested_object_is_rejected() -> None:
    raw = '{"destination": "Pune", "nights": 2, "stops": [{"city": "Goa", "x": 1}]}'
    assert "unknown field 'x' in 'stops[0]'" in decode_error(TYPED, raw)


def test_wrong_types_are_rejected_without_coercion() -> None:
    assert "'nights' must be integer (got string)" in decode_error(
        TYPED, '{"destination": "Pune", "nights": "2"}'
    )
    assert "'nights' must be integer (got number)" in decode_error(
        TYPED, '{"destination": "Pune", "nights": 2.5}'
    )
    assert "'ids[1]' must be integer (got string)" in decode_error(
        SCHEMA_FIRST, '{"ids": [1, "2"]}'
    )


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_constants_are_rejected(constant: str) -> None:
    message = decode_error(TYPED, f'{{"destination": "Pune", "nights": 1, "budget": {constant}}}')
    assert f"{constant} is not allowed" in message


def test_overflowing_numbers_are_rejected() -> None:
    assert "too large" in decode_error(TYPED, '{"destination": "x", "nights": 1, "budget": 1e999}')
    huge = "9" * 5000
    message = decode_error(TYPED, f'{{"destination": "x", "nights": {huge}}}')
    assert "integer with 5000 digits is too large" in message


def test_duplicate_keys_are_rejected() -> None:
    message = decode_error(TYPED, '{"destination": "Pune", "nights": 1, "nights": 5}')
    assert "duplicate key 'nights'" in message


def test_a_megabyte_string_is_rejected_before_parsing() -> None:
    raw = '{"destination": "' + "x" * 1_000_000 + '", "nights": 1}'
    message = decode_error(TYPED, raw)
    assert f"too large (the limit is {MAX_ARGUMENT_BYTES} bytes" in message
    assert "xxxxxxxxxx" not in message


def test_size_is_counted_in_utf8_bytes() -> None:
    just_over = '{"destination": "' + "é" * (MAX_ARGUMENT_BYTES // 2) + '", "nights": 1}'
    assert len(just_over) < MAX_ARGUMENT_BYTES
    assert "too large" in decode_error(TYPED, just_over)


def test_deep_nesting_is_rejected_without_recursion() -> None:
    raw = '{"destination": "x", "nights": 1, "stops": ' + "[" * 10_000 + "]" * 10_000 + "}"
    message = decode_error(TYPED, raw)
    assert f"nested too deeply (the limit is {MAX_DEPTH} levels)" in message
    assert "nested too deeply" in decode_error(TYPED, "[" * 10_000)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    raw = json.dumps({"destination": "[" * 100 + '\\"{' * 50, "nights": 1})
    assert decode_arguments(TYPED, raw)["destination"].startswith("[[[")
    assert not nesting_exceeds('"[[[[[[[[[[[[[[[[[[[[[[["', 4)
    assert nesting_exceeds("[[[[[", 4)
    assert not nesting_exceeds('["\\"[[[[[[["]', 4)


def test_invalid_json_says_where() -> None:
    message = decode_error(TYPED, '{"destination": "Pune", nights: 1}')
    assert "not valid JSON" in message
    assert "line 1 column 25" in message


@pytest.mark.parametrize(
    ("raw", "kind"),
    [("[1, 2]", "an array"), ('"hi"', "a string"), ("42", "integer"), ("null", "null")],
)
def test_top_level_must_be_an_object(raw: str, kind: str) -> None:
    message = decode_error(TYPED, raw)
    assert "arguments must be a JSON object, got" in message
    assert kind.split()[-1] in message


def test_raw_must_be_a_string() -> None:
    assert "encoded as a string, got dict" in decode_error(TYPED, {"destination": "x"})
    assert "got bytes" in decode_error(TYPED, b"{}")


def test_lone_surrogates_are_rejected() -> None:
    assert "lone surrogate" in decode_error(TYPED, '{"destination": "\\ud800", "nights": 1}')
    assert "lone surrogate" in decode_error(TYPED, '{"destination": "\ud800", "nights": 1}')
    near_limit = '{"destination": "\\udc00", "nights": 1, "x": [' + "1," * 16_000 + "1]}"
    assert len(near_limit) < MAX_ARGUMENT_BYTES
    assert "lone surrogate" in decode_error(SCHEMA_FIRST, near_limit)
    ok = decode_arguments(TYPED, '{"destination": "\\ud83d\\ude00", "nights": 1}')
    assert ok["destination"] == "😀"


def test_error_messages_are_bounded_and_do_not_echo_large_values() -> None:
    long_key = "k" * 20_000
    message = decode_error(TYPED, json.dumps({long_key: 1, "destination": "x", "nights": 1}))
    assert "k" * 100 not in message
    message = decode_error(TYPED, json.dumps({"destination": "y" * 20_000, "nights": "z" * 9_000}))
    assert "y" * 100 not in message and "z" * 100 not in message


def test_canonical_json_is_stable() -> None:
    assert canonical_json({"b": 1, "a": ["é", 2.5]}) == '{"a":["é",2.5],"b":1}'
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


# -- nothing but dict or ArgumentError, whatever the model sends -----------------

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
any_char = st.one_of(st.characters(), surrogates)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=any_char, max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.text(alphabet=any_char, max_size=10), children, max_size=5),
    ),
    max_leaves=40,
)
argument_keys = st.sampled_from(
    ["destination", "nights", "budget", "travel_class", "stops", "city", "ids", "labels", "x"]
)
plausible = st.dictionaries(argument_keys, json_values, max_size=6)


def _check(tool: Tool, raw: Any) -> None:
    try:
        result = decode_arguments(tool, raw)
    except ArgumentError as error:
        assert len(str(error)) <= 1000
    else:
        assert isinstance(result, dict)
        canonical_json(result).encode("utf-8")  # always storable as UTF-8 JSON


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.text(alphabet=any_char, max_size=300))
def test_arbitrary_text_yields_dict_or_argument_error(raw: str) -> None:
    _check(TYPED, raw)
    _check(SCHEMA_FIRST, raw)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.one_of(json_values, plausible))
def test_arbitrary_json_values_yield_dict_or_argument_error(value: Any) -> None:
    raw = json.dumps(value, allow_nan=True)
    _check(TYPED, raw)
    _check(SCHEMA_FIRST, raw)
    _check(TYPED, json.dumps(value, ensure_ascii=False, allow_nan=True))


@settings(max_examples=60, deadline=None)
@given(
    depth=st.integers(min_value=1, max_value=20_000),
    opener=st.sampled_from(["[", "{", '{"a":', '{"destination":"x","nights":1,"stops":[']),
    tail=st.sampled_from(["", "1", '"x"', "]", "}"]),
)
def test_deep_or_unbalanced_nesting_yields_dict_or_argument_error(
    depth: int, opener: str, tail: str
) -> None:
    _check(TYPED, opener * depth + tail + "]" * depth)


@settings(max_examples=60, deadline=None)
@given(
    number=st.sampled_from(["1e999", "-1e999", "1e-999", "1" * 400, "-" + "9" * 301, "0.1e400"]),
    key=argument_keys,
)
def test_huge_numbers_yield_dict_or_argument_error(number: str, key: str) -> None:
    _check(TYPED, f'{{"{key}": {number}}}')
    _check(TYPED, f'{{"destination": "x", "nights": 1, "{key}": [{number}]}}')


def test_nested_problems_name_their_location() -> None:
    raw = '{"destination": "x", "nights": 1, "stops": [{"zip_code": "1"}]}'
    assert "missing 'city' in 'stops[0]'" in decode_error(TYPED, raw)
    raw = '{"destination": "x", "nights": 1, "stops": 5}'
    assert "'stops' must be array of object with city, zip_code or null (got integer)" in (
        decode_error(TYPED, raw)
    )
