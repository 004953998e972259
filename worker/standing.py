"""Standing grants in the loop: a write that a live grant covers is approved by it (in
approvals.grants.GrantStore.use, atomically) instead of asking on a card. The approval is
recorded as any other, decided by the grant's grantor; it runs once through the ledger
like every approved write (worker/executor.py).

Grants are made, listed and revoked in the use-case layer (worker/service/grants.py).
"""

from __future__ import annotations

import structlog

from approvals import ApprovalRequest
from approvals.grants import Grant
from approvals.store import new_request
from tools.policy import EXTERNAL
from worker import audit, metrics
from worker.access import Access
from worker.events import EventKind
from worker.roles import RolesUnavailable
from worker.run import Call, Requester, Run
from worker.runtime import Runtime

log = structlog.get_logger(__name__)


def thread_of(run: Run) -> str:
    """The conversation a `thread` grant covers: the run's channel and thread ("" for a run
    that has none, e.g. the terminal console's)."""
    channel, thread_ts = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
    return f"{channel}:{thread_ts}" if channel and thread_ts else ""


def cover(rt: Runtime, run: Run, call: Call, approval_id: str) -> ApprovalRequest | None:
    """The approval a live grant gives this write call now, or None: ask people."""
    assert call.args is not None
    existing = rt.approvals.find(approval_id)
    if existing is not None:  # asked before (a retried step): as it was decided then
        return existing if existing.grant_id else None
    tool = rt.registry.get(call.name)
    if tool is None:
        return None
    user, thread = run.requester.user_id, thread_of(run)
    for grant in rt.grants.live_for(user):
        if not grant.matches(call.name, user, thread, call.args, run.requester.team_id):
            continue
        request = new_request(
            approval_id=approval_id,
            run_id=run.id,
            call_id=call.id,
            tool=call.name,
            args=call.args,
            requester=user,
            team_id=run.requester.team_id,
            channel_id=run.requester.channel_id,
            policy_version=rt.policy.version,
            ttl=rt.settings.approval_ttl,
        )
        unfit = grantor_unfit(rt, grant, request)
        if unfit is not None:
            metrics.grant_lapsed(unfit)
            log.warning("grant_lapsed", grant_id=grant.id, run_id=run.id, why=unfit)
            continue
        use = rt.grants.use(
            grant,
            request,
            policy_version=rt.policy.version,
            tool_digest=tool.contract_digest,
            ttl=rt.settings.approval_ttl,
        )
        if use.why == "asked":
            return None
        if use.request is None:
            metrics.grant_lapsed(use.why)
            log.info("grant_lapsed", grant_id=grant.id, run_id=run.id, why=use.why)
            continue
        if use.why == "ok":
            metrics.grant_covered()
            audit.log_decision(use.request, "grant")
            rt.events.append(
                run.id,
                EventKind.APPROVAL_COVERED,
                approval_id=use.request.id,
                call_id=call.id,
                tool=call.name,
                args=call.args,
                grant_id=grant.id,
                by=grant.grantor,
                scope=grant.scope,
                expires_at=grant.expires_at,
            )
        return use.request
    return None


def grantor_unfit(rt: Runtime, grant: Grant, request: ApprovalRequest) -> str | None:
    """Why the grant's grantor may not make this grant now, or None. A grant approves in its
    grantor's name, so it covers a call only while they could approve that call themselves:
    their roles as they are now (someone who leaves the approvers' Slack user group stops
    approving through the grants they made; a policy change ends every grant anyway). Not
    used, not revoked: people are asked instead ("grantor_unconfirmed" when Slack cannot
    say, failing closed as a run's own steps do)."""
    # A grantor from another organization than the requester's is held to the rule for
    # external people: an approver role by name (stricter, never looser).
    external = bool(grant.grantor_team) and grant.grantor_team != grant.team_id
    grantor = Requester(
        user_id=grant.grantor, team_id=grant.grantor_team, roles=[EXTERNAL] if external else []
    )
    access = Access.of(rt)
    try:
        roles = (
            rt.roles(grantor)
            if rt.roles is not None
            else access.roles(grant.grantor, external=external)
        )
    except RolesUnavailable:
        return "grantor_unconfirmed"
    if not access.may_grant(request, grant.scope, grant.grantor, roles):
        return "grantor_roles"
    return None
