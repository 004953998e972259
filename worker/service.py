"""What surfaces (Slack, the console, the CLI) ask of the runtime."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import structlog

from approvals import ApprovalNotFound, ApprovalRequest, ApprovalStatus
from approvals.edits import EditRefused, changes, check_edit
from tools.execute import valid_unicode
from worker import audit, metrics, profiles
from worker.events import EventKind
from worker.limits import LimitExceeded
from worker.roles import RolesUnavailable
from worker.run import Requester, Run, RunStatus, new_run_id
from worker.runtime import Runtime

log = structlog.get_logger(__name__)

MAX_QUESTION_CHARS = 4000
MAX_HISTORY_MESSAGES = 20
MAX_HISTORY_CHARS = 16_000  # a reply carries at most this much of the thread: bounded storage
MAX_THREAD_HOPS = 20  # how far back a reply looks for the asker's own last run in the thread

# a surface's own answer to "may this person decide this request": (request, decider, roles)
Decides = Callable[[ApprovalRequest, str, frozenset[str]], bool]


class QuestionRejected(ValueError):
    pass


def submit(
    rt: Runtime,
    question: str,
    requester: Requester,
    *,
    origin: dict[str, str] | None = None,
    parent: Run | None = None,
    profile: str | None = None,
) -> Run:
    """Create a run and queue it. `parent` continues that run's conversation (a thread reply).
    The run gets the profile of the requester's channel, or the one named by `profile`."""
    text = valid_unicode(question).strip()
    if not text:
        raise QuestionRejected("The question is empty.")
    if len(text) > MAX_QUESTION_CHARS:
        raise QuestionRejected(
            f"The question is {len(text)} characters long; the limit is {MAX_QUESTION_CHARS}."
        )
    try:
        rt.limits.check(requester.user_id)
    except LimitExceeded as exc:
        log.info("question_limited", user=requester.user_id, why=str(exc))
        raise QuestionRejected(str(exc)) from exc
    history = conversation(rt, parent, requester.user_id) if parent is not None else []
    agent = (
        profiles.named(rt.policy, profile)
        if profile is not None
        else rt.policy.profile_for(requester.channel_id)
    )
    run = Run(
        id=new_run_id(),
        question=text,
        requester=requester,
        model=rt.model.model if rt.model else "",
        messages=[*history, {"role": "user", "content": text}],
        budgets=rt.settings.budgets.model_copy(),
        origin=dict(origin or {}),
        parent_id=parent.id if parent else None,
        policy_version=rt.policy.version,
    )
    profiles.start(rt, run, agent)
    rt.store.create(run, wake=False)
    rt.events.append(
        run.id,
        EventKind.RUN_CREATED,
        user=requester.user_id,
        channel=requester.channel_id,
        roles=requester.roles,
        question=text,
        parent=run.parent_id,
        profile=run.profile.name if run.profile else None,
    )
    if rt.limits.admit(requester.user_id, run.id):
        rt.store.wake(run.id)
        rt.enqueue_advance(run.id)
    else:
        ahead = rt.settings.limits.runs_in_flight
        rt.events.append(run.id, EventKind.WAITING_IN_LINE, in_flight=ahead)
        rt.surface(run).progress(
            run,
            f"Waiting: you have {ahead} questions in progress; this one starts when one of "
            "them is done",
        )
    return run


def conversation(rt: Runtime, parent: Run, asker: str) -> list[dict[str, str]]:
    """The asker's own questions and the answers they got earlier in this thread, without
    the tool chatter. Other people's messages in the thread are left out: they would reach
    the model as the asker's own words and could steer a run that has the asker's
    permissions. Each run's history is built this way, so it holds one person's turns."""
    run: Run | None = parent
    for _ in range(MAX_THREAD_HOPS):
        if run is None or run.requester.user_id == asker:
            break
        run = rt.store.find(run.parent_id) if run.parent_id else None
    if run is None or run.requester.user_id != asker:
        return []
    turns = [
        {"role": m["role"], "content": m["content"]}
        for m in run.messages
        if m.get("role") in ("user", "assistant") and not m.get("tool_calls") and m.get("content")
    ]
    kept: list[dict[str, str]] = []
    size = 0
    for turn in reversed(turns[-MAX_HISTORY_MESSAGES:]):  # the newest turns matter most
        size += len(turn["content"])
        if size > MAX_HISTORY_CHARS:
            break
        kept.append(turn)
    return kept[::-1]


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
    decides: Decides | None = None,
    surface: str = "unknown",
) -> DecisionOutcome:
    """Approve or reject. Checks the decider against the policy (or `decides`, a surface's
    own check, which holds the policy's and may add to it); of concurrent decisions
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
    allowed = (
        may_decide(rt, request, decider_id, decider_roles)
        if decides is None
        else decides(request, decider_id, decider_roles)
    )
    if not allowed:
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
    rt.cancel_expiry(approval_id)
    metrics.approval_decided(decision.request)
    audit.log_decision(decision.request, surface)
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
    return DecisionOutcome(DecisionResult.DECIDED, decision.request, approvers)


# -- who may do what: every surface asks here (Slack adds its rule for external people in
# bot.identity, through bot.listeners.Bot)


def may_decide(
    rt: Runtime, request: ApprovalRequest, decider_id: str, decider_roles: frozenset[str]
) -> bool:
    """The policy's approvers, and once the request is escalated its `escalate_to` roles."""
    return rt.policy.may_decide(
        request.tool, request.requester, decider_id, decider_roles, escalated=request.escalated
    )


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


class CancelResult(StrEnum):
    CANCELLING = "cancelling"
    NOT_ALLOWED = "not_allowed"
    ALREADY_ENDED = "already_ended"
    NOT_FOUND = "not_found"


def cancel(rt: Runtime, run_id: str, *, by: str, roles: frozenset[str]) -> CancelResult:
    """The requester or an admin may cancel; the run ends `partial` at its next step."""
    run = rt.store.find(run_id)
    if run is None:
        return CancelResult.NOT_FOUND
    if not may_cancel(rt, run, by, roles):
        return CancelResult.NOT_ALLOWED
    return request_cancel(rt, run, by=by)


def request_cancel(rt: Runtime, run: Run, *, by: str) -> CancelResult:
    """Cancel without a permission check, for a surface acting on its own authority (the
    Slack app was uninstalled from the run's workspace); `by` is recorded as who asked."""
    if run.status.terminal:
        return CancelResult.ALREADY_ENDED
    rt.store.request_cancel(run.id, by)
    rt.events.append(run.id, EventKind.CANCEL_REQUESTED, by=by)
    rt.enqueue_advance(run.id)
    return CancelResult.CANCELLING


def may_inspect(rt: Runtime, run: Run, user_id: str, roles: frozenset[str]) -> bool:
    """See a run's trajectory: its requester and admins."""
    return run.requester.user_id == user_id or is_admin(rt, roles)


def may_cancel(rt: Runtime, run: Run, user_id: str, roles: frozenset[str]) -> bool:
    """Cancel a run: its requester and admins."""
    return user_id == run.requester.user_id or is_admin(rt, roles)


def may_see_args(
    rt: Runtime,
    request: ApprovalRequest,
    user_id: str,
    roles: frozenset[str],
    *,
    decides: Decides | None = None,
) -> bool:
    """See a request's full arguments: its requester, whoever may decide it (`may_decide`,
    or a surface's own `decides`), and admins."""
    if user_id == request.requester:
        return True
    if decides(request, user_id, roles) if decides else may_decide(rt, request, user_id, roles):
        return True
    return is_admin(rt, roles)


def is_admin(rt: Runtime, roles: frozenset[str]) -> bool:
    """Admins see every run, cancel any, and save runs to the task library."""
    return rt.policy.is_admin(roles)


PENDING_SCAN = 5000  # pending requests looked at for one person's list, at most


def pending_for(rt: Runtime, user_id: str, roles: frozenset[str]) -> list[ApprovalRequest]:
    """Approval requests this person may decide now, the soonest to expire first: all of
    them (up to PENDING_SCAN pending in all), so a burst of someone else's requests cannot
    push one out of sight."""
    return [
        r for r in rt.approvals.pending(limit=PENDING_SCAN) if may_decide(rt, r, user_id, roles)
    ]


__all__ = [
    "CancelResult",
    "DecisionOutcome",
    "DecisionResult",
    "QuestionRejected",
    "RunStatus",
    "cancel",
    "decide",
    "is_admin",
    "may_cancel",
    "may_decide",
    "may_inspect",
    "may_see_args",
    "pending_for",
    "request_cancel",
    "submit",
]
