"""Standing grants in Slack: a card's "Approve and allow…" buttons (check the clicker, then
open the modal that shows what the grant covers), the modal's submission (approve and make
the grant, worker.service.grants), and Revoke in App Home's "Allowed for you"."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import structlog
from slack_bolt import Ack
from slack_sdk import WebClient

from bot.listeners.base import (
    MODAL_ROLES_WAIT,
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
from bot.render.blocks import outcome_text
from bot.render.grants import GRANT, WIDEN_BLOCK, grant_modal, read_widened
from bot.render.mrkdwn import cut, escape, mention
from bot.transport import ids
from bot.transport.payloads import Clicked, dig, read_metadata, user_team
from worker.roles import RolesUnavailable
from worker.service import approvals, grants
from worker.service.decisions import DecisionOutcome, DecisionResult
from worker.service.grants import GRANT_SCOPES, GrantResult, RevokeResult

log = structlog.get_logger(__name__)


def names_digest(names: list[str]) -> str:
    """Which arguments the form's boxes stand for, in order (its options are numbered)."""
    return hashlib.sha256(json.dumps(names).encode()).hexdigest()[:16]


def scope_of(action_id: Any) -> str | None:
    """The scope a grant button's action id names (sb_grant_thread -> thread)."""
    if not isinstance(action_id, str) or not action_id.startswith(GRANT + "_"):
        return None
    scope = action_id[len(GRANT) + 1 :]
    return scope if scope in GRANT_SCOPES else None


@boundary
def on_grant(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Approve and allow…: check the clicker, then show what the grant would cover."""
    found = clicked_request(ack, body, action, client, sb)
    scope = scope_of(action.get("action_id"))
    if found is None or scope is None:
        return
    who, request = found
    if stop_unless_theirs(client, who, request, sb):
        return
    if not sb.access.may_grant(request, scope, who.user, sb.identity.roles(who.user, who.team)):
        approvers = escape(approvals.facts(sb.rt, request).approvers)
        tell(client, who, m.GRANT_NOT_ALLOWED.format(approvers=approvers))
        return
    names = grants.arguments_of(sb.rt, request)
    meta = json.loads(who.metadata(request.id))
    meta.update(binding=request.binding, scope=scope, names=names_digest(names))
    client.views_open(
        trigger_id=who.trigger_id, view=grant_modal(request, scope, names, json.dumps(meta))
    )


REFUSALS = {
    GrantResult.NOT_FOUND: m.APPROVAL_NOT_FOUND,
    GrantResult.NOT_ALLOWED: m.GRANT_NOT_ALLOWED,
    GrantResult.STALE: m.GRANT_STALE,
    GrantResult.INVALID: m.GRANT_INVALID,
    GrantResult.NO_THREAD: m.GRANT_NO_THREAD,
    GrantResult.TOO_MANY: m.GRANT_TOO_MANY,
}


@boundary
def on_grant_submitted(
    ack: Ack, body: dict[str, Any], view: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Approve and make the grant; a refusal is answered in the modal."""
    meta = read_metadata(view.get("private_metadata"))
    approval_id = ids.shaped(ids.APPROVAL, meta.get("approval_id"))
    user = ids.shaped(ids.USER, dig(body, "user", "id"))
    scope = meta.get("scope") if meta.get("scope") in GRANT_SCOPES else None
    request = approvals.find(sb.rt, approval_id) if approval_id else None
    if user is None or scope is None or request is None:
        log.warning("grant_submission_rejected", approval_id=approval_id)
        ack(response_action="errors", errors={f"{WIDEN_BLOCK}0": m.APPROVAL_NOT_FOUND[:150]})
        return
    names = grants.arguments_of(sb.rt, request)
    first = f"{WIDEN_BLOCK}0"
    widened = read_widened(dig(view, "state", "values"), names)
    team = user_team(body)[:64]
    problem = ""
    outcome = None
    if meta.get("names") != names_digest(names):  # the tool's arguments changed meanwhile:
        problem = m.GRANT_STALE  # the ticked boxes may no longer mean the same arguments
    elif widened is None:
        problem = m.GRANT_INVALID
    else:
        try:
            roles = sb.identity.roles(user, team, wait=MODAL_ROLES_WAIT)
        except RolesUnavailable:  # answered in the modal: the ack must come within 3 s
            roles = None
            problem = m.ROLES_UNAVAILABLE
        if roles is not None:
            outcome = grants.approve_and_allow(
                sb.rt,
                request.id,
                scope=scope,
                widened=widened,
                decider_id=user,
                decider_roles=roles,
                decider_team=team,
                binding=meta.get("binding"),
                surface="slack",
            )
            problem = refusal_text(outcome)
    if problem:
        log.info("grant_refused", approval_id=request.id, user=user, why=problem[:80])
        if names:
            ack(response_action="errors", errors={first: cut(problem, 150)})
        else:
            ack()
            tell(client, Clicked.submitted(user, team, meta, request.cards), problem)
        return
    ack()
    assert outcome is not None and outcome.grant is not None
    who = Clicked.submitted(user, team, meta, request.cards)
    decided = DecisionOutcome(DecisionResult.DECIDED, outcome.request, outcome.approvers)
    after_decision(sb, client, who, decided)
    where = m.GRANT_WHERE.get(scope, scope)
    tell(client, who, m.GRANT_MADE.format(where=where, grant_id=outcome.grant.id))


def refusal_text(outcome: grants.GrantOutcome) -> str:
    if outcome.result == GrantResult.GRANTED:
        return ""
    if outcome.result == GrantResult.ALREADY_DECIDED and outcome.request is not None:
        return m.ALREADY_DECIDED.format(outcome=outcome_text(outcome.request))
    text = REFUSALS.get(outcome.result, m.APPROVAL_NOT_FOUND)
    user = mention(outcome.request.requester) if outcome.request else ""
    return text.format(approvers=escape(outcome.approvers), user=user)


@boundary
def on_revoke_grant(
    ack: Ack, body: dict[str, Any], action: dict[str, Any], client: WebClient, sb: Bot
) -> None:
    """Revoke, in App Home: the grantor, the person it covers, or an admin (checked here:
    anyone can send a click)."""
    found = clicked(ack, body, action, ids.GRANT)
    if found is None:
        return
    who, grant_id = found
    result = grants.revoke(
        sb.rt, grant_id, by=who.user, roles=sb.identity.roles(who.user, who.team)
    )
    words = {
        RevokeResult.REVOKED: m.REVOKED,
        RevokeResult.NOT_ALLOWED: m.REVOKE_NOT_ALLOWED,
        RevokeResult.ALREADY_ENDED: m.REVOKE_ENDED,
        RevokeResult.NOT_FOUND: m.REVOKE_NOT_FOUND,
    }
    tell(client, who, words[result].format(grant_id=grant_id))
    if who.in_home:
        publish_home(sb, client, who.user, who.team, page=who.home_page)
