"""Reminders and escalation for pending approvals, scheduled as their expiry is: RQ jobs
enqueued for later (`Queue.enqueue_in`), moved to the queue by RQ's scheduler that every
worker's sweeper runs. A job that finds every request it names decided does nothing.

- `remind_after` (policy, per tool): the approvers get a DM with a link to the card; 0
  tells them as soon as the card is posted.
- `escalate_to` after `escalate_after`: the request is marked escalated, so those roles may
  decide too (`Policy.may_decide(escalated=True)`), and their members get the DM. Before
  that wait they may not. Expiry is unchanged: nobody deciding is a denial.

Per card, not per item: the writes one turn asks for share a card, and they share one job
per kind and wait, so a turn of 8 writes sends each approver one DM naming the 8, not 8 DMs.
The surface caps what is left (bot.outbound.reminder_dms: one DM per person per interval).
With `remind_every`, a card still undecided is reminded of again at that interval, up to
`remind_limit` reminders for the card in all (and never past its expiry); each one still
goes through the per-person cap.
"""

from __future__ import annotations

import time
from datetime import timedelta

import structlog

from approvals import ApprovalRequest
from worker import runtime
from worker.events import EventKind
from worker.keys import Keys

log = structlog.get_logger(__name__)


def schedule(rt: runtime.Runtime, requests: list[ApprovalRequest]) -> None:
    """One job per kind and wait for the requests of one card (one turn)."""
    jobs: dict[tuple[str, float], list[str]] = {}
    for request in requests:
        try:
            rule = rt.policy.rule(request.tool)
        except KeyError:
            continue
        ttl = request.expires_at - request.created_at
        escalate_after = rule.escalate_after if rule.escalate_to else None
        for kind, after in (("remind", rule.remind_after), ("escalate", escalate_after)):
            if after is None or after >= ttl:  # past the expiry: nothing left to remind of
                continue
            jobs.setdefault((kind, max(0.0, after)), []).append(request.id)
    for (kind, after), ids in jobs.items():
        func, job_id = f"worker.reminders.{kind}_approvals", f"{kind}-{ids[0]}"
        if after <= 0:
            rt.queue.enqueue_call(func, args=(ids,), job_id=job_id, result_ttl=60)
        else:
            rt.queue.enqueue_in(timedelta(seconds=after), func, ids, job_id=job_id)


def remind_approvals(approval_ids: list[str]) -> str:
    return remind(runtime.current(), approval_ids)


def escalate_approvals(approval_ids: list[str]) -> str:
    return escalate(runtime.current(), approval_ids)


def remind_approval(approval_id: str) -> str:
    """A job scheduled per request before reminders went per card: still runnable."""
    return remind(runtime.current(), [approval_id])


def escalate_approval(approval_id: str) -> str:
    return escalate(runtime.current(), [approval_id])


def remind(rt: runtime.Runtime, approval_ids: list[str]) -> str:
    found = [rt.approvals.find(approval_id) for approval_id in approval_ids]
    pending = [r for r in found if r is not None and not r.decided]
    if not pending:
        return "decided"
    run = rt.store.find(pending[0].run_id)
    if run is None:
        return "missing"
    for request in pending:
        rt.events.append(
            run.id, EventKind.APPROVAL_REMINDED, approval_id=request.id, tool=request.tool
        )
    rt.surface(run).approval_reminders(run, pending, escalated=False)
    repeat(rt, approval_ids, pending)
    return "reminded"


def repeat(rt: runtime.Runtime, approval_ids: list[str], pending: list[ApprovalRequest]) -> None:
    """`remind_every`: schedule the card's next reminder, until it has had `remind_limit`
    in all or the next would come after its expiry."""
    try:
        rule = rt.policy.rule(pending[0].tool)
    except KeyError:
        return
    if rule.remind_every is None:
        return
    key = Keys(rt.settings.namespace).reminders_sent(approval_ids[0])
    pipe = rt.redis.pipeline(transaction=True)
    pipe.incr(key)
    pipe.expire(key, int(rt.settings.approval_ttl) + 3600)
    sent = int(pipe.execute()[0])
    if sent >= rule.remind_limit or time.time() + rule.remind_every >= min(
        r.expires_at for r in pending
    ):
        return
    rt.queue.enqueue_in(
        timedelta(seconds=rule.remind_every),
        "worker.reminders.remind_approvals",
        approval_ids,
        job_id=f"remind-{approval_ids[0]}-{sent}",
    )


def escalate(rt: runtime.Runtime, approval_ids: list[str]) -> str:
    escalated: list[ApprovalRequest] = []
    for approval_id in approval_ids:
        request = rt.approvals.find(approval_id)
        if request is None:
            continue
        try:
            to = list(rt.policy.rule(request.tool).escalate_to)
        except KeyError:  # the policy no longer names the tool: nobody to escalate to
            continue
        if not to or not rt.approvals.escalate(approval_id):
            continue
        request = rt.approvals.get(approval_id)
        rt.events.append(
            request.run_id, EventKind.APPROVAL_ESCALATED, approval_id=approval_id, to=to
        )
        log.info("approval_escalated", approval_id=approval_id, to=to)
        escalated.append(request)
    if not escalated:
        return "decided"
    run = rt.store.find(escalated[0].run_id)
    if run is None:
        return "missing"
    rt.surface(run).approval_reminders(run, escalated, escalated=True)
    return "escalated"
