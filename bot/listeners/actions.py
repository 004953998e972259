"""Buttons and modals: a card's Approve / Reject (with its reason modal) / Show arguments,
Cancel and View run on a run's messages, Save as a demonstration in the run modal, and the
App Home (its opening, and Previous / Next in its list of waiting requests).

Every button starts with the click prelude (`base.clicked`, `base.clicked_request`); who
may do what is asked of `Bot.access`. Edit (`bot.listeners.edit`) and Approve all /
Reject all (`bot.listeners.batch`) are registered beside these."""

from __future__ import annotations

from typing import Any

import structlog
from slack_bolt import Ack
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from approvals.request import INSTRUCTIONS_MAX
from bot.listeners import demos
from bot.listeners.base import (
    Bot,
    after_decision,
    boundary,
    clicked,
    clicked_request,
    publish_home,
    stop_unless_theirs,
    tell,
)
from bot.render import messages as m
from bot.render.blocks import (
    REJECT_INSTRUCTIONS_BLOCK,
    REJECT_INSTRUCTIONS_INPUT,
    REJECT_REASON_BLOCK,
    REJECT_REASON_INPUT,
)
from bot.render.views import args_modal, reject_modal, run_modal
from bot.transport import ids
from bot.transport.payloads import Clicked, dig, page_number, read_metadata, user_team
from worker import service
from worker.run import Run
from worker.service import approvals, decisions, runs

log = structlog.get_logger(__name__)

REASON_MAX = 500


# -- a card's buttons ------------------------------------------------------------------------


@boundary
def on_approve(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    found = clicked(ack, body, action, ids.APPROVAL)
    if found is None:
        return
    who, approval_id = found
    roles = sb.identity.roles(who.user, who.team)
    outcome = decisions.decide(
        sb.rt, approval_id, decider_id=who.user, decider_roles=roles, approve=True, surface="slack"
    )
    after_decision(sb, client, who, outcome)


@boundary
def on_reject(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Check the clicker first, then ask for a reason in a modal (the trigger lasts 3 s)."""
    found = clicked_request(ack, body, action, client, sb)
    if found is None:
        return
    who, request = found
    if stop_unless_theirs(client, who, request, sb):
        return
    client.views_open(
        trigger_id=who.trigger_id, view=reject_modal(request, who.metadata(request.id))
    )


@boundary
def on_reject_submitted(
    ack: Ack, body: dict[str, Any], view: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    ack()
    meta = read_metadata(view.get("private_metadata"))
    approval_id = ids.shaped(ids.APPROVAL, meta.get("approval_id"))
    user = ids.shaped(ids.USER, dig(body, "user", "id"))
    if approval_id is None or user is None:
        log.warning("reject_submission_rejected")
        return
    typed = dig(view, "state", "values", REJECT_REASON_BLOCK, REJECT_REASON_INPUT, "value")
    request = approvals.find(sb.rt, approval_id)  # where its cards are: not the metadata's say
    who = Clicked.submitted(user, user_team(body)[:64], meta, request.cards if request else [])
    reason = typed[:REASON_MAX] if isinstance(typed, str) else ""
    told = dig(
        view, "state", "values", REJECT_INSTRUCTIONS_BLOCK, REJECT_INSTRUCTIONS_INPUT, "value"
    )
    instructions = told[:INSTRUCTIONS_MAX] if isinstance(told, str) else ""
    outcome = decisions.decide(
        sb.rt,
        approval_id,
        decider_id=user,
        decider_roles=sb.identity.roles(user, who.team),
        approve=False,
        reason=reason,
        instructions=instructions,
        surface="slack",
    )
    after_decision(sb, client, who, outcome)


@boundary
def on_show_args(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """The full arguments, read from Redis: for the requester, deciders and admins."""
    found = clicked_request(ack, body, action, client, sb)
    if found is None:
        return
    who, request = found
    if not sb.access.may_see_args(request, who.user, sb.identity.roles(who.user, who.team)):
        tell(client, who, m.ARGS_NOT_YOURS)
        return
    client.views_open(trigger_id=who.trigger_id, view=args_modal(request))


# -- a run's buttons -------------------------------------------------------------------------


@boundary
def on_cancel(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    found = clicked(ack, body, action, ids.RUN)
    if found is None:
        return
    who, run_id = found
    tell(client, who, cancel_run(sb, run_id, who.user, who.team))


def cancel_run(sb: Bot, run_id: str, user: str, team: str) -> str:
    result = service.cancel(sb.rt, run_id, by=user, roles=sb.identity.roles(user, team))
    words = {
        service.CancelResult.CANCELLING: m.CANCELLING,
        service.CancelResult.NOT_ALLOWED: m.CANCEL_NOT_ALLOWED,
        service.CancelResult.ALREADY_ENDED: m.CANCEL_ALREADY_ENDED,
        service.CancelResult.NOT_FOUND: m.RUN_NOT_FOUND,
    }
    return words[result].format(run_id=run_id)


@boundary
def on_view_run(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    found = clicked(ack, body, action, ids.RUN)
    if found is None:
        return
    who, run_id = found
    problem = show_run(sb, client, run_id, who.user, who.team, who.trigger_id)
    if problem:
        tell(client, who, problem)


def show_run(sb: Bot, client: WebClient, run_id: str, user: str, team: str, trigger_id: str) -> str:
    """Open the trajectory modal; returns what to say instead when the user may not see it."""
    run = runs.find(sb.rt, run_id)
    if run is None:
        return m.RUN_NOT_FOUND.format(run_id=run_id)
    roles = sb.identity.roles(user, team)
    if not sb.access.may_inspect(run, user, roles):
        return m.RUN_NOT_YOURS.format(run_id=run_id)
    if not trigger_id:
        log.warning("run_modal_without_trigger", run_id=run_id)
        return ""
    offer_save, note = demos.offer(sb.rt, run) if sb.access.may_administer(roles) else (False, "")
    client.views_open(
        trigger_id=trigger_id, view=inspected(sb, run, offer_save=offer_save, note=note)
    )
    return ""


def inspected(sb: Bot, run: Run, *, offer_save: bool = False, note: str = "") -> dict[str, Any]:
    seen = runs.inspect(sb.rt, run)
    return run_modal(
        run,
        seen.events,
        seen.cancelled_by,
        offer_save=offer_save,
        note=note,
        trace=seen.trace,
    )


@boundary
def on_save_demo(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Admins only, checked again here: the button is only shown to them, but anyone can
    send a click."""
    found = clicked(ack, body, action, ids.RUN)
    if found is None:
        return
    who, run_id = found
    if not sb.access.may_administer(sb.identity.roles(who.user, who.team)):
        log.warning("demo_save_refused", user=who.user, run_id=run_id)
        tell(client, who, m.DEMO_ADMINS_ONLY)
        return
    run = runs.find(sb.rt, run_id)
    if run is None:
        tell(client, who, m.RUN_NOT_FOUND.format(run_id=run_id))
        return
    text = demos.save(sb.rt, run, who.user)
    if not who.view_id:
        tell(client, who, text)
        return
    try:  # the modal it was clicked in: the button gives way to what happened
        client.views_update(view_id=who.view_id, view=inspected(sb, run, note=text))
    except SlackApiError as exc:  # e.g. the modal was closed meanwhile
        log.info("run_modal_gone", error=exc.response.get("error"))
        tell(client, who, text)


# -- App Home --------------------------------------------------------------------------------


@boundary
def on_home_opened(event: dict[str, Any], body: dict[str, Any], client: WebClient, sb: Bot) -> None:
    user = ids.shaped(ids.USER, event.get("user"))
    if event.get("tab") == "home" and user:
        publish_home(sb, client, user, user_team(body))


@boundary
def on_home_page(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Previous / Next in the App Home's list of requests waiting for a decision. The value
    is a page number, not an id: its own check, and no log for a bad one (as ever)."""
    ack()
    who = Clicked.of(body)
    if who is not None:
        publish_home(sb, client, who.user, who.team, page=page_number(action.get("value")))
