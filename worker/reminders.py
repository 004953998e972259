"""Reminders and escalation for a pending approval, scheduled as its expiry is: RQ jobs
enqueued for later (`Queue.enqueue_in`), moved to the queue by RQ's scheduler that every
worker's sweeper runs. A job that finds the request decided does nothing.

- `remind_after` (policy, per tool): the approvers get a DM with a link to the card; 0
  tells them as soon as the card is posted.
- `escalate_to` after `escalate_after`: the request is marked escalated, so those roles may
  decide too (`Policy.may_decide(escalated=True)`), and their members get the DM. Before
  that wait they may not. Expiry is unchanged: nobody deciding is a denial.
"""

from __future__ import annotations

from datetime import timedelta

import structlog

from approvals import ApprovalRequest
from worker import runtime
from worker.events import EventKind

log = structlog.get_logger(__name__)


def schedule(rt: runtime.Runtime, request: ApprovalRequest) -> None:
    try:
        rule = rt.policy.rule(request.tool)
    except KeyError:
        return
    ttl = request.expires_at - request.created_at
    escalate_after = rule.escalate_after if rule.escalate_to else None
    for kind, after in (("remind", rule.remind_after), ("escalate", escalate_after)):
        if after is None or after >= ttl:  # past the expiry: nothing left to remind of
            continue
        func, job_id = f"worker.reminders.{kind}_approval", f"{kind}-{request.id}"
        if after <= 0:
            rt.queue.enqueue_call(func, args=(request.id,), job_id=job_id, result_ttl=60)
        else:
            rt.queue.enqueue_in(timedelta(seconds=after), func, request.id, job_id=job_id)


def remind_approval(approval_id: str) -> str:
    return remind(runtime.current(), approval_id)


def escalate_approval(approval_id: str) -> str:
    return escalate(runtime.current(), approval_id)


def remind(rt: runtime.Runtime, approval_id: str) -> str:
    request = rt.approvals.find(approval_id)
    if request is None or request.decided:
        return "decided"
    run = rt.store.find(request.run_id)
    if run is None:
        return "missing"
    rt.events.append(
        run.id, EventKind.APPROVAL_REMINDED, approval_id=approval_id, tool=request.tool
    )
    rt.surface(run).approval_reminder(run, request, escalated=False)
    return "reminded"


def escalate(rt: runtime.Runtime, approval_id: str) -> str:
    request = rt.approvals.find(approval_id)
    if request is None:
        return "missing"
    try:
        to = list(rt.policy.rule(request.tool).escalate_to)
    except KeyError:  # the policy no longer names the tool: nobody to escalate to
        return "no rule"
    if not to or not rt.approvals.escalate(approval_id):
        return "decided" if to else "no rule"
    request = rt.approvals.get(approval_id)
    run = rt.store.find(request.run_id)
    if run is None:
        return "missing"
    rt.events.append(run.id, EventKind.APPROVAL_ESCALATED, approval_id=approval_id, to=to)
    log.info("approval_escalated", approval_id=approval_id, to=to)
    rt.surface(run).approval_reminder(run, request, escalated=True)
    return "escalated"
