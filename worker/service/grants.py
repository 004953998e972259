"""Standing grants: approve a call *and* allow similar ones (same tool, same requester,
arguments within a constraint the approver saw) in its thread or for a while; list them;
revoke them.

A grant is made only together with a winning approval of the request it was offered on
(`approve_and_allow`): a forged, replayed or stale grant action finds the request decided
or changed and is refused, and so is one by a person `Access.may_grant` does not let, or
for a scope the tool's rule does not offer. Covering later calls is the loop's part
(worker/standing.py); the store is approvals/grants.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

import structlog

from approvals import ApprovalRequest
from approvals.grants import MAX_LIVE, Constraint, Grant, TooManyGrants
from tools.policy import EXTERNAL
from tools.policy_file import GRANT_SCOPES
from worker import metrics
from worker.access import Access
from worker.events import EventKind
from worker.runtime import Runtime
from worker.service.decisions import DecisionResult, decide
from worker.standing import thread_of

__all__ = ["GRANT_SCOPES", "Grant", "GrantOutcome", "GrantResult", "RevokeResult"]

log = structlog.get_logger(__name__)

MAX_WIDENED = 100  # argument names an approver may widen in one grant


class GrantResult(StrEnum):
    GRANTED = "granted"
    NOT_FOUND = "not_found"
    NOT_ALLOWED = "not_allowed"  # not this person's to grant, or a scope not offered
    ALREADY_DECIDED = "already_decided"  # also a replayed action
    STALE = "stale"  # the request changed since the grant was offered
    INVALID = "invalid"  # widens an argument the tool does not have
    NO_THREAD = "no_thread"  # a thread grant for a run without a thread
    TOO_MANY = "too_many"


@dataclass(frozen=True)
class GrantOutcome:
    result: GrantResult
    request: ApprovalRequest | None = None
    grant: Grant | None = None
    approvers: str = ""  # who may decide, in words (for a refusal)


def arguments_of(rt: Runtime, request: ApprovalRequest) -> list[str]:
    """The arguments a grant's constraint speaks of: the call's, then the rest of the
    tool's schema (absent now: a grant keeps them absent unless widened)."""
    tool = rt.registry.get(request.tool)
    properties = (tool.parameters.get("properties") or {}) if tool is not None else {}
    return list(dict.fromkeys([*request.args, *properties]))


def approve_and_allow(
    rt: Runtime,
    approval_id: str,
    *,
    scope: str,
    widened: Iterable[str],
    decider_id: str,
    decider_roles: frozenset[str],
    decider_team: str = "",
    binding: str | None = None,
    surface: str = "unknown",
) -> GrantOutcome:
    """Approve the request and make a grant for `scope` whose constraint fixes every
    argument but those `widened` to any value."""
    request = rt.approvals.find(approval_id)
    if request is None:
        return GrantOutcome(GrantResult.NOT_FOUND)
    approvers = rt.policy.approvers_text(request.tool)
    if request.decided:
        return GrantOutcome(GrantResult.ALREADY_DECIDED, request, approvers=approvers)
    if binding is not None and binding != request.binding:
        return GrantOutcome(GrantResult.STALE, request, approvers=approvers)
    if not Access.of(rt).may_grant(request, scope, decider_id, decider_roles):
        rt.events.append(
            request.run_id,
            EventKind.DECISION_REFUSED,
            approval_id=approval_id,
            by=decider_id,
            grant=scope[:10],
        )
        return GrantOutcome(GrantResult.NOT_ALLOWED, request, approvers=approvers)
    names = set(list(widened)[: MAX_WIDENED + 1])
    tool = rt.registry.get(request.tool)
    run = rt.store.find(request.run_id)
    if tool is None or run is None:
        return GrantOutcome(GrantResult.NOT_FOUND, request, approvers=approvers)
    if len(names) > MAX_WIDENED or not names <= set(arguments_of(rt, request)):
        return GrantOutcome(GrantResult.INVALID, request, approvers=approvers)
    thread = thread_of(run)
    if scope == "thread" and not thread:
        return GrantOutcome(GrantResult.NO_THREAD, request, approvers=approvers)
    if len(rt.grants.live_for(request.requester)) >= MAX_LIVE:
        return GrantOutcome(GrantResult.TOO_MANY, request, approvers=approvers)
    decided = decide(
        rt,
        approval_id,
        decider_id=decider_id,
        decider_roles=decider_roles,
        approve=True,
        reason=f"approved, and allowed similar calls ({scope})",
        surface=surface,
    )
    if decided.result != DecisionResult.DECIDED or decided.request is None:
        refused = decided.result == DecisionResult.NOT_ALLOWED
        result = GrantResult.NOT_ALLOWED if refused else GrantResult.ALREADY_DECIDED
        return GrantOutcome(result, decided.request, approvers=approvers)
    try:
        grant = rt.grants.create(
            tool=request.tool,
            requester=request.requester,
            team_id=request.team_id,
            grantor=decider_id,
            grantor_team=decider_team,
            scope=scope,
            thread=thread,
            constraint=Constraint.of(request.args, names),
            policy_version=rt.policy.version,
            tool_digest=tool.contract_digest,
            approval_id=request.id,
            run_id=request.run_id,
            grantor_external=EXTERNAL in decider_roles,
        )
    except TooManyGrants:  # made meanwhile by another approver: approved, but no grant
        log.warning("grant_not_made", approval_id=request.id, why="too_many")
        return GrantOutcome(GrantResult.TOO_MANY, decided.request, approvers=approvers)
    metrics.grant_made(scope)
    log.info(
        "grant_created",
        grant_id=grant.id,
        tool=grant.tool,
        requester=grant.requester,
        grantor=grant.grantor,
        scope=scope,
        widened=sorted(names),
        surface=surface,
    )
    rt.events.append(
        request.run_id,
        EventKind.GRANT_CREATED,
        grant_id=grant.id,
        approval_id=request.id,
        tool=grant.tool,
        by=decider_id,
        scope=scope,
        any=sorted(names),
        fixed=sorted(grant.constraint.fixed),
        expires_at=grant.expires_at,
    )
    return GrantOutcome(GrantResult.GRANTED, decided.request, grant, approvers)


def find(rt: Runtime, grant_id: str) -> Grant | None:
    return rt.grants.find(grant_id)


def allowed_for(rt: Runtime, user_id: str) -> list[Grant]:
    """Live grants that cover this person's calls, or that they made, soonest to end first."""
    return [g for g in rt.grants.live() if user_id in (g.requester, g.grantor)]


def live(rt: Runtime) -> list[Grant]:
    """Every live grant, soonest to end first: for operators."""
    return rt.grants.live()


def in_force(rt: Runtime, grant: Grant) -> bool:
    """Does the grant still cover calls: live, and made under the policy in force and the
    tool as it is now? (One made under another policy or tool version covers nothing.)"""
    tool = rt.registry.get(grant.tool)
    return (
        grant.live()
        and grant.policy_version == rt.policy.version
        and tool is not None
        and tool.contract_digest == grant.tool_digest
    )


def used_in(rt: Runtime, grant_ids: Iterable[str]) -> list[Grant]:
    """The grants with these ids that are still stored (for a run's record)."""
    found = (rt.grants.find(i) for i in dict.fromkeys(grant_ids))
    return [g for g in found if g is not None]


class RevokeResult(StrEnum):
    REVOKED = "revoked"
    NOT_FOUND = "not_found"
    NOT_ALLOWED = "not_allowed"
    ALREADY_ENDED = "already_ended"


def end_person(rt: Runtime, team: str, user: str, *, why: str) -> int:
    """A person left the workspace (deactivated): end every live grant they made or that
    covers their calls there, so a grant does not outlive the roles it was made with."""
    ended = 0
    for grant in rt.grants.live():
        theirs = (team, user) in (
            (grant.team_id, grant.requester),
            (grant.grantor_team, grant.grantor),
        )
        if theirs and rt.grants.revoke(grant, why):
            rt.events.append(grant.run_id, EventKind.GRANT_REVOKED, grant_id=grant.id, by=why)
            ended += 1
    return ended


def revoke(rt: Runtime, grant_id: str, *, by: str, roles: frozenset[str]) -> RevokeResult:
    """End a grant at once: its grantor, the requester it covers, or an admin may."""
    grant = rt.grants.find(grant_id)
    if grant is None:
        return RevokeResult.NOT_FOUND
    if not Access.of(rt).may_revoke(grant, by, roles):
        log.warning("grant_revoke_refused", grant_id=grant_id, user=by)
        return RevokeResult.NOT_ALLOWED
    if not grant.live() or not rt.grants.revoke(grant, by):
        return RevokeResult.ALREADY_ENDED
    log.info("grant_revoked", grant_id=grant_id, by=by)
    rt.events.append(grant.run_id, EventKind.GRANT_REVOKED, grant_id=grant_id, by=by)
    return RevokeResult.REVOKED
