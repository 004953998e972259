"""Approve all / Reject all on a batch card (bot.render.batch_card draws it): each item
decided and checked on its own by the use-case layer (worker.service.decisions)."""

from __future__ import annotations

from typing import Any

import structlog
from slack_bolt import Ack
from slack_sdk import WebClient

from bot.listeners.base import Bot, boundary, tell
from bot.render import messages as m
from bot.render.blocks import APPROVE_ALL
from bot.render.mrkdwn import escape
from bot.transport import ids
from bot.transport.payloads import Clicked
from worker.service.decisions import decide_batch

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
    outcome = decide_batch(
        sb.rt,
        batch_id,
        decider_id=who.user,
        decider_roles=sb.identity.roles(who.user, who.team),
        approve=action.get("action_id") == APPROVE_ALL,
        surface="slack",
    )
    if not outcome.found:
        tell(client, who, m.APPROVAL_NOT_FOUND)
    elif outcome.refused:
        tell(client, who, m.NOT_ALLOWED_TO_DECIDE.format(approvers=escape(outcome.approvers)))
    elif not outcome.decided:
        tell(client, who, m.BATCH_NOTHING_LEFT)
    if outcome.decided:
        sb.surface.show_outcome(outcome.decided[-1], also=who.card)
