"""The card's Edit button and the Edit modal's submission: approve with edits. Every check
comes first and is answered in the modal; then the decision (worker.service.decisions).
The modal itself is built and read in bot.render.edit_form."""

from __future__ import annotations

import json
from typing import Any

import structlog
from slack_bolt import Ack
from slack_sdk import WebClient

from approvals import ApprovalRequest
from approvals.edits import EditRefused
from bot.listeners.base import (
    MODAL_ROLES_WAIT,
    Bot,
    after_decision,
    boundary,
    clicked_request,
    stop_unless_theirs,
    tell,
)
from bot.render import messages as m
from bot.render.blocks import outcome_text
from bot.render.edit_form import edit_modal, fields, read_edit, refusal_errors
from bot.render.mrkdwn import cut, escape
from bot.transport import ids
from bot.transport.payloads import Clicked, dig, read_metadata, user_team
from worker.roles import RolesUnavailable
from worker.service import approvals, decisions

log = structlog.get_logger(__name__)


def edit_metadata(who: Clicked, request: ApprovalRequest) -> str:
    data = json.loads(who.metadata(request.id))
    data["binding"] = request.binding
    return json.dumps(data)


@boundary
def on_edit(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """The card's Edit button: check the clicker, then open the modal (the trigger lasts 3 s)."""
    found = clicked_request(ack, body, action, client, sb)
    if found is None:
        return
    who, request = found
    if stop_unless_theirs(client, who, request, sb):
        return
    facts = approvals.facts(sb.rt, request)
    if facts.tool is None:
        tell(client, who, m.EDIT_TOOL_GONE.format(tool=escape(request.tool)))
        return
    view = edit_modal(request, facts.tool, edit_metadata(who, request), high_risk=facts.high_risk)
    client.views_open(trigger_id=who.trigger_id, view=view)


@boundary
def on_edit_submitted(
    ack: Ack, body: dict[str, Any], view: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Approve with edits: every check first, answered in the modal; then the decision."""
    meta = read_metadata(view.get("private_metadata"))
    approval_id = ids.shaped(ids.APPROVAL, meta.get("approval_id"))
    user = ids.shaped(ids.USER, dig(body, "user", "id"))
    request = approvals.find(sb.rt, approval_id) if approval_id else None
    facts = approvals.facts(sb.rt, request) if request is not None else None
    tool = facts.tool if facts is not None else None
    if user is None or request is None or facts is None or tool is None:
        log.warning("edit_submission_rejected", approval_id=approval_id)
        ack(response_action="errors", errors={"a0": m.APPROVAL_NOT_FOUND[:150]})
        return
    first = next((f.block_id for f in fields(tool, request.args) if f.kind != "fixed"), "a0")
    team = user_team(body)[:64]
    roles: frozenset[str] = frozenset()
    problem = ""
    try:
        roles = sb.identity.roles(user, team, wait=MODAL_ROLES_WAIT)
    except RolesUnavailable:  # answered in the modal: the ack must come within 3 s
        problem = m.ROLES_UNAVAILABLE
    refusal = (
        None
        if problem
        else decisions.edit_refusal(sb.rt, request, user, roles, meta.get("binding"))
    )
    if refusal == decisions.EditRefusal.ALREADY_DECIDED:
        problem = m.ALREADY_DECIDED.format(outcome=outcome_text(request))
    elif refusal == decisions.EditRefusal.STALE:
        problem = m.EDIT_STALE
    elif refusal == decisions.EditRefusal.NOT_ALLOWED:
        problem = m.NOT_ALLOWED_TO_DECIDE.format(approvers=facts.approvers)
    if problem:
        ack(response_action="errors", errors={first: cut(problem, 150)})
        log.info("edit_refused", approval_id=request.id, user=user, why=problem[:80])
        decisions.record_edit_refused(sb.rt, request, user, why=problem)
        return
    args, errors = read_edit(tool, request.args, dig(view, "state", "values"))
    if args is not None:
        try:
            args = decisions.checked_edit(sb.rt, request, args)
        except EditRefused as exc:
            errors = refusal_errors(tool, request.args, exc) or {first: cut(exc.message, 150)}
    if args is None or errors:
        ack(response_action="errors", errors=errors)
        decisions.record_edit_refused(sb.rt, request, user, errors=errors)
        return
    ack()
    who = Clicked.submitted(user, team, meta, request.cards)
    outcome = decisions.decide(
        sb.rt,
        request.id,
        decider_id=user,
        decider_roles=roles,
        approve=True,
        edited_args=args,
        surface="slack",
    )
    after_decision(sb, client, who, outcome)
