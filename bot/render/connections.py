"""What Slack shows of per-user connections: the Connect prompt (ephemeral, in the thread),
the modal where the person enters the finishing code (the user verifier: Slack says who
submits it, worker/service/connections.py checks it is who started), and App Home's "Your
connections" with Connect and Disconnect (bot/listeners/connections.py)."""

from __future__ import annotations

from typing import Any

from bot.render import messages as m
from bot.render.blocks import Message, actions, button, confirm_dialog, context, divider, section
from bot.render.mrkdwn import code, date, escape, plain
from bot.render.views import modal
from tools.exceptions import bounded
from worker.service.connections import Connection

CONNECT_LINK = "connection_link"  # the URL button (Slack sends an action we only ack)
ENTER_CODE = "connection_code"
CONNECT_START = "connection_start"  # App Home's Connect; value: the provider
DISCONNECT = "connection_disconnect"  # App Home's Disconnect; value: the provider
CODE_MODAL = "connection_code_modal"
CODE_BLOCK, CODE_INPUT = "code", "code_value"
MAX_CODE_CHARS = 40
HOME_PROVIDERS_SHOWN = 10


def connect_prompt(
    label: str, url: str, provider: str, more_access: tuple[str, ...] = ()
) -> Message:
    """The Connect prompt; with `more_access`, the person is connected and is asked to
    connect again, giving those scopes too."""
    if more_access:
        scopes = ", ".join(code(bounded(s, 60)) for s in more_access[:5])
        if len(more_access) > 5:
            scopes += ", …"
        text = m.CONNECT_MORE_ACCESS.format(label=escape(label), scopes=scopes)
    else:
        text = m.CONNECT_NEEDED.format(label=escape(label))
    link = button(m.CONNECT_BUTTON.format(label=label), CONNECT_LINK, provider, style="primary")
    link["url"] = url
    return Message(
        text=text,
        blocks=[section(text), actions(link, button(m.CONNECT_ENTER_CODE, ENTER_CODE, provider))],
    )


def home_connections(
    providers: list[tuple[str, str, Connection | None]],
) -> list[dict[str, Any]]:
    """App Home's "Your connections": each provider (name, label, the person's connection or
    None) with Disconnect, or Connect and Enter code. Nothing when there are no providers."""
    if not providers:
        return []
    blocks: list[dict[str, Any]] = [divider(), section(f"*{m.HOME_CONNECTIONS}*")]
    blocks.append(context(m.HOME_CONNECTIONS_INTRO))
    for provider, label, connection in providers[:HOME_PROVIDERS_SHOWN]:
        name = escape(label)
        if connection is None:
            blocks.append(section(m.HOME_NOT_CONNECTED.format(label=name)))
            start = button(
                m.CONNECT_BUTTON.format(label=label), CONNECT_START, provider, style="primary"
            )
            blocks.append(actions(start, button(m.CONNECT_ENTER_CODE, ENTER_CODE, provider)))
            continue
        text = m.HOME_CONNECTED.format(label=name, since=date(connection.connected_at))
        if connection.scope:
            text += m.HOME_CONNECTED_SCOPE.format(scope=code(plain(connection.scope, 200)))
        block = section(text)
        ask = confirm_dialog(
            m.DISCONNECT_CONFIRM_TITLE,
            m.DISCONNECT_CONFIRM.format(label=name),
            m.DISCONNECT,
            m.DISCONNECT_KEEP,
        )
        block["accessory"] = button(m.DISCONNECT, DISCONNECT, provider, style="danger", confirm=ask)
        blocks.append(block)
    return blocks


def preparing_modal(label: str) -> dict[str, Any]:
    """Shown at once on Connect (a trigger lasts 3 seconds), while the flow starts."""
    return modal(m.CONNECT_MODAL_TITLE, [section(m.CONNECT_PREPARING.format(label=escape(label)))])


def connect_modal(label: str, provider: str, url: str, minutes: int) -> dict[str, Any]:
    """App Home's Connect: the link (a flow started just now for whoever clicked) and the box
    for the code the page then shows; submitted as the code modal is."""
    view = code_modal(provider)
    link = button(m.CONNECT_BUTTON.format(label=label), CONNECT_LINK, provider, style="primary")
    link["url"] = url
    steps = section(m.CONNECT_STEPS.format(label=escape(label), minutes=minutes))
    view["blocks"] = [steps, actions(link), *view["blocks"]]
    return view


def unavailable_modal(text: str) -> dict[str, Any]:
    return modal(m.CONNECT_MODAL_TITLE, [section(text)])


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
