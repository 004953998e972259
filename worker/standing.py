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
    grantors = Grantors(rt)
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
        # revoked, or made under another policy or tool version: `use` says so, below, for
        # certain (no clock in it); else the grantor must still be able to approve the call
        settled = grant.revoked or (grant.policy_version, grant.tool_digest) != (
            rt.policy.version,
            tool.contract_digest,
        )
        unfit = None if settled else grantors.unfit(grant, request)
        if unfit is not None:
            metrics.grant_lapsed(unfit)
            log.warning("grant_lapsed", grant_id=grant.id, run_id=run.id, why=unfit)
            if unfit == UNCONFIRMED:  # nor will the next grant's be: ask people
                return None
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


UNCONFIRMED = "grantor_unconfirmed"


class Grantors:
    """Whether a grant's grantor could approve a call now, their roles read once per `cover`.

    A grant approves in its grantor's name, so it covers a call only while they could approve
    that call themselves: their roles as they are now (someone who leaves the approvers'
    Slack user group stops approving through the grants they made; a policy change ends
    every grant anyway). Such a grant is not used, not revoked: people are asked instead,
    and also when Slack cannot say (UNCONFIRMED), failing closed as a run's own steps do."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.access = Access.of(rt)
        self._roles: dict[tuple[str, str, bool], frozenset[str]] = {}

    def unfit(self, grant: Grant, request: ApprovalRequest) -> str | None:
        """Why `grant`'s grantor may not make it for `request` now, or None."""
        key = (grant.grantor, grant.grantor_team, grant.grantor_external)
        if key not in self._roles:
            try:
                self._roles[key] = self._read(grant)
            except RolesUnavailable:
                return UNCONFIRMED
        if not self.access.may_grant(request, grant.scope, grant.grantor, self._roles[key]):
            return "grantor_roles"
        return None

    def _read(self, grant: Grant) -> frozenset[str]:
        external = grant.grantor_external  # as when they made it (Slack's signed payload)
        if self.rt.roles is None:  # no Slack: the policy names people by id
            return self.access.roles(grant.grantor, external=external)
        grantor = Requester(
            user_id=grant.grantor,
            team_id=grant.grantor_team,
            roles=[EXTERNAL] if external else [],
        )
        return self.rt.roles(grantor)
