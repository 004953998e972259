"""Approve with edits: an approver's arguments go through the same checks as the model's.

The edited arguments are validated against the tool's schema (one field at a time first, so
the refusal can name the field), then authorised for the requester as the model's proposal
was (the policy's constraints included). Only then may a request be approved with them; the
store rebinds the approval to their hash (`ApprovalStore.decide(edited_args=...)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from tools import Policy, Tool, canonical_json
from tools.exceptions import ArgumentError

MAX_CHANGES_SHOWN = 20
VALUE_SHOWN = 200


class EditRefused(ValueError):
    """An edit that may not be approved; `field` names the argument when one is to blame."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message[:500])
        self.field = field

    @property
    def message(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Change:
    field: str
    old: Any = None
    new: Any = None
    was_set: bool = True  # False: the model left it out
    is_set: bool = True  # False: the editor removed it

    def to_json(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "old": shown(self.old, self.was_set),
            "new": shown(self.new, self.is_set),
        }

    def text(self) -> str:
        return f"{self.field}: {shown(self.old, self.was_set)} -> {shown(self.new, self.is_set)}"


def shown(value: Any, present: bool = True) -> str:
    if not present:
        return "(not set)"
    text = canonical_json(value)
    return text if len(text) <= VALUE_SHOWN else text[: VALUE_SHOWN - 1] + "…"


def field_problem(tool: Tool, name: str, value: Any) -> str | None:
    """What is wrong with one argument's value by its own schema; None if nothing."""
    properties = tool.parameters.get("properties") or {}
    if name not in properties:
        return f"{tool.name} has no argument {name!r}"
    root = {k: v for k, v in tool.parameters.items() if k in ("$defs", "definitions")}
    schema = properties[name]
    validator = Draft202012Validator({**root, **schema} if isinstance(schema, dict) else schema)
    error = best_match(validator.iter_errors(value))
    return None if error is None else error.message[:300]


def check_edit(
    tool: Tool, policy: Policy, requester_roles: frozenset[str], args: dict[str, Any]
) -> dict[str, Any]:
    """The edited arguments as the tool takes them, or EditRefused naming the field."""
    for name, value in args.items():
        problem = field_problem(tool, name, value)
        if problem is not None:
            raise EditRefused(problem, name)
    try:
        checked = tool.validate(args)
    except ArgumentError as exc:
        missing = [n for n in tool.parameters.get("required") or [] if n not in args]
        raise EditRefused(exc.message, missing[0] if missing else None) from None
    denial = policy.authorize(tool.name, requester_roles, checked)
    if denial is not None:
        raise EditRefused(denial.reason, denial.argument)
    return checked


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """What the editor changed, argument by argument, in the schema's order of keys seen."""
    found: list[Change] = []
    for name in dict.fromkeys([*old, *new]):
        was, now = name in old, name in new
        if was and now and canonical_json(old[name]) == canonical_json(new[name]):
            continue
        found.append(Change(name, old.get(name), new.get(name), was, now))
    return found


def changes_text(found: list[Change]) -> str:
    """For the model and the trajectory: one change per line."""
    lines = [c.text() for c in found[:MAX_CHANGES_SHOWN]]
    if len(found) > MAX_CHANGES_SHOWN:
        lines.append(f"... and {len(found) - MAX_CHANGES_SHOWN} more")
    return "\n".join(lines)
