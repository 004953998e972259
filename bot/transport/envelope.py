"""Is a request body shaped like something Slack sends? Checked before Bolt sees it.

Bolt reads a payload's envelope (who, where, which listener) with plain indexing, so a
signed body of the wrong shape (an `event` that is a string, `actions` that is empty, a
`view` without a `callback_id`) would raise inside Bolt and answer 500, which makes Slack
retry. The HTTP server answers 400 instead, without dispatching. Only the fields Bolt and
our listeners read are checked, and only their types: anything Slack really sends passes,
and the listeners still check ids and values themselves (`bot.transport.ids`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slack_bolt.request.internals import parse_body

_WHO = (str, dict)  # `user`, `channel`, `team`, `enterprise`: an id or an object with "id"
_SCALAR = (str, int, float, bool)

# field -> the types it may have when present and not null, in the body and in `event`
_FIELDS: dict[str, tuple[type, ...]] = {
    "type": (str,),
    "user": _WHO,
    "channel": _WHO,
    "team": _WHO,
    "enterprise": _WHO,
    "view": (dict,),
    "message": (dict,),
    "previous_message": (dict,),
    "item": (dict,),
    "assistant_thread": (dict,),
    "container": (dict,),
    "authorizations": (list,),  # lists of objects, all three
    "response_urls": (list,),
    "actions": (list,),
    "subtype": (str,),
    "thread_ts": _SCALAR,
    "ts": _SCALAR,
    "channel_type": (str,),
    "bot_id": _SCALAR,
    "user_team": _SCALAR,
}
_ASSISTANT_EVENTS = ("assistant_thread_started", "assistant_thread_context_changed")
# the id Bolt matches listeners on, per payload type: a catch-all listener (`bot.listeners`)
# matches it against a pattern, which raises on anything but a string
_MATCHED_ON = {
    "shortcut": "callback_id",
    "message_action": "callback_id",
    "interactive_message": "callback_id",
    "dialog_submission": "callback_id",
    "dialog_cancellation": "callback_id",
    "dialog_suggestion": "callback_id",
    "workflow_step_edit": "callback_id",
    "block_suggestion": "action_id",
}


def parse(body: str, content_type: str | None) -> dict[str, Any] | None:
    """The body as Bolt parses it (JSON, or a form with a JSON `payload`), or None when it
    is not readable or not an object."""
    try:
        parsed = parse_body(body, content_type)
    except (ValueError, RecursionError):  # JSON syntax errors, absurdly deep nesting
        return None
    return parsed if isinstance(parsed, dict) else None


def problem(body: Mapping[str, Any]) -> str | None:
    """What makes `body` unlike any payload Slack sends, or None when it is fine."""
    found = _fields(body, "body")
    if found:
        return found
    kind = body.get("type")
    if "event" in body:
        event = body["event"]
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return "event must be an object with a string type"
        found = _fields(event, "event") or _nested(event, "event")
        if found:
            return found
        if event["type"] in _ASSISTANT_EVENTS:
            thread = event.get("assistant_thread")
            if not isinstance(thread, dict) or not all(
                isinstance(thread.get(key), str) for key in ("channel_id", "thread_ts")
            ):
                return "assistant_thread needs channel_id and thread_ts"
    found = _nested(body, "body")
    if found:
        return found
    for key, shape in (("view", dict), ("response_urls", list)):
        if key in body and not isinstance(body[key], shape):  # null included
            return f"{key} has the wrong type"
    if len(body.get("response_urls") or ()) > 1:  # Bolt fails on it; our modals ask for none
        return "more than one response_url"
    if kind in ("block_actions", "interactive_message"):
        actions = body.get("actions")
        if not actions:  # Bolt reads actions[0] of every click
            return "a click needs actions"
        if kind == "block_actions" and not isinstance(actions[0].get("action_id"), str):
            return "an action needs a string action_id"
    view = body.get("view") or {}
    if kind in ("view_submission", "view_closed") and not isinstance(view.get("callback_id"), str):
        return "view needs a string callback_id"
    matched_on = _MATCHED_ON.get(kind) if isinstance(kind, str) else None
    if matched_on and matched_on in body and not isinstance(body[matched_on], str):
        return f"{matched_on} must be a string"
    if "command" in body and not isinstance(body["command"], str):
        return "command must be a string"
    return None


def _fields(data: Mapping[str, Any], where: str) -> str | None:
    for key, types in _FIELDS.items():
        value: Any = data.get(key)
        if value is None:
            continue
        if not isinstance(value, types):
            return f"{where}.{key} has the wrong type"
        if isinstance(value, list) and not all(isinstance(item, dict) for item in value):
            return f"{where}.{key} must be a list of objects"
    return None


def _nested(data: Mapping[str, Any], where: str) -> str | None:
    """`message`, `previous_message`, `item`, `assistant_thread` and `authorizations[0]` are
    read like the payload itself."""
    for key in ("message", "previous_message", "item", "assistant_thread"):
        inner = data.get(key)
        if isinstance(inner, dict):
            found = _fields(inner, f"{where}.{key}")
            if found:
                return found
    authorizations = data.get("authorizations") or []
    if authorizations:
        found = _fields(authorizations[0], f"{where}.authorizations[0]")
        if found:
            return found
    return None
