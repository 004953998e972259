"""What Slack shows of per-user connections: the Connect prompt (ephemeral, in the thread)
and the modal where the person enters the finishing code (the user verifier: Slack says
who submits it, worker/service/connections.py checks it is who started)."""

from __future__ import annotations

from typing import Any

from bot.render import messages as m
from bot.render.blocks import Message, actions, button, section
from bot.render.mrkdwn import escape

CONNECT_LINK = "connection_link"  # the URL button (Slack sends an action we only ack)
ENTER_CODE = "connection_code"
CODE_MODAL = "connection_code_modal"
CODE_BLOCK, CODE_INPUT = "code", "code_value"
MAX_CODE_CHARS = 40


def connect_prompt(label: str, url: str, provider: str) -> Message:
    text = m.CONNECT_NEEDED.format(label=escape(label))
    link = button(m.CONNECT_BUTTON.format(label=label), CONNECT_LINK, provider, style="primary")
    link["url"] = url
    return Message(
        text=text,
        blocks=[section(text), actions(link, button(m.CONNECT_ENTER_CODE, ENTER_CODE, provider))],
    )


def code_modal(provider: str) -> dict[str, Any]:
    return {
        "type": "modal",
        "callback_id": CODE_MODAL,
        "private_metadata": provider[:100],
        "title": {"type": "plain_text", "text": m.CONNECT_MODAL_TITLE},
        "submit": {"type": "plain_text", "text": m.CONNECT_MODAL_SUBMIT},
        "blocks": [
            {
                "type": "input",
                "block_id": CODE_BLOCK,
                "label": {"type": "plain_text", "text": m.CONNECT_MODAL_LABEL},
                "element": {
                    "type": "plain_text_input",
                    "action_id": CODE_INPUT,
                    "max_length": MAX_CODE_CHARS,
                },
            }
        ],
    }


def read_code(view: dict[str, Any]) -> str:
    value = view.get("state", {}).get("values", {}).get(CODE_BLOCK, {}).get(CODE_INPUT, {})
    text = value.get("value") if isinstance(value, dict) else None
    return text[:MAX_CODE_CHARS] if isinstance(text, str) else ""
