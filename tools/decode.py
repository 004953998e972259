"""Bounded, strict decoding of the argument strings a model sends.

Everything is checked before it can cost anything: the size before parsing,
the nesting depth by a linear scan before `json.loads` (so no RecursionError
is possible), and number sizes while parsing. Every failure is an
`ArgumentError` with a short message the model can act on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from itertools import islice
from typing import Any, NoReturn, Protocol

from jsonschema.exceptions import ValidationError as SchemaValidationError
from jsonschema.exceptions import best_match, relevance
from jsonschema.protocols import Validator
from pydantic import ValidationError as PydanticValidationError

from tools.exceptions import ArgumentError, bounded
from tools.schema import describe_parameters, type_summary

__all__ = [
    "MAX_ARGUMENT_BYTES",
    "MAX_DEPTH",
    "ArgumentError",
    "canonical_json",
    "decode_arguments",
    "parse_arguments",
]

MAX_ARGUMENT_BYTES = 32 * 1024
MAX_DEPTH = 16
MAX_INT_DIGITS = 300
_MAX_PROBLEMS = 3

_TYPE_CHECKS = ("type", "enum", "const", "anyOf", "oneOf")
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


def canonical_json(value: Any) -> str:
    """One stable JSON text per value: sorted keys, no spaces, UTF-8 kept as is."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def compact_json(value: Any) -> str:
    """JSON text in its keys' order, no spaces, UTF-8 kept as is: as a request carries it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class Decodable(Protocol):
    """What decoding needs of a tool (tools.registry.Tool)."""

    @property
    def name(self) -> str: ...
    @property
    def parameters(self) -> dict[str, Any]: ...

    def validate(self, value: dict[str, Any]) -> dict[str, Any]: ...


def decode_arguments(tool: Decodable, raw: str) -> dict[str, Any]:
    """Decode and validate the model's argument string for `tool`.

    Returns the validated arguments (JSON-compatible, defaults filled in for
    typed tools); raises `ArgumentError` for anything else.
    """
    value = parse_arguments(raw, tool_name=tool.name, schema=tool.parameters)
    return tool.validate(value)


def parse_arguments(raw: object, *, tool_name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The bounded JSON decoding step of `decode_arguments`, without schema validation."""

    def fail(problem: str) -> NoReturn:
        raise argument_error(tool_name, [problem], schema)

    if not isinstance(raw, str):
        fail(f"arguments must be a JSON object encoded as a string, got {type(raw).__name__}")
    if not raw.strip():
        return {}
    size = _utf8_size(raw)
    if size is None:
        fail("arguments are not valid Unicode text (they contain a lone surrogate)")
    if size > MAX_ARGUMENT_BYTES:
        fail(f"arguments are too large (the limit is {MAX_ARGUMENT_BYTES} bytes of JSON)")
    if nesting_exceeds(raw, MAX_DEPTH):
        fail(f"arguments are nested too deeply (the limit is {MAX_DEPTH} levels)")
    try:
        value = json.loads(
            raw,
            object_pairs_hook=_reject_duplicate_keys,
            parse_constant=_reject_constant,
            parse_float=_parse_float,
            parse_int=_parse_int,
        )
    except _Problem as problem:
        fail(str(problem))
    except json.JSONDecodeError as error:
        fail(
            f"arguments are not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
        )
    if not isinstance(value, dict):
        fail(f"arguments must be a JSON object, got {json_type(value)}")
    if "\\u" in raw and not _is_utf8_encodable(json.dumps(value, ensure_ascii=False)):
        fail("arguments contain an invalid \\u escape (a lone surrogate)")
    return value


def nesting_exceeds(text: str, limit: int) -> bool:
    """True if brackets outside JSON strings nest deeper than `limit` (linear, no recursion)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth = max(depth - 1, 0)
    return False


def json_type(value: object) -> str:
    """The JSON name for the type of a decoded value."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def argument_error(
    tool_name: str, problems: Iterable[str], schema: dict[str, Any]
) -> ArgumentError:
    """Build the model-readable error: what was wrong, then what was expected."""
    listed = [bounded(problem, 200) for problem in islice(problems, _MAX_PROBLEMS)]
    wrong = "; ".join(listed) or "arguments are invalid"
    expected = describe_parameters(schema, limit=600)
    return ArgumentError(
        f"Invalid arguments for {tool_name}: {wrong}. "
        f"Expected a JSON object with parameters: {expected}."
    )


def schema_problems(
    validator: Validator, value: dict[str, Any], schema: dict[str, Any]
) -> list[str]:
    """Up to three readable problems jsonschema finds in `value` (empty if valid)."""
    errors = sorted(islice(validator.iter_errors(value), 20), key=relevance)
    deepest = [best_match([error]) or error for error in errors[:_MAX_PROBLEMS]]
    return [_describe_schema_error(error, schema) for error in deepest]


def pydantic_problems(error: PydanticValidationError) -> list[str]:
    """Readable problems from a pydantic error, without echoing the input."""
    problems = []
    for detail in error.errors(include_url=False, include_input=False)[:_MAX_PROBLEMS]:
        where = _where(detail["loc"])
        problems.append(f"{where}: {bounded(str(detail['msg']), 150)}")
    return problems


def _describe_schema_error(error: SchemaValidationError, schema: dict[str, Any]) -> str:
    path = list(error.absolute_path)
    where = _where(path)
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        required = error.validator_value if isinstance(error.validator_value, list) else []
        missing = [name for name in required if name not in instance]
        names = ", ".join(_name(n) for n in missing[:5])
        return f"missing required parameter {names}" if not path else f"missing {names} in {where}"
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        extra = [name for name in instance if name not in known]
        names = ", ".join(_name(n) for n in extra[:5])
        return f"unknown parameter {names}" if not path else f"unknown field {names} in {where}"
    if error.validator in _TYPE_CHECKS and isinstance(error.schema, dict):
        expected = type_summary(error.schema, schema)
        return f"{where} must be {expected} (got {json_type(instance)})"
    return f"{where}: {bounded(error.message, 150)}"


def _where(path: Iterable[Any]) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + bounded(str(part), 40)
    return f"'{text}'" if text else "arguments"


def _name(name: object) -> str:
    return "'" + bounded(str(name), 40) + "'"


def _utf8_size(text: str) -> int | None:
    if len(text) > MAX_ARGUMENT_BYTES:
        return len(text)  # already over: no need to encode megabytes to know
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _is_utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Problem(Exception):
    """Raised by the json hooks; becomes an ArgumentError with the message."""


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Problem(f"duplicate key {_name(key)} in arguments")
        result[key] = value
    return result


def _reject_constant(name: str) -> NoReturn:
    raise _Problem(f"{name} is not allowed in arguments (use a finite number)")


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Problem(f"number {bounded(text, 40)} is too large")
    return value


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Problem(f"integer with {len(text)} digits is too large")
    return int(text)
