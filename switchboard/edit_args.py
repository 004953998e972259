"""Edited arguments as the terminal takes them: `field=value` (`switchboard approvals
approve ID --set field=value`) and one value per field (the console's `e`).

A value is read for the field's type in the tool's schema: for a field that takes a
string, the text as typed (`--set title=VPN down` is the string "VPN down"); for any other,
JSON (`--set count=3`, `--set tags=["a","b"]`, `--set due=null`), and where that is not JSON
but the field also takes a string, the text. Whether the result is allowed is the use-case
layer's check (worker/service/decisions.py, `checked_edit`): the schema, then the policy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

MAX_VALUE = 32 * 1024  # characters of one value (a tool's arguments are at most 32 KiB)
MAX_FIELDS = 200


class EditInputError(ValueError):
    """Text that is not an edit; the message says what is expected."""


def takes_string(schema: Any) -> bool:
    """Does a property's schema accept a plain string (its type, or one of its types)?"""
    if not isinstance(schema, Mapping):
        return True  # no schema says otherwise
    kind = schema.get("type")
    if kind is None:
        options = [s for key in ("anyOf", "oneOf") for s in schema.get(key) or []]
        if options:
            return any(takes_string(s) for s in options)
        return "enum" not in schema or any(isinstance(v, str) for v in schema["enum"])
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


def read_value(schema: Any, text: str) -> Any:
    """A value for a field whose schema is `schema`, from what was typed."""
    if len(text) > MAX_VALUE:
        raise EditInputError(f"a value may be at most {MAX_VALUE:,} characters")
    if takes_string(schema) and (not isinstance(schema, Mapping) or schema.get("type")):
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        if takes_string(schema):
            return text
        raise EditInputError(
            f"{text[:80]!r} is not a JSON value (this field takes {kind_of(schema)}); "
            'write numbers as 3, lists as ["a","b"], nothing as null'
        ) from None


def kind_of(schema: Any) -> str:
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    return str(kind or "a JSON value")


def split_assignment(text: str) -> tuple[str, str]:
    """`field=value` -> (field, value); the value may hold `=` itself."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise EditInputError(f"{text[:80]!r} is not field=value (e.g. --set title=VPN down)")
    return name, value


def with_assignments(
    args: Mapping[str, Any], properties: Mapping[str, Any], assignments: Iterable[str]
) -> dict[str, Any]:
    """`args` with each `field=value` applied, read for the field's schema."""
    edited = dict(args)
    for n, text in enumerate(assignments):
        if n >= MAX_FIELDS:
            raise EditInputError(f"at most {MAX_FIELDS} --set at once")
        name, value = split_assignment(text)
        if name not in properties and name not in args:
            known = ", ".join(list(properties)[:20]) or "none"
            raise EditInputError(f"there is no argument {name!r} (its arguments: {known})")
        edited[name] = read_value(properties.get(name), value)
    return edited
