"""`Access.may_decide` asked about a tool by name, as the policy tests ask it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tools.policy import Policy
from worker.service import Access


@dataclass(frozen=True)
class Asked:
    tool: str
    requester: str
    escalated: bool = False


def lets_decide(
    policy: Policy,
    tool: str,
    requester: str,
    decider: str,
    roles: Iterable[str],
    *,
    escalated: bool = False,
) -> bool:
    return Access(policy).may_decide(Asked(tool, requester, escalated), decider, frozenset(roles))
