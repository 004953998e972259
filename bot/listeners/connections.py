"""The Connect prompt's "Enter code" button and the modal's submission: the person who
started a connection finishes it in Slack, which says who they are (the user verifier in
worker/service/connections.py)."""

from __future__ import annotations

from typing import Any

from slack_bolt import Ack
from slack_sdk import WebClient

from bot.listeners.base import Bot, boundary
from bot.render import messages as m
from bot.render.connections import CODE_BLOCK, code_modal, read_code
from bot.transport import ids
from bot.transport.payloads import dig, user_team
from worker.service import connections


@boundary
def on_enter_code(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    ack()
    trigger = body.get("trigger_id")
    provider = action.get("value")
    if isinstance(trigger, str) and isinstance(provider, str):
        client.views_open(trigger_id=trigger, view=code_modal(provider))


@boundary
def on_code_submitted(ack: Ack, body: dict[str, Any], view: dict[str, Any], sb: Bot) -> None:
    user = ids.shaped(ids.USER, dig(body, "user", "id"))
    team = user_team(body)  # as the run's requester was recorded (bot.state.identity)
    if user is None:
        ack()
        return
    try:
        done = connections.confirm(sb.rt, team, user, read_code(view))
    except connections.ConnectRefused as refused:
        ack(response_action="errors", errors={CODE_BLOCK: str(refused)[:150]})
        return
    ack(
        response_action="update",
        view={
            "type": "modal",
            "title": {"type": "plain_text", "text": m.CONNECT_MODAL_TITLE},
            "blocks": [
                {
                    "type": "section",
                    "text": {"type": "mrkdwn", "text": m.CONNECT_DONE.format(label=done.label)},
                }
            ],
        },
    )
