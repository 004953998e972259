"""Block Kit limits as Slack enforces them, as plain functions: the fake Slack uses them,
and rendering tests can call them directly (`assert block_errors(blocks, 50) == []`).

Error strings follow Slack's `response_metadata.messages` format:
"[ERROR] must be less than 3001 characters [json-pointer:/blocks/0/text/text]".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["block_errors", "blocks_text_length", "error_message", "view_errors"]

# Limits (Block Kit reference, slack_sdk models, Slack method pages; see REFERENCE.md).
MAX_TEXT = 40_000
MAX_MESSAGE_BLOCKS = 50
MAX_VIEW_BLOCKS = 100
MAX_BLOCKS_TEXT = 12_000
MAX_VIEW_BYTES = 250_000
SECTION_TEXT = 3_000
SECTION_FIELDS = 10
FIELD_TEXT = 2_000
HEADER_TEXT = 150
MARKDOWN_TEXT = 12_000
BUTTON_TEXT = 75
BUTTON_VALUE = 2_000
ACTION_ID = 255
BLOCK_ID = 255
URL_LENGTH = 3_000
ACTIONS_ELEMENTS = 25
CONTEXT_ELEMENTS = 10
OPTIONS = 100
OPTION_TEXT = 75
OPTION_VALUE = 150
PLACEHOLDER = 150
INPUT_LABEL = 2_000
VIEW_TITLE = 24
PRIVATE_METADATA = 3_000
CALLBACK_ID = 255
CONFIRM_TITLE = 100
CONFIRM_TEXT = 300
CONFIRM_BUTTON = 30


def error_message(message: str, pointer: str) -> str:
    return f"[ERROR] {message} [json-pointer:{pointer}]"


def _text_of(obj: Any) -> str | None:
    if isinstance(obj, Mapping) and isinstance(obj.get("text"), str):
        return str(obj["text"])
    return None


def _check_text(
    errors: list[str],
    obj: Any,
    pointer: str,
    limit: int,
    *,
    required: bool = True,
    plain_only: bool = False,
) -> None:
    if obj is None:
        if required:
            errors.append(error_message("missing required field: text", pointer))
        return
    text = _text_of(obj)
    kind = obj.get("type") if isinstance(obj, Mapping) else None
    if text is None or kind not in ("plain_text", "mrkdwn"):
        errors.append(error_message("must provide an object with type and text", pointer))
        return
    if plain_only and kind != "plain_text":
        errors.append(error_message("must be a plain_text object", f"{pointer}/type"))
    if not text:
        errors.append(error_message("must be more than 0 characters", f"{pointer}/text"))
    elif len(text) > limit:
        errors.append(error_message(f"must be less than {limit + 1} characters", f"{pointer}/text"))


def _check_length(errors: list[str], value: Any, pointer: str, limit: int) -> None:
    if isinstance(value, str) and len(value) > limit:
        errors.append(error_message(f"must be less than {limit + 1} characters", pointer))


def _check_confirm(errors: list[str], confirm: Any, pointer: str) -> None:
    if not isinstance(confirm, Mapping):
        return
    _check_text(errors, confirm.get("title"), f"{pointer}/title", CONFIRM_TITLE, plain_only=True)
    _check_text(errors, confirm.get("text"), f"{pointer}/text", CONFIRM_TEXT)
    _check_text(errors, confirm.get("confirm"), f"{pointer}/confirm", CONFIRM_BUTTON)
    _check_text(errors, confirm.get("deny"), f"{pointer}/deny", CONFIRM_BUTTON)


def _check_element(errors: list[str], element: Any, pointer: str, action_ids: set[str]) -> None:
    if not isinstance(element, Mapping) or not isinstance(element.get("type"), str):
        errors.append(error_message("missing required field: type", pointer))
        return
    action_id = element.get("action_id")
    if isinstance(action_id, str):
        _check_length(errors, action_id, f"{pointer}/action_id", ACTION_ID)
        if action_id in action_ids:
            errors.append(
                error_message("action_id must be unique within a block", f"{pointer}/action_id")
            )
        action_ids.add(action_id)
    kind = element["type"]
    if kind == "button":
        _check_text(errors, element.get("text"), f"{pointer}/text", BUTTON_TEXT, plain_only=True)
        _check_length(errors, element.get("value"), f"{pointer}/value", BUTTON_VALUE)
        _check_length(errors, element.get("url"), f"{pointer}/url", URL_LENGTH)
        if element.get("style") not in (None, "primary", "danger"):
            errors.append(error_message("must be one of primary, danger", f"{pointer}/style"))
    if "placeholder" in element:
        _check_text(errors, element["placeholder"], f"{pointer}/placeholder", PLACEHOLDER)
    options = element.get("options")
    if isinstance(options, list):
        if len(options) > OPTIONS:
            errors.append(
                error_message(f"no more than {OPTIONS} items allowed", f"{pointer}/options")
            )
        for n, option in enumerate(options):
            where = f"{pointer}/options/{n}"
            if not isinstance(option, Mapping):
                errors.append(error_message("must be an object", where))
                continue
            _check_text(errors, option.get("text"), f"{where}/text", OPTION_TEXT)
            _check_length(errors, option.get("value"), f"{where}/value", OPTION_VALUE)
    _check_confirm(errors, element.get("confirm"), f"{pointer}/confirm")


def block_errors(blocks: Any, limit: int, pointer: str = "/blocks") -> list[str]:
    """Slack-style error messages for a list of blocks ([] when Slack would accept it)."""
    if not isinstance(blocks, list):
        return [error_message("must be an array", pointer)]
    errors: list[str] = []
    if len(blocks) > limit:
        errors.append(error_message(f"no more than {limit} items allowed", pointer))
    block_ids: set[str] = set()
    for i, block in enumerate(blocks):
        where = f"{pointer}/{i}"
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            errors.append(error_message("missing required field: type", where))
            continue
        block_id = block.get("block_id")
        if isinstance(block_id, str):
            _check_length(errors, block_id, f"{where}/block_id", BLOCK_ID)
            if block_id in block_ids:
                errors.append(error_message("duplicate block_id", f"{where}/block_id"))
            block_ids.add(block_id)
        _check_block(errors, block, where)
    return errors


def _check_block(errors: list[str], block: Mapping[str, Any], where: str) -> None:
    kind = block["type"]
    action_ids: set[str] = set()
    if kind == "section":
        fields = block.get("fields")
        _check_text(errors, block.get("text"), f"{where}/text", SECTION_TEXT, required=not fields)
        if isinstance(fields, list):
            if len(fields) > SECTION_FIELDS:
                errors.append(
                    error_message(f"no more than {SECTION_FIELDS} items allowed", f"{where}/fields")
                )
            for n, item in enumerate(fields):
                _check_text(errors, item, f"{where}/fields/{n}", FIELD_TEXT)
        if "accessory" in block:
            _check_element(errors, block["accessory"], f"{where}/accessory", action_ids)
    elif kind == "header":
        _check_text(errors, block.get("text"), f"{where}/text", HEADER_TEXT, plain_only=True)
    elif kind == "markdown":
        text = block.get("text")
        if not isinstance(text, str) or not text:
            errors.append(error_message("missing required field: text", f"{where}/text"))
        else:
            _check_length(errors, text, f"{where}/text", MARKDOWN_TEXT)
    elif kind in ("actions", "context"):
        elements = block.get("elements")
        limit = ACTIONS_ELEMENTS if kind == "actions" else CONTEXT_ELEMENTS
        if not isinstance(elements, list) or not elements:
            errors.append(error_message("missing required field: elements", f"{where}/elements"))
            return
        if len(elements) > limit:
            errors.append(error_message(f"no more than {limit} items allowed", f"{where}/elements"))
        for n, element in enumerate(elements):
            if kind == "actions":
                _check_element(errors, element, f"{where}/elements/{n}", action_ids)
            elif not isinstance(element, Mapping) or "type" not in element:
                errors.append(
                    error_message("missing required field: type", f"{where}/elements/{n}")
                )
    elif kind == "input":
        _check_text(errors, block.get("label"), f"{where}/label", INPUT_LABEL, plain_only=True)
        if "element" not in block:
            errors.append(error_message("missing required field: element", f"{where}/element"))
        else:
            _check_element(errors, block["element"], f"{where}/element", action_ids)


def blocks_text_length(value: Any) -> int:
    """Characters of text in blocks (text objects and markdown blocks), summed."""
    if isinstance(value, Mapping):
        own = len(value["text"]) if isinstance(value.get("text"), str) else 0
        return own + sum(blocks_text_length(item) for item in value.values())
    if isinstance(value, list):
        return sum(blocks_text_length(item) for item in value)
    return 0


def view_errors(view: Mapping[str, Any], *, kind: str | None = None) -> list[str]:
    """Slack-style error messages for a modal or Home view ([] when Slack would accept it);
    `kind` ("modal" or "home") is the type the calling method requires."""
    errors: list[str] = []
    view_type = view.get("type")
    if view_type not in ("modal", "home") or (kind is not None and view_type != kind):
        errors.append(error_message(f"must be {kind or 'modal or home'}", "/view/type"))
    if view_type == "modal":
        _check_text(errors, view.get("title"), "/view/title", VIEW_TITLE, plain_only=True)
        for name in ("submit", "close"):
            if name in view:
                _check_text(errors, view[name], f"/view/{name}", VIEW_TITLE, plain_only=True)
    _check_length(errors, view.get("private_metadata"), "/view/private_metadata", PRIVATE_METADATA)
    _check_length(errors, view.get("callback_id"), "/view/callback_id", CALLBACK_ID)
    _check_length(errors, view.get("external_id"), "/view/external_id", CALLBACK_ID)
    errors += block_errors(view.get("blocks", []), MAX_VIEW_BLOCKS, "/view/blocks")
    if len(json.dumps(view).encode("utf-8")) > MAX_VIEW_BYTES:
        errors.append(error_message(f"view must be smaller than {MAX_VIEW_BYTES} bytes", "/view"))
    return errors
