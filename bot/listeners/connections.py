"""Per-user connections in Slack: the Connect prompt's "Enter code" button and the modal's
submission (the person who started a connection finishes it in Slack, which says who they
are: the user verifier in worker/service/connections.py), and App Home's Connect and
Disconnect. Each acts for the person Slack signed as clicking (`body.user.id` and their
team), never for anyone a button's value could name: a value names only a provider."""

from __future__ import annotations

from typing import Any

import structlog
from slack_bolt import Ack
from slack_sdk import WebClient

from bot.listeners.base import Bot, boundary, publish_home
from bot.render import messages as m
from bot.render.connections import (
    CODE_BLOCK,
    code_modal,
    connect_modal,
    preparing_modal,
    read_code,
    unavailable_modal,
)
from bot.render.mrkdwn import escape
from bot.transport import ids
from bot.transport.payloads import Clicked, dig, user_team
from worker.service import connections

log = structlog.get_logger(__name__)

MAX_PROVIDER_CHARS = 100


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
    text = m.CONNECT_DONE.format(label=done.label)
    if done.resumed:
        text += "\n" + m.CONNECT_GOING_ON
    ack(
        response_action="update",
        view={
            "type": "modal",
            "title": {"type": "plain_text", "text": m.CONNECT_MODAL_TITLE},
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
        },
    )
    for run in done.resumed:  # a reply in the thread continues the continuation, not its parent
        channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
        if run.origin.get("surface") == "slack" and channel and thread_ts:
            sb.threads.remember(channel, thread_ts, run.id)


def known_provider(sb: Bot, value: Any) -> str | None:
    """A button's value when it names a provider this deployment has; None (logged) if not."""
    if (
        isinstance(value, str)
        and len(value) <= MAX_PROVIDER_CHARS
        and value in connections.providers(sb.rt)
    ):
        return value
    shown = value[:80] if isinstance(value, str) else type(value).__name__
    log.warning("connection_provider_rejected", value=shown)
    return None


@boundary
def on_connect(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """App Home's Connect: start a flow for the person who clicked, now, and open a modal
    with its link and the box for the finishing code.

    Why a plain button whose click starts the flow, not a URL button made when the Home is
    drawn: the Home is rebuilt on every app_home_opened and after every click in it, and
    stays on screen for days, while a flow's `state` is single-use and expires after
    FLOW_SECONDS. A link made at render time would start a flow (a PKCE verifier in Redis)
    per provider per person at every redraw that nobody may use, and the one on screen
    would mostly have expired, or been used by an earlier attempt, by the time it is
    clicked. Started on the click, the flow is fresh, used once, and bound to Slack's
    signed clicker. The modal opens first (a trigger lasts 3 seconds; starting a flow may
    first discover an MCP server's OAuth endpoints), then shows the link."""
    ack()
    who = Clicked.of(body)
    provider = known_provider(sb, action.get("value"))
    if who is None or provider is None or not who.trigger_id:
        return
    label = connections.label(sb.rt, provider)
    opened = client.views_open(trigger_id=who.trigger_id, view=preparing_modal(label))
    shown = opened.get("view")
    view_id = ids.shaped(ids.VIEW, shown.get("id") if isinstance(shown, dict) else None)
    try:
        url = connections.connect_url(sb.rt, who.team, who.user, provider)
        view = connect_modal(label, provider, url, connections.FLOW_SECONDS // 60)
    except connections.ConnectRefused as refused:
        view = unavailable_modal(
            m.CONNECT_UNAVAILABLE.format(label=escape(label), why=escape(str(refused)))
        )
    if view_id:
        client.views_update(view_id=view_id, view=view)


@boundary
def on_disconnect(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """App Home's Disconnect: drop the clicker's own grant for the provider the button names
    (and revoke it at the provider), then redraw their Home. Whom it is for comes from
    Slack's signature only, so a forged value cannot drop anyone else's grant."""
    ack()
    who = Clicked.of(body)
    provider = known_provider(sb, action.get("value"))
    if who is None or provider is None:
        return
    dropped = connections.revoke(sb.rt, who.team, who.user, provider)
    log.info("connection_disconnected", user=who.user, provider=provider, dropped=dropped)
    publish_home(sb, client, who.user, who.team, page=who.home_page)
