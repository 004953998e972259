"""Approval requests as the surfaces show them: one request, those waiting for a person,
a batch card's items, where cards were posted, and what a card says about its tool."""

from __future__ import annotations

from dataclasses import dataclass

from approvals import ApprovalRequest
from tools.policy import REQUESTER
from tools.registry import Tool
from worker.access import Access
from worker.runtime import Runtime

PENDING_SCAN = 5000  # pending requests looked at for one person's list, at most


def find(rt: Runtime, approval_id: str) -> ApprovalRequest | None:
    return rt.approvals.find(approval_id)


def pending_for(rt: Runtime, user_id: str, roles: frozenset[str]) -> list[ApprovalRequest]:
    """Approval requests this person may decide now, the soonest to expire first: all of
    them (up to PENDING_SCAN pending in all), so a burst of someone else's requests cannot
    push one out of sight."""
    access = Access.of(rt)
    return [
        r for r in rt.approvals.pending(limit=PENDING_SCAN) if access.may_decide(r, user_id, roles)
    ]


def pending(rt: Runtime, limit: int = 200) -> list[ApprovalRequest]:
    """Every pending request, the soonest to expire first: for admins and the operator."""
    return rt.approvals.pending(limit=limit)


def batch(rt: Runtime, batch_id: str) -> list[ApprovalRequest]:
    return rt.approvals.batch(batch_id)


def create_batch(rt: Runtime, requests: list[ApprovalRequest]) -> str:
    """One card for several requests of a turn: its id, which its buttons carry."""
    return rt.approvals.create_batch(requests)


def add_card(rt: Runtime, approval_id: str, card: dict[str, str]) -> bool:
    """Where a surface showed the request, so that every card of it can be updated later.
    False when the request was decided before this card was recorded: the caller redraws it
    (the card is owed the outcome until then: the sweeper redraws it otherwise)."""
    return rt.approvals.add_card(approval_id, card)


def card_shown(rt: Runtime, approval_id: str, drawn: int | None = None) -> None:
    """Every card of a decided request shows its outcome: nothing is owed to it any more
    (the sweeper redraws the cards of decisions nobody got to, worker/sweeper.py). With
    `drawn`, how many of its recorded cards the caller redrew: one recorded since stays owed."""
    rt.approvals.card_shown(approval_id, drawn)


def approvals_channel(rt: Runtime) -> str | None:
    """The policy's channel where every card is posted too, if any."""
    return rt.policy.approvals_channel


@dataclass(frozen=True)
class Facts:
    """What a card says about a request's tool, from the policy and the registry now."""

    tool: Tool | None  # None: the tool is gone since it was asked for
    approvers: str  # who may decide, in words
    escalated_to: tuple[str, ...]  # the escalation roles, once the request is escalated
    high_risk: bool  # Approve asks to confirm; a tool that is gone counts as high-risk
    grants: tuple[str, ...] = ()  # standing grants an approver may make (none: not offered)

    @property
    def description(self) -> str:
        return self.tool.description if self.tool is not None else ""


def facts(rt: Runtime, request: ApprovalRequest) -> Facts:
    try:
        rule = rt.policy.rule(request.tool)
    except KeyError:
        rule = None
    return Facts(
        tool=rt.registry.get(request.tool),
        approvers=rt.policy.approvers_text(request.tool),
        escalated_to=tuple(rule.escalate_to) if rule is not None and request.escalated else (),
        high_risk=rule.high_risk if rule is not None else True,
        grants=Access.of(rt).grant_scopes(request) if rt.registry.get(request.tool) else (),
    )


@dataclass(frozen=True)
class Deciders:
    """Whom the policy names to decide a request: to remind, or to escalate to."""

    users: frozenset[str]  # people named by id (the requester, where self-approval)
    groups: frozenset[str]  # `@usergroup` handles: their members, as the surface knows them
    not_requester: bool  # the requester may not decide their own call: leave them out


def deciders(rt: Runtime, request: ApprovalRequest, *, escalated: bool) -> Deciders:
    """The members of the escalation roles when escalating, else of the approver roles."""
    try:
        rule = rt.policy.rule(request.tool)
    except KeyError:
        return Deciders(frozenset(), frozenset(), True)
    users: set[str] = set()
    groups: set[str] = set()
    for role in rule.escalate_to if escalated else rule.approvers:
        if role == REQUESTER:
            if rule.self_approval:
                users.add(request.requester)
            continue
        for member in rt.policy.roles.get(role, frozenset()):
            (groups if member.startswith("@") else users).add(member)
    return Deciders(frozenset(users), frozenset(groups), not rule.self_approval)
