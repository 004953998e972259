"""Approve with edits: the Edit modal, built from the tool's JSON schema, and its submission.

One input per argument: strings as text (multi-line for long values), integers and numbers
as number inputs, booleans as a checkbox, enums as a select, anything else (arrays,
objects, unions) as JSON text. Submitting approves, as the submitter, exactly what the
modal holds, after the same checks as the model's arguments (`approvals.edits`); an edit
that fails them is refused inside the modal, naming the field (`response_action: errors`).
For a high-risk tool the modal is the confirmation.

Everything in a submission is the sender's to forge: the private metadata is only a
pointer, checked against the stored request (its binding too: a modal opened for other
arguments approves nothing), and every value is bounded before it is parsed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import structlog
from slack_bolt import Ack
from slack_sdk import WebClient

from approvals import ApprovalRequest
from approvals.edits import EditRefused
from bot import ids
from bot import messages as m
from bot.blocks import EDIT_MODAL, context, is_high_risk, outcome_text, section
from bot.listeners.base import (
    Bot,
    after_decision,
    boundary,
    clicked_request,
    decide,
    may_not_decide,
    tell,
)
from bot.mrkdwn import cut, escape, mention, plain
from bot.payloads import Clicked, dig, read_metadata, user_team
from bot.views import modal
from tools.decode import MAX_ARGUMENT_BYTES, canonical_json, parse_arguments
from tools.exceptions import ArgumentError
from tools.registry import Tool
from worker import service
from worker.events import EventKind
from worker.roles import RolesUnavailable

log = structlog.get_logger(__name__)

# A submission is answered in its modal, within Slack's 3 s: wait no longer for user groups.
MODAL_ROLES_WAIT = 1.5

TEXT_MAX = 3000  # Slack's plain_text_input max_length
OPTIONS_MAX = 100  # static_select options
OPTION_TEXT = 75
MULTILINE_FROM = 80
ACTION = "v"
CHECKED = "true"
MAX_FIELDS = 90  # inputs in one modal (100 blocks, a few for the text around them)
NUMBER_CHARS = 40


@dataclass(frozen=True)
class Field:
    """One argument as the modal shows it."""

    block_id: str
    name: str
    kind: str  # text | number | integer | boolean | select | json | fixed (not editable)
    schema: dict[str, Any]
    required: bool


def fields(tool: Tool, args: dict[str, Any]) -> list[Field]:
    properties = tool.parameters.get("properties") or {}
    required = set(tool.parameters.get("required") or [])
    found = []
    for index, (name, schema) in enumerate(list(properties.items())):
        schema = schema if isinstance(schema, dict) else {}
        kind = kind_of(schema, args.get(name)) if index < MAX_FIELDS else "fixed"
        found.append(Field(f"a{index}", str(name), kind, schema, name in required))
    return found


def unlisted(tool: Tool, args: dict[str, Any]) -> list[str]:
    """Proposed arguments the schema does not list (it allows others): never editable,
    always kept, and named in the modal so the approver knows they are there."""
    properties = tool.parameters.get("properties") or {}
    return [name for name in args if name not in properties]


def kind_of(schema: dict[str, Any], value: Any) -> str:
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        labels = [option_text(v) for v in enum]
        if len(enum) <= OPTIONS_MAX and all(len(t) <= OPTION_TEXT for t in labels):
            return "select"
    kind = {"string": "text", "integer": "integer", "number": "number", "boolean": "boolean"}.get(
        str(schema.get("type")), "json"
    )
    shown = value if kind == "text" else json.dumps(value, indent=2, ensure_ascii=False)
    if value is not None and isinstance(shown, str) and len(shown) > TEXT_MAX:
        return "fixed"  # too long for a Slack input: kept as the model proposed it
    return kind


def option_text(value: Any) -> str:
    return value if isinstance(value, str) else canonical_json(value)


# -- the modal -----------------------------------------------------------------------------------


def edit_modal(
    request: ApprovalRequest, tool: Tool, metadata: str, *, high_risk: bool
) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        section(m.EDIT_INTRO.format(user=mention(request.requester), tool=escape(request.tool)))
    ]
    if high_risk:
        blocks.append(section(m.EDIT_HIGH_RISK.format(tool=escape(request.tool))))
    fixed = []
    for field in fields(tool, request.args):
        if field.kind == "fixed":
            fixed.append(field.name)
        else:
            blocks.append(input_block(field, request.args))
    if fixed:
        blocks.append(context(m.EDIT_FIXED.format(names=escape(", ".join(fixed)))))
    others = unlisted(tool, request.args)
    if others:
        blocks.append(context(m.EDIT_UNLISTED.format(names=escape(", ".join(others)))))
    return modal(
        m.MODAL_EDIT_TITLE,
        blocks,
        callback_id=EDIT_MODAL,
        submit={"type": "plain_text", "text": m.SUBMIT_EDIT},
        private_metadata=metadata,
    )


def input_block(field: Field, args: dict[str, Any]) -> dict[str, Any]:
    present = field.name in args
    value = args.get(field.name)
    element: dict[str, Any] = {"action_id": ACTION}
    label = field.name
    if field.kind == "select":
        options = [
            {
                "text": {"type": "plain_text", "text": plain(option_text(v), OPTION_TEXT)},
                "value": str(i),
            }
            for i, v in enumerate(field.schema["enum"])
        ]
        element.update(type="static_select", options=options)
        chosen = [
            o for o, v in zip(options, field.schema["enum"], strict=True) if present and v == value
        ]
        if chosen:
            element["initial_option"] = chosen[0]
    elif field.kind == "boolean":
        option = {
            "text": {"type": "plain_text", "text": plain(field.name, OPTION_TEXT)},
            "value": CHECKED,
        }
        element.update(type="checkboxes", options=[option])
        if value is True:
            element["initial_options"] = [option]
    elif field.kind in ("integer", "number"):
        element.update(type="number_input", is_decimal_allowed=field.kind == "number")
        if present and isinstance(value, int | float) and not isinstance(value, bool):
            element["initial_value"] = str(value)
    elif field.kind == "text":
        text = value if isinstance(value, str) else ""
        limit = field.schema.get("maxLength")
        multiline = (
            len(text) > MULTILINE_FROM or "\n" in text or not isinstance(limit, int) or limit > 200
        )
        element.update(type="plain_text_input", multiline=multiline)
        element["max_length"] = (
            min(limit, TEXT_MAX) if isinstance(limit, int) and limit > 0 else TEXT_MAX
        )
        if text:
            element["initial_value"] = text
    else:
        element.update(type="plain_text_input", multiline=True, max_length=TEXT_MAX)
        label += " (JSON)"
        if present:
            element["initial_value"] = json.dumps(value, indent=2, ensure_ascii=False)
    block: dict[str, Any] = {
        "type": "input",
        "block_id": field.block_id,
        "optional": not field.required or field.kind == "boolean",
        "label": {"type": "plain_text", "text": plain(label, 2000)},
        "element": element,
    }
    description = field.schema.get("description")
    if isinstance(description, str) and description.strip():
        block["hint"] = {"type": "plain_text", "text": plain(description.strip(), 150)}
    return block


# -- reading a submission ------------------------------------------------------------------------


class Refused(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def read_edit(
    tool: Tool, args: dict[str, Any], values: Any
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The arguments a submission holds (not yet validated), or errors by block id.
    Never raises, whatever `values` (view.state.values, the sender's to forge) holds."""
    values = values if isinstance(values, dict) else {}
    out: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for field in fields(tool, args):
        present = field.name in args
        state = values.get(field.block_id)
        state = state.get(ACTION) if isinstance(state, dict) else None
        if field.kind == "fixed" or not isinstance(state, dict):
            if present:  # not in the modal (or not sent): as the model proposed it
                out[field.name] = args[field.name]
            continue
        try:
            found, value = read_value(field, state, args.get(field.name) if present else None)
        except Refused as exc:
            errors[field.block_id] = cut(exc.message, 150)
            continue
        if found:
            out[field.name] = value
        elif field.required:
            errors[field.block_id] = m.EDIT_REQUIRED
    if errors:
        return None, errors
    for name in unlisted(tool, args):  # arguments the schema allows but does not list: kept
        out[name] = args[name]
    if len(canonical_json(out).encode()) > MAX_ARGUMENT_BYTES:
        first = fields(tool, args)[0].block_id if fields(tool, args) else "a0"
        return None, {first: m.EDIT_TOO_LARGE.format(limit=MAX_ARGUMENT_BYTES)}
    return out, {}


def read_value(field: Field, state: dict[str, Any], old: Any) -> tuple[bool, Any]:
    """(given, value) of one input's state."""
    if field.kind == "select":
        chosen = state.get("selected_option")
        if not isinstance(chosen, dict):
            return False, None
        raw = chosen.get("value")
        enum = field.schema.get("enum") or []
        if not (
            isinstance(raw, str)
            and raw.isascii()
            and raw.isdigit()
            and len(raw) < 4
            and int(raw) < len(enum)
        ):
            raise Refused(m.EDIT_NOT_AN_OPTION)
        return True, enum[int(raw)]
    if field.kind == "boolean":
        chosen = state.get("selected_options")
        checked = isinstance(chosen, list) and any(
            isinstance(o, dict) and o.get("value") == CHECKED for o in chosen
        )
        if not checked and old is None:
            return False, None  # left out, and still unchecked: leave it out
        return True, checked
    raw = state.get("value")
    if raw is None or raw == "":
        return (True, "") if old == "" and field.kind == "text" else (False, None)
    if not isinstance(raw, str):
        raise Refused(m.EDIT_NOT_TEXT)
    if len(raw) > TEXT_MAX:
        raise Refused(m.EDIT_TOO_LONG.format(limit=TEXT_MAX))
    if field.kind == "text":
        return True, raw
    if field.kind in ("integer", "number"):
        return True, read_number(raw.strip(), integer=field.kind == "integer")
    return True, read_json(raw)


def read_number(raw: str, *, integer: bool) -> int | float:
    if len(raw) > NUMBER_CHARS:
        raise Refused(m.EDIT_NOT_A_NUMBER)
    try:
        number = float(raw)
    except ValueError:
        raise Refused(m.EDIT_NOT_A_NUMBER) from None
    if number != number or number in (float("inf"), float("-inf")):
        raise Refused(m.EDIT_NOT_A_NUMBER)
    if integer:
        if not number.is_integer() or abs(number) > 2**53:
            raise Refused(m.EDIT_NOT_AN_INTEGER)
        return int(number)
    return int(number) if number.is_integer() and abs(number) <= 2**53 else number


def read_json(raw: str) -> Any:
    """One JSON value, with the bounds the model's arguments have (size, depth, numbers)."""
    try:
        wrapped = parse_arguments('{"value":\n' + raw + "\n}", tool_name="edit", schema={})
    except ArgumentError:
        raise Refused(m.EDIT_NOT_JSON) from None
    if set(wrapped) != {"value"}:  # `1, "x": 2` would have added a key
        raise Refused(m.EDIT_NOT_JSON)
    return wrapped["value"]


def refusal_errors(tool: Tool, args: dict[str, Any], refused: EditRefused) -> dict[str, str]:
    """The modal's errors for a refused edit: on the field named, else on the first one."""
    shown = [f for f in fields(tool, args) if f.kind != "fixed"]
    if not shown:
        return {}
    block = next((f.block_id for f in shown if f.name == refused.field), shown[0].block_id)
    return {block: cut(refused.message, 150)}


# -- the listeners (registered in bot.listeners) -------------------------------------------------


def edit_metadata(who: Clicked, request: ApprovalRequest) -> str:
    data = json.loads(who.metadata(request.id))
    data["binding"] = request.binding
    return json.dumps(data)


@boundary
def on_edit(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """The card's Edit button: check the clicker, then open the modal (the trigger lasts 3 s)."""
    found = clicked_request(ack, body, action, client, sb)
    if found is None:
        return
    who, request = found
    if may_not_decide(client, who, request, sb):
        return
    tool = sb.rt.registry.get(request.tool)
    if tool is None:
        tell(client, who, m.EDIT_TOOL_GONE.format(tool=escape(request.tool)))
        return
    high_risk = is_high_risk(sb.rt.policy, request.tool)
    view = edit_modal(request, tool, edit_metadata(who, request), high_risk=high_risk)
    client.views_open(trigger_id=who.trigger_id, view=view)


@boundary
def on_edit_submitted(
    ack: Ack, body: dict[str, Any], view: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Approve with edits: every check first, answered in the modal; then the decision."""
    meta = read_metadata(view.get("private_metadata"))
    approval_id = ids.shaped(ids.APPROVAL, meta.get("approval_id"))
    user = ids.shaped(ids.USER, dig(body, "user", "id"))
    request = sb.rt.approvals.find(approval_id) if approval_id else None
    tool = sb.rt.registry.get(request.tool) if request is not None else None
    if user is None or request is None or tool is None:
        log.warning("edit_submission_rejected", approval_id=approval_id)
        ack(response_action="errors", errors={"a0": m.APPROVAL_NOT_FOUND[:150]})
        return
    first = next((f.block_id for f in fields(tool, request.args) if f.kind != "fixed"), "a0")
    team = user_team(body)[:64]
    try:
        roles = sb.identity.roles(user, team, wait=MODAL_ROLES_WAIT)
    except RolesUnavailable:  # answered in the modal: the ack must come within 3 s
        roles = None
    problem = ""
    if roles is None:
        problem = m.ROLES_UNAVAILABLE
    elif request.decided:
        problem = m.ALREADY_DECIDED.format(outcome=outcome_text(request))
    elif meta.get("binding") != request.binding:
        problem = m.EDIT_STALE
    elif not sb.may_decide(request, user, roles):
        problem = m.NOT_ALLOWED_TO_DECIDE.format(
            approvers=sb.rt.policy.approvers_text(request.tool)
        )
    if problem:
        ack(response_action="errors", errors={first: cut(problem, 150)})
        log.info("edit_refused", approval_id=request.id, user=user, why=problem[:80])
        sb.rt.events.append(
            request.run_id, EventKind.EDIT_REFUSED, approval_id=request.id, by=user, why=problem
        )
        return
    args, errors = read_edit(tool, request.args, dig(view, "state", "values"))
    if args is not None:
        try:
            args = service.checked_edit(sb.rt, request, args)
        except EditRefused as exc:
            errors = refusal_errors(tool, request.args, exc) or {first: cut(exc.message, 150)}
    if args is None or errors:
        ack(response_action="errors", errors=errors)
        sb.rt.events.append(
            request.run_id, EventKind.EDIT_REFUSED, approval_id=request.id, by=user, errors=errors
        )
        return
    ack()
    who = Clicked.submitted(user, team, meta, request.cards)
    outcome = decide(sb, request.id, who, approve=True, edited_args=args)
    after_decision(sb, client, who, outcome)
