"""Approve all / Reject all on a batch card (bot.render.batch_card draws it): each item
decided and checked on its own by the use-case layer (worker.service.decisions). Reject all
asks for a reason and instructions first, in a modal, as Reject does."""

from __future__ import annotations

import json
from typing import Any

import structlog
from slack_bolt import Ack
from slack_sdk import WebClient

from approvals.request import INSTRUCTIONS_MAX
from bot.listeners.base import Bot, boundary, tell
from bot.render import messages as m
from bot.render.blocks import (
    APPROVE_ALL,
    REJECT_INSTRUCTIONS_BLOCK,
    REJECT_INSTRUCTIONS_INPUT,
    REJECT_REASON_BLOCK,
    REJECT_REASON_INPUT,
)
from bot.render.mrkdwn import escape
from bot.render.views import REASON_MAX, reject_all_modal
from bot.transport import ids
from bot.transport.payloads import Clicked, dig, read_metadata, user_team
from worker.service import approvals
from worker.service.decisions import BatchOutcome, decide_batch

log = structlog.get_logger(__name__)


@boundary
def on_decide_all(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Approve all / Reject all: every item still pending that the clicker may decide,
    each decided (and checked) on its own. The button carries a batch id, not an
    approval's: its own prelude, logged as `batch_click_rejected`."""
    ack()
    batch_id = ids.shaped(ids.BATCH, action.get("value"))
    who = Clicked.of(body)
    if batch_id is None or who is None:
        log.warning("batch_click_rejected")
        return
    if action.get("action_id") != APPROVE_ALL:
        ask_reject_reason(client, who, batch_id, sb)
        return
    outcome = decide_batch(
        sb.rt,
        batch_id,
        decider_id=who.user,
        decider_roles=sb.identity.roles(who.user, who.team),
        approve=True,
        surface="slack",
    )
    answer(client, who, sb, outcome)


def ask_reject_reason(client: WebClient, who: Clicked, batch_id: str, sb: Bot) -> None:
    """Reject all asks for one reason first (in a modal: the trigger lasts 3 s), once it is
    clear the clicker may decide some item still waiting."""
    requests = approvals.batch(sb.rt, batch_id)
    waiting = [r for r in requests if not r.decided]
    if not requests:
        tell(client, who, m.APPROVAL_NOT_FOUND)
        return
    if not waiting:
        tell(client, who, m.BATCH_NOTHING_LEFT)
        return
    roles = sb.identity.roles(who.user, who.team)
    mine = [r for r in waiting if sb.access.may_decide(r, who.user, roles)]
    if not mine:
        approvers = escape(approvals.facts(sb.rt, waiting[0]).approvers)
        tell(client, who, m.NOT_ALLOWED_TO_DECIDE.format(approvers=approvers))
        return
    meta = json.loads(who.metadata(mine[0].id))
    meta["batch_id"] = batch_id
    view = reject_all_modal(mine[0].requester, len(mine), json.dumps(meta))
    client.views_open(trigger_id=who.trigger_id, view=view)


@boundary
def on_reject_all_submitted(
    ack: Ack, body: dict[str, Any], view: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Reject all, with the reason and instructions typed: each item decided on its own."""
    ack()
    meta = read_metadata(view.get("private_metadata"))
    batch_id = ids.shaped(ids.BATCH, meta.get("batch_id"))
    user = ids.shaped(ids.USER, dig(body, "user", "id"))
    if batch_id is None or user is None:
        log.warning("reject_all_submission_rejected")
        return
    values = dig(view, "state", "values")
    typed = dig(values, REJECT_REASON_BLOCK, REJECT_REASON_INPUT, "value")
    told = dig(values, REJECT_INSTRUCTIONS_BLOCK, REJECT_INSTRUCTIONS_INPUT, "value")
    requests = approvals.batch(sb.rt, batch_id)
    cards = requests[0].cards if requests else []  # where its card is: not the metadata's say
    who = Clicked.submitted(user, user_team(body)[:64], meta, cards)
    outcome = decide_batch(
        sb.rt,
        batch_id,
        decider_id=user,
        decider_roles=sb.identity.roles(user, who.team),
        approve=False,
        reason=typed[:REASON_MAX] if isinstance(typed, str) else "",
        instructions=told[:INSTRUCTIONS_MAX] if isinstance(told, str) else "",
        surface="slack",
    )
    answer(client, who, sb, outcome)


def answer(client: WebClient, who: Clicked, sb: Bot, outcome: BatchOutcome) -> None:
    if not outcome.found:
        tell(client, who, m.APPROVAL_NOT_FOUND)
    elif outcome.refused:
        tell(client, who, m.NOT_ALLOWED_TO_DECIDE.format(approvers=escape(outcome.approvers)))
    elif not outcome.decided:
        tell(client, who, m.BATCH_NOTHING_LEFT)
    if outcome.decided:
        sb.surface.show_outcome(outcome.decided[-1], also=who.card)
