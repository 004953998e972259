"""What every listener shares: the `Bot` they are given, the `boundary` they run inside,
the click prelude of every button (`clicked`, `clicked_request`), answering the person who
clicked (`tell`), what follows a decision (`after_decision`) and the App Home
(`publish_home`). `bot.listeners.edit` and `bot.listeners.batch` use these too.

Who may do what is asked of `Bot.access` (worker.service.Access, where every check is
defined once, the rule for people outside the workspace included). No listener checks
inline, and none touches the runtime's stores: they call the use-case layer
(worker.service).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec

import structlog
from slack_bolt import Ack
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from approvals import ApprovalRequest
from bot.listeners.home import build_home
from bot.render import messages as m
from bot.render.blocks import outcome_text
from bot.render.mrkdwn import escape
from bot.render.views import modal
from bot.state.identity import Identity
from bot.state.installations import Home, Installations
from bot.state.threads import Threads
from bot.transport import ids
from bot.transport.payloads import Clicked, action_value
from worker import service
from worker.roles import RolesUnavailable
from worker.runtime import Runtime
from worker.service import Access, approvals

if (
    TYPE_CHECKING
):  # bot.outbound.slack_surface imports bot.render.batch_card, which imports this module
    from bot.outbound.slack_surface import SlackSurface

log = structlog.get_logger(__name__)

# seconds for roles when a modal is submitted: its answer must come within 3 s
MODAL_ROLES_WAIT = 1.5

P = ParamSpec("P")


@dataclass(frozen=True)
class Bot:
    rt: Runtime
    identity: Identity
    threads: Threads
    surface: SlackSurface
    home: Home
    installations: Installations

    @property
    def access(self) -> Access:
        """Who may do what, by the policy as it is now."""
        return Access.of(self.rt)


def boundary(listener: Callable[P, None]) -> Callable[P, None]:
    """The listener boundary: log with the traceback; Slack already has its ack."""

    @functools.wraps(listener)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            listener(*args, **kwargs)
        except RolesUnavailable as exc:  # fail closed, and say why
            log.warning("roles_unavailable", listener=listener.__name__, error=str(exc))
            client, body = kwargs.get("client"), kwargs.get("body")
            if isinstance(client, WebClient) and isinstance(body, dict):
                explain_roles_unavailable(client, body)
        except Exception:  # boundary: nothing else would log it with our context
            log.exception("listener_failed", listener=listener.__name__)

    return guarded


def explain_roles_unavailable(client: WebClient, body: dict[str, Any]) -> None:
    """Tell the person who asked or clicked that nothing was done: their Slack user groups
    (which decide what they may do) could not be confirmed."""
    event = body.get("event")
    try:
        if isinstance(event, dict):
            user = ids.shaped(ids.USER, event.get("user"))
            channel = ids.shaped(ids.CHANNEL, event.get("channel"))
            if user and channel and event.get("type") != "app_home_opened":
                thread_ts = ids.shaped(ids.TS, event.get("thread_ts") or event.get("ts"))
                client.chat_postEphemeral(
                    channel=channel, user=user, text=m.ROLES_UNAVAILABLE, thread_ts=thread_ts
                )
            return
        clicked = Clicked.of(body)
        if clicked is not None:
            tell(client, clicked, m.ROLES_UNAVAILABLE)
        elif (user := ids.shaped(ids.USER, body.get("user_id"))) and (
            channel := ids.shaped(ids.CHANNEL, body.get("channel_id"))
        ):
            client.chat_postEphemeral(channel=channel, user=user, text=m.ROLES_UNAVAILABLE)
    except SlackApiError as exc:
        log.warning("roles_unavailable_not_told", error=str(exc)[:300])


def say(client: WebClient, channel: str, thread_ts: str | None, text: str) -> None:
    client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text)


def tell(client: WebClient, clicked: Clicked, text: str) -> None:
    """An answer only the clicker sees: ephemeral in the channel, or a small modal (on top
    of the modal clicked in, if any)."""
    if clicked.channel:
        client.chat_postEphemeral(
            channel=clicked.channel,
            user=clicked.user,
            text=text,
            thread_ts=clicked.thread_ts or None,
        )
    elif clicked.trigger_id:
        view = modal("Switchboard", [{"type": "section", "text": {"type": "mrkdwn", "text": text}}])
        if clicked.in_modal:
            client.views_push(trigger_id=clicked.trigger_id, view=view)
        else:
            client.views_open(trigger_id=clicked.trigger_id, view=view)


# -- the click prelude ---------------------------------------------------------------------


def clicked(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], pattern: re.Pattern[str]
) -> tuple[Clicked, str] | None:
    """Every button's start: ack at once, then who clicked and the id the button carries
    (of the shape `pattern`: an approval or a run). None for a malformed click (logged)."""
    ack()
    value = action_value(action, pattern)
    who = Clicked.of(body)
    if value is None or who is None:
        return None
    return who, value


def clicked_request(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> tuple[Clicked, ApprovalRequest] | None:
    """`clicked`, for a card's button, and the request it is about; a request that no
    longer exists is said so to the clicker."""
    found = clicked(ack, body, action, ids.APPROVAL)
    if found is None:
        return None
    who, approval_id = found
    request = approvals.find(sb.rt, approval_id)
    if request is None:
        tell(client, who, m.APPROVAL_NOT_FOUND)
        return None
    return who, request


def stop_unless_theirs(client: WebClient, who: Clicked, request: ApprovalRequest, sb: Bot) -> bool:
    """Before a decision's modal opens: tell the clicker when the request is decided
    already or is not theirs to decide (True: stop there)."""
    if request.decided:
        tell(client, who, m.ALREADY_DECIDED.format(outcome=outcome_text(request)))
        return True
    if not sb.access.may_decide(request, who.user, sb.identity.roles(who.user, who.team)):
        approvers = escape(approvals.facts(sb.rt, request).approvers)
        tell(client, who, m.NOT_ALLOWED_TO_DECIDE.format(approvers=approvers))
        return True
    return False


# -- after a decision ----------------------------------------------------------------------


def after_decision(
    sb: Bot, client: WebClient, who: Clicked, outcome: service.DecisionOutcome
) -> None:
    result, request = outcome.result, outcome.request
    log.info(
        "decision",
        result=result.value,
        user=who.user,
        approval_id=request.id if request else None,
    )
    if result == service.DecisionResult.NOT_FOUND or request is None:
        tell(client, who, m.APPROVAL_NOT_FOUND)
    elif result == service.DecisionResult.NOT_ALLOWED:
        tell(client, who, m.NOT_ALLOWED_TO_DECIDE.format(approvers=escape(outcome.approvers)))
    elif result == service.DecisionResult.INVALID_EDIT:
        why = outcome.refused.message if outcome.refused else ""
        tell(client, who, m.EDIT_INVALID.format(why=escape(why)))
    elif result == service.DecisionResult.ALREADY_DECIDED:
        tell(client, who, m.ALREADY_DECIDED.format(outcome=outcome_text(request)))
        sb.surface.show_outcome(request, also=who.card)
    else:
        sb.surface.show_outcome(request, also=who.card)
    if who.in_home:
        try:
            publish_home(sb, client, who.user, who.team, page=who.home_page)
        except RolesUnavailable:  # the decision stands; App Home is redrawn when next opened
            log.warning("home_not_redrawn", user=who.user)


def publish_home(sb: Bot, client: WebClient, user_id: str, team: str, page: int = 0) -> None:
    roles = sb.identity.roles(user_id, team)
    view = build_home(sb.rt, user_id, roles, team=team, page=page)
    client.views_publish(user_id=user_id, view=view)
