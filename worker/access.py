"""Who may do what: every "may this person X" of every surface and of the loop, defined once.

The policy file says who holds which role and which roles a tool names (`allow`,
`approvers`, `escalate_to`, `admins`); this module turns that into answers. One rule is
Slack's own and lives here too: a person from another organization (Slack Connect) holds
the role `external` (tools.policy.EXTERNAL), which only Slack's identity lookup ever
gives. Such a person may ask only where some tool's `allow` names `external`, and may
decide only with an approver role they hold by name: `everyone` and `requester`
(self-approval) are not enough for them. On every other surface nobody is external, so
the rule never applies there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from tools.policy import EVERYONE, EXTERNAL, REQUESTER, Policy, held_roles
from worker.run import Run
from worker.runtime import Runtime


class Decidable(Protocol):
    """What deciding depends on: an approval request (approvals.ApprovalRequest)."""

    @property
    def tool(self) -> str: ...
    @property
    def requester(self) -> str: ...
    @property
    def escalated(self) -> bool: ...


class Granted(Protocol):
    """What revoking depends on: a standing grant (approvals.grants.Grant)."""

    @property
    def grantor(self) -> str: ...
    @property
    def requester(self) -> str: ...


@dataclass(frozen=True)
class _Later:
    """A later call like `request`, as a standing grant would cover it: not escalated."""

    tool: str
    requester: str
    escalated: bool = False


@dataclass(frozen=True)
class Access:
    policy: Policy

    @classmethod
    def of(cls, rt: Runtime) -> Access:
        """The answers of the policy `rt` holds now."""
        return cls(rt.policy)

    @property
    def source(self) -> str:
        """Where the rules come from (the policy file), for people."""
        return str(self.policy.source)

    def roles(
        self, user_id: str, groups: Iterable[str] = (), *, external: bool = False
    ) -> frozenset[str]:
        """The roles a person holds: `everyone`, those naming their id, those naming one of
        their user groups (`@handle`). An external person holds `external` and the roles
        naming their id, nothing more."""
        if external:
            return frozenset({EXTERNAL, *(self.policy.roles_for(user_id) - {EVERYONE})})
        return self.policy.roles_for(user_id, groups)

    @property
    def every_role(self) -> frozenset[str]:
        """Every role the policy defines, and `everyone` (eval's stand-in approver)."""
        return frozenset(self.policy.roles) | {EVERYONE}

    @property
    def names_groups(self) -> bool:
        """Does any role name a user group (so a surface must ask which groups a person
        is in)?"""
        return any(m.startswith("@") for members in self.policy.roles.values() for m in members)

    def may_ask(self, roles: Iterable[str]) -> bool:
        """Start a run. Everyone may, except external people while no tool's `allow`
        names `external`."""
        if EXTERNAL not in frozenset(roles):
            return True
        return any(
            EXTERNAL in self.policy.rule(name).allow for name in self.policy.registry.names()
        )

    def may_decide(self, request: Decidable, user: str, roles: frozenset[str]) -> bool:
        """Approve or reject. Deciding on your own call needs `requester` among the
        approvers and `self_approval`: holding an approver role is not enough. Anyone else
        needs one of the approver roles or, once the request is escalated, one of the
        `escalate_to` roles. An external person needs such a role by name as well."""
        try:
            rule = self.policy.rule(request.tool)
        except KeyError:
            return False
        named = set(rule.approvers) | (set(rule.escalate_to) if request.escalated else set())
        if user == request.requester:
            if not (REQUESTER in rule.approvers and rule.self_approval):
                return False
        elif held_roles(roles).isdisjoint(named - {REQUESTER}):
            return False
        return EXTERNAL not in roles or not (named - {EVERYONE, REQUESTER}).isdisjoint(
            roles - {EVERYONE}
        )

    def grant_scopes(self, request: Decidable) -> tuple[str, ...]:
        """The standing grants the policy lets an approver make with this request (none
        for a high-risk tool: the policy drops them)."""
        try:
            rule = self.policy.rule(request.tool)
        except KeyError:
            return ()
        return () if rule.high_risk else rule.grants

    def may_grant(self, request: Decidable, scope: str, user: str, roles: frozenset[str]) -> bool:
        """Approve and allow similar calls (`scope`: thread, hour or day): a person who may
        decide this request, for a scope the tool's rule offers. A requester who may approve
        their own call may grant for themselves only where the rule says `self_grants`. The
        calls a grant covers are not escalated, so an `escalate_to` role, which decides this
        request once it is escalated, does not let its holder grant."""
        later = _Later(request.tool, request.requester)
        if scope not in self.grant_scopes(request) or not self.may_decide(later, user, roles):
            return False
        return user != request.requester or self.policy.rule(request.tool).self_grants

    def may_revoke(self, grant: Granted, user: str, roles: frozenset[str]) -> bool:
        """End a standing grant: its grantor, the requester it covers, and admins."""
        return user in (grant.grantor, grant.requester) or self.may_administer(roles)

    def may_see_args(self, request: Decidable, user: str, roles: frozenset[str]) -> bool:
        """See a request's full arguments: its requester, whoever may decide it, admins."""
        return (
            user == request.requester
            or self.may_decide(request, user, roles)
            or self.may_administer(roles)
        )

    def may_inspect(self, run: Run, user: str, roles: frozenset[str]) -> bool:
        """See a run's trajectory: its requester and admins."""
        return run.requester.user_id == user or self.may_administer(roles)

    def may_cancel(self, run: Run, user: str, roles: frozenset[str]) -> bool:
        """Cancel a run: its requester and admins."""
        return run.requester.user_id == user or self.may_administer(roles)

    def may_administer(self, roles: Iterable[str]) -> bool:
        """Admins see every run and every pending request, cancel any run, and save runs
        to the task library."""
        return not held_roles(roles).isdisjoint(self.policy.admins)
