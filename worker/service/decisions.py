"""Deciding: approve or reject one request (with edits, or with instructions to the
model), every item of a batch card, and the checks an Edit submission needs first.

The path of one decision: a surface's listener calls `decide` here; `Access.may_decide`
(worker/access.py) says whether this person may; the approvals store
(approvals/store.py) makes the pending → approved|rejected change atomically, so of
concurrent decisions exactly one wins; the run is queued to go on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import structlog

from approvals import ApprovalNotFound, ApprovalRequest, ApprovalStatus
from approvals.edits import EditRefused, changes, check_edit
from worker import audit, metrics, tracing
from worker.access import Access
from worker.events import EventKind
from worker.roles import RolesUnavailable
from worker.runtime import Runtime

log = structlog.get_logger(__name__)


class DecisionResult(StrEnum):
    DECIDED = "decided"
    NOT_ALLOWED = "not_allowed"
    ALREADY_DECIDED = "already_decided"
    NOT_FOUND = "not_found"
    INVALID_EDIT = "invalid_edit"


@dataclass(frozen=True)
class DecisionOutcome:
    result: DecisionResult
    request: ApprovalRequest | None = None
    approvers: str = ""  # who may decide, in words (for a refusal)
    refused: EditRefused | None = None  # why edited arguments may not be approved


def decide(
    rt: Runtime,
    approval_id: str,
    *,
    decider_id: str,
    decider_roles: frozenset[str],
    approve: bool,
    reason: str = "",
    edited_args: dict[str, Any] | None = None,
    instructions: str = "",
    surface: str = "unknown",
) -> DecisionOutcome:
    """Approve or reject, if `Access.may_decide` lets this person; of concurrent decisions
    exactly one wins, the others learn who decided. `edited_args` approve with edits (they
    are checked as the model's arguments were, for the requester); `instructions` go with
    a rejection, to the model, as the approver's words. `surface` (slack, console, cli...)
    names where the decision was made, for the audit log line."""
    try:
        request = rt.approvals.get(approval_id)
    except ApprovalNotFound:
        return DecisionOutcome(DecisionResult.NOT_FOUND)
    approvers = rt.policy.approvers_text(request.tool)
    if request.decided:
        return DecisionOutcome(DecisionResult.ALREADY_DECIDED, request, approvers)
    if not Access.of(rt).may_decide(request, decider_id, decider_roles):
        rt.events.append(
            request.run_id, EventKind.DECISION_REFUSED, approval_id=approval_id, by=decider_id
        )
        return DecisionOutcome(DecisionResult.NOT_ALLOWED, request, approvers)
    edits = []
    if approve and edited_args is not None:
        try:
            edited_args = checked_edit(rt, request, edited_args)
        except EditRefused as exc:
            return DecisionOutcome(DecisionResult.INVALID_EDIT, request, approvers, exc)
        edits = changes(request.args, edited_args)
    status = ApprovalStatus.APPROVED if approve else ApprovalStatus.REJECTED
    decision = rt.approvals.decide(
        approval_id,
        status,
        decider_id,
        reason.strip(),
        edited_args=edited_args if edits else None,
        instructions="" if approve else instructions.strip(),
    )
    if not decision.won:
        return DecisionOutcome(DecisionResult.ALREADY_DECIDED, decision.request, approvers)
    metrics.approval_decided(decision.request)
    audit.log_decision(decision.request, surface)
    tracing.approval_decided(decision.request, lambda: rt.trace_of(request.run_id))
    rt.events.append(
        request.run_id,
        EventKind.APPROVAL_DECIDED,
        approval_id=approval_id,
        tool=request.tool,
        status=decision.request.status.value,
        by=decider_id,
        reason=decision.request.reason,
        edited=bool(edits),
        changes=[c.to_json() for c in edits],
        instructions=decision.request.instructions,
    )
    rt.enqueue_advance(request.run_id)
    # After the run is on its way: dropping the expiry job takes RQ eight round trips (of
    # the click's 16 before the tool could start), and a decided request's expiry job does
    # nothing should it stay (a process that dies here leaves it to do nothing, in a day).
    rt.cancel_expiry(approval_id)
    return DecisionOutcome(DecisionResult.DECIDED, decision.request, approvers)


@dataclass(frozen=True)
class BatchOutcome:
    found: bool  # False: no such batch (or its requests are gone)
    decided: list[ApprovalRequest] = field(default_factory=list)
    refused: list[ApprovalRequest] = field(default_factory=list)  # not this person's to decide
    approvers: str = ""  # who may decide the first refused one, in words


def decide_batch(
    rt: Runtime,
    batch_id: str,
    *,
    decider_id: str,
    decider_roles: frozenset[str],
    approve: bool,
    reason: str = "",
    instructions: str = "",
    surface: str = "unknown",
) -> BatchOutcome:
    """Approve all / Reject all: every item still pending that this person may decide,
    each decided (and checked) on its own; a rejection's `reason` and `instructions` go
    with each item."""
    requests = rt.approvals.batch(batch_id)
    if not requests:
        return BatchOutcome(found=False)
    access = Access.of(rt)
    decided, refused = [], []
    for request in requests:
        if request.decided:
            continue
        if not access.may_decide(request, decider_id, decider_roles):
            refused.append(request)
            continue
        outcome = decide(
            rt,
            request.id,
            decider_id=decider_id,
            decider_roles=decider_roles,
            approve=approve,
            reason=reason,
            instructions=instructions,
            surface=surface,
        )
        if outcome.result == DecisionResult.DECIDED and outcome.request is not None:
            decided.append(outcome.request)
    log.info("batch_decided", batch=batch_id, user=decider_id, decided=len(decided))
    approvers = rt.policy.approvers_text(refused[0].tool) if refused else ""
    return BatchOutcome(found=True, decided=decided, refused=refused, approvers=approvers)


def checked_edit(rt: Runtime, request: ApprovalRequest, args: dict[str, Any]) -> dict[str, Any]:
    """Edited arguments checked as the model's were, for the requester; EditRefused if not."""
    tool = rt.registry.get(request.tool)
    run = rt.store.find(request.run_id)
    if tool is None or run is None:
        raise EditRefused(f"{request.tool} can no longer be run")
    try:  # the requester's roles as they are now, as the worker will check them
        roles = rt.roles(run.requester) if rt.roles is not None else frozenset(run.requester.roles)
    except RolesUnavailable:
        raise EditRefused(
            "Slack could not confirm the requester's user groups; try again"
        ) from None
    return check_edit(tool, rt.policy, roles, args)


class EditRefusal(StrEnum):
    ALREADY_DECIDED = "already_decided"
    STALE = "stale"  # the request changed since the Edit form was opened
    NOT_ALLOWED = "not_allowed"


def edit_refusal(
    rt: Runtime, request: ApprovalRequest, user: str, roles: frozenset[str], binding: object
) -> EditRefusal | None:
    """Why an Edit form opened for `binding` may not be submitted by this person now."""
    if request.decided:
        return EditRefusal.ALREADY_DECIDED
    if binding != request.binding:
        return EditRefusal.STALE
    if not Access.of(rt).may_decide(request, user, roles):
        return EditRefusal.NOT_ALLOWED
    return None


def record_edit_refused(rt: Runtime, request: ApprovalRequest, by: str, **why: Any) -> None:
    """An Edit submission that was refused, on the run's record (who, and why)."""
    rt.events.append(request.run_id, EventKind.EDIT_REFUSED, approval_id=request.id, by=by, **why)
