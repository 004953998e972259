"""The slash command, `/switchboard`: help, `runs`, `run <id>`, `cancel <id>` (parsed in
`bot.transport.slash`), answered ephemerally where it was typed."""

from __future__ import annotations

from typing import Any

import structlog
from slack_bolt import Ack
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.webhook import WebhookClient

from bot.listeners.actions import cancel_run, show_run
from bot.listeners.base import Bot, boundary
from bot.render import messages as m
from bot.render.mrkdwn import mention
from bot.render.views import runs_blocks
from bot.transport.payloads import Asked
from bot.transport.slash import Command, Scope, Verb, parse
from worker.runtime import Runtime
from worker.service import runs

log = structlog.get_logger(__name__)

COMMAND = "/switchboard"


@boundary
def on_command(ack: Ack, command: dict[str, Any], client: WebClient, sb: Bot) -> None:
    ack()
    asked = Asked.of(command)
    if asked is None:
        return
    user = asked.user
    parsed = parse(asked.text)
    if parsed.verb == Verb.HELP:
        answer(client, asked, text=m.HELP)
    elif parsed.verb == Verb.ERROR:
        answer(client, asked, text=parsed.error)
    elif parsed.verb == Verb.RUNS:
        admin = sb.access.may_administer(sb.identity.roles(user, asked.team))
        blocks = runs_listing(sb.rt, parsed, user, admin)
        answer(client, asked, text=m.RUNS_FALLBACK, blocks=blocks)
    elif parsed.verb == Verb.RUN and parsed.run_id:
        problem = show_run(sb, client, parsed.run_id, user, asked.team, asked.trigger_id)
        if problem:
            answer(client, asked, text=problem)
    elif parsed.verb == Verb.CANCEL and parsed.run_id:
        answer(client, asked, text=cancel_run(sb, parsed.run_id, user, asked.team))
    log.info("command", verb=parsed.verb, user=user, channel=asked.channel)


def answer(
    client: WebClient,
    asked: Asked,
    *,
    text: str,
    blocks: list[dict[str, Any]] | None = None,
) -> None:
    """Ephemeral, in the channel the command was typed in; through the command's
    response_url when the bot cannot post there (e.g. it is not a member)."""
    try:
        client.chat_postEphemeral(channel=asked.channel, user=asked.user, text=text, blocks=blocks)
    except SlackApiError as exc:
        url = asked.response_url
        if not url.startswith("https://hooks.slack.com/"):
            raise
        log.info("command_answer_via_response_url", error=exc.response.get("error"))
        WebhookClient(url).send(text=text, blocks=blocks, response_type="ephemeral")


def runs_listing(rt: Runtime, command: Command, user_id: str, admin: bool) -> list[dict[str, Any]]:
    """What `/switchboard runs` shows: a non-admin only ever sees their own runs."""
    scope, who, note = command.scope, command.user, ""
    if scope == Scope.USER and who == user_id:
        scope = Scope.MINE
    if scope in (Scope.ALL, Scope.USER) and not admin:
        scope, note = Scope.MINE, m.RUNS_ADMIN_ONLY
    filter_user = {Scope.MINE: user_id, Scope.USER: who, Scope.ALL: None}[scope]
    found = runs.recent(rt, user_id=filter_user, status=command.status, limit=20)
    if scope == Scope.MINE:
        title = m.RUNS_SCOPE_MINE
    elif scope == Scope.ALL:
        title = m.RUNS_SCOPE_ALL
    else:
        title = m.RUNS_SCOPE_USER.format(user=mention(who or ""))
    if command.status is not None:
        title = m.RUNS_SCOPE_STATUS.format(
            scope=title, status=m.STATUS_WORDS.get(command.status.value, command.status.value)
        )
    return runs_blocks(m.RUNS_HEADER.format(scope=title), found, note)
