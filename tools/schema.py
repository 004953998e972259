"""JSON Schema helpers: tidy a derived schema, judge strict-mode support, describe it.

These work on plain JSON Schema dicts (Draft 2020-12, as pydantic emits it) and
know which keywords hold subschemas, so a *property* named "title" is never
mistaken for the "title" annotation keyword.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator

_SCHEMA_VALUED = (
    *("items", "additionalProperties", "not", "if", "then", "else", "contains"),
    *("propertyNames", "unevaluatedItems", "unevaluatedProperties"),
)
_SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")

# Keywords OpenAI's strict mode does not accept (structured outputs docs).
_NOT_STRICT = frozenset(
    {
        "allOf",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "patternProperties",
        "unevaluatedProperties",
        "unevaluatedItems",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "contains",
        "minContains",
        "maxContains",
        "uniqueItems",
        "minLength",
        "maxLength",
        "default",
    }
)


def subschemas(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield the direct subschemas of `schema` (dict-valued ones only)."""
    for key in _SCHEMA_VALUED:
        value = schema.get(key)
        if isinstance(value, dict):
            yield value
    for key in _SCHEMA_LISTS:
        value = schema.get(key)
        if isinstance(value, list):
            yield from (item for item in value if isinstance(item, dict))
    for key in _SCHEMA_MAPS:
        value = schema.get(key)
        if isinstance(value, dict):
            yield from (item for item in value.values() if isinstance(item, dict))


def walk(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield `schema` and every nested subschema, depth first."""
    stack = [schema]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(subschemas(node))


def tidy(schema: dict[str, Any]) -> dict[str, Any]:
    """Return a copy without `title` annotations and with every object schema closed.

    "Closed" means `additionalProperties: false` wherever an object lists its
    properties and says nothing about others, so nested models are as strict
    as the top level.
    """
    result = without_titles(schema)
    for node in walk(result):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
    return result


def without_titles(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy without `title` annotations (a property *named* "title" stays): they cost the
    model tokens and say what the property names already say."""
    result: dict[str, Any] = json.loads(json.dumps(schema))
    for node in walk(result):
        if isinstance(node.get("title"), str):
            del node["title"]
    return result


def usable_defaults(schema: dict[str, Any]) -> dict[str, Any]:
    """The top-level defaults a schema declares, to fill in what the model leaves out, so an
    approval shows, and its hash covers, what the tool will actually use. A default that
    its own property schema refuses (pydantic writes `default: null` for `x: str = None`)
    is left out: sending it could fail where leaving it out works."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return {}
    return {
        name: node["default"]
        for name, node in properties.items()
        if isinstance(node, dict) and "default" in node and _accepts(schema, name, node["default"])
    }


def with_defaults(args: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """`args`, then a copy of each default it leaves out."""
    missing = {name: value for name, value in defaults.items() if name not in args}
    return {**args, **json.loads(json.dumps(missing))}


def _accepts(schema: dict[str, Any], name: str, value: Any) -> bool:
    """Does the schema accept `value` for property `name`? Checked through the whole schema,
    so `$ref`s resolve as they do for the model's arguments."""
    check = Draft202012Validator({**schema, "required": []})
    errors = check.iter_errors({name: value})
    return not any(list(error.absolute_path)[:1] == [name] for error in errors)


def is_object_schema(schema: object) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "object"


def is_strict_compatible(schema: dict[str, Any]) -> bool:
    """True when OpenAI's strict mode accepts `schema` unchanged.

    Every object must be closed and require all of its properties, the root
    must be a plain object, and no unsupported keyword may appear.
    """
    if not is_object_schema(schema) or "anyOf" in schema:
        return False
    for node in walk(schema):
        if _NOT_STRICT.intersection(node):
            return False
        is_object = node.get("type") == "object" or "properties" in node
        if not is_object:
            continue
        if node.get("additionalProperties") is not False:
            return False
        properties = node.get("properties", {})
        if not isinstance(properties, dict) or set(node.get("required", [])) != set(properties):
            return False
    return True


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return node
    target: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(target, dict):
            return node
        target = target.get(part.replace("~1", "/").replace("~0", "~"))
    return target if isinstance(target, dict) else node


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def type_summary(node: dict[str, Any], root: dict[str, Any], depth: int = 0) -> str:
    """A short human/model readable name for the type a subschema describes."""
    node = _resolve(node, root)
    if depth > 3:
        return "value"
    if "const" in node:
        return _short(node["const"])
    if isinstance(node.get("enum"), list):
        values = node["enum"][:8]
        more = ", …" if len(node["enum"]) > 8 else ""
        return "one of " + ", ".join(_short(v) for v in values) + more
    for key in ("anyOf", "oneOf"):
        options = node.get(key)
        if isinstance(options, list) and options:
            parts = [type_summary(o, root, depth + 1) for o in options if isinstance(o, dict)]
            return " or ".join(dict.fromkeys(parts))
    kind = node.get("type")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if kind == "string" and isinstance(node.get("format"), str):
        return f"string ({_short(node['format'], 20).strip(chr(34))})"
    if kind == "array":
        items = node.get("items")
        if isinstance(items, dict):
            return "array of " + type_summary(items, root, depth + 1)
        return "array"
    if kind == "object" and isinstance(node.get("properties"), dict):
        names = list(node["properties"])[:6]
        return "object with " + ", ".join(names) if names else "object"
    return str(kind) if kind else "any value"


def describe_parameters(schema: dict[str, Any], limit: int = 600) -> str:
    """List a tool's parameters with their types, e.g. `name (string, required)`."""
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return "no parameters (send {})"
    required = set(schema.get("required", []))
    parts = []
    for name, node in properties.items():
        if not isinstance(node, dict):
            continue
        detail = type_summary(node, schema)
        if name in required:
            detail += ", required"
        elif "default" in node:
            detail += ", default " + _short(node["default"], 30)
        else:
            detail += ", optional"
        parts.append(f"{name} ({detail})")
    text = "; ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"
