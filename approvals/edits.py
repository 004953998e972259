"""Approve with edits: an approver's arguments go through the same checks as the model's.

The edited arguments are validated against the tool's schema (the first problem found names
the argument to blame, so the modal can show it there), then authorised for the requester as
the model's proposal was (the policy's constraints included). Only then may a request be
approved with them; the store rebinds the approval to their hash
(`ApprovalStore.decide(edited_args=...)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from tools.decode import canonical_json
from tools.exceptions import ArgumentError
from tools.policy import Policy
from tools.registry import Tool

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


def schema_problem(tool: Tool, args: dict[str, Any]) -> EditRefused | None:
    """What the tool's whole schema finds wrong with `args` first, naming the argument to
    blame where there is one; None if nothing."""
    try:
        error = best_match(Draft202012Validator(tool.parameters).iter_errors(args))
    except Exception as exc:  # a schema the validator cannot follow ($ref it cannot resolve)
        return EditRefused(f"{tool.name}'s schema cannot check these arguments ({exc})"[:300])
    if error is None:
        return None
    if error.absolute_path:
        return EditRefused(error.message[:300], str(error.absolute_path[0]))
    blamed: list[str] = []
    if error.validator == "required":
        blamed = [n for n in error.validator_value if n not in args]
    elif error.validator == "additionalProperties":
        blamed = [n for n in args if n not in (tool.parameters.get("properties") or {})]
    return EditRefused(error.message[:300], blamed[0] if blamed else None)


def check_edit(
    tool: Tool, policy: Policy, requester_roles: frozenset[str], args: dict[str, Any]
) -> dict[str, Any]:
    """The edited arguments as the tool takes them, or EditRefused naming the field."""
    problem = schema_problem(tool, args)
    if problem is not None:
        raise problem
    try:
        checked = tool.validate(args)
    except ArgumentError as exc:
        raise EditRefused(exc.message) from None
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
