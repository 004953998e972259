"""The installation going away (`app_uninstalled`, `tokens_revoked`), and the catch-alls:
whatever no listener of ours claims (old buttons, shortcuts, views, events we do not
subscribe to) is acked and logged, so Bolt's 404 "unhandled request" never reaches Slack:
failed deliveries count toward Slack turning the event subscription off."""

from __future__ import annotations

from typing import Any

import structlog
from slack_bolt import Ack

from bot.listeners.base import Bot, boundary
from bot.listeners.commands import COMMAND
from bot.render import messages as m
from bot.render.mrkdwn import escape
from bot.transport.payloads import interaction_id, team_of
from worker.service import connections, grants, runs

log = structlog.get_logger(__name__)


@boundary
def on_installation_gone(event: dict[str, Any], body: dict[str, Any], sb: Bot) -> None:
    """`app_uninstalled`, or `tokens_revoked` naming a bot token (ours: Slack sends it to
    the app whose tokens they were): stop posting to that workspace, cancel its runs in
    flight and withdraw their pending approvals, so nothing waits on people who can no
    longer see it. User tokens alone do not matter: Switchboard holds none."""
    why = str(event.get("type"))
    tokens = event.get("tokens")
    if why == "tokens_revoked" and not (isinstance(tokens, dict) and tokens.get("bot")):
        log.info("slack_user_tokens_revoked", team=team_of(body))
        return
    team = team_of(body)
    sb.installations.revoke(team, why)
    ended = runs.end_workspace(sb.rt, "slack", team, why=why, withdrawn=m.WITHDRAWN_UNINSTALLED)
    dropped = connections.drop_workspace(sb.rt, team)  # its people's own grants go with it
    log.warning(
        "slack_installation_gone",
        why=why,
        team=team,
        runs=ended.runs,
        approvals=ended.approvals,
        connections=dropped,
    )


@boundary
def on_user_change(event: dict[str, Any], body: dict[str, Any], sb: Bot) -> None:
    """`user_change` for a deactivated person (`deleted: true`): their own connections are
    dropped (revoked at the provider where it can be) and their standing grants end, those
    they gave and those that covered them. Any other change of a profile is nothing to us."""
    user = event.get("user")
    if not isinstance(user, dict) or user.get("deleted") is not True:
        return
    user_id = str(user.get("id", ""))[:40]
    team = str(user.get("team_id") or team_of(body))[:40]
    if not user_id or not team:
        return
    dropped = connections.drop_person(sb.rt, team, user_id)
    ended = grants.end_person(sb.rt, team, user_id, why="slack:user_deactivated")
    log.warning(
        "slack_user_deactivated", team=team, user=user_id, connections=dropped, grants=ended
    )


# -- everything no listener claims -----------------------------------------------------------


def on_other_event(event: dict[str, Any]) -> None:
    """Events we do not act on (Bolt has acked them): `member_joined_channel`,
    `channel_shared`, `team_access_granted`, ..."""
    log.info("event_ignored", type=str(event.get("type"))[:60])


def on_other_interaction(ack: Ack, body: dict[str, Any]) -> None:
    """A button of an older build, another app's shortcut, a modal that is not ours."""
    ack()
    log.info("interaction_ignored", type=str(body.get("type"))[:40], id=interaction_id(body))


def on_other_options(ack: Ack, body: dict[str, Any]) -> None:
    ack(options=[])
    log.info("interaction_ignored", type=str(body.get("type"))[:40], id=interaction_id(body))


def on_other_command(ack: Ack, command: dict[str, Any]) -> None:
    name = str(command.get("command"))[:40]
    ack(text=m.COMMAND_NOT_OURS.format(command=escape(name), ours=COMMAND))
    log.info("command_ignored", command=name)
