"""The requester's roles, checked again while their run works.

A run records its requester's roles when it starts, but membership changes: someone leaves
the group that lets them call a tool while their write waits for approval. Before every step
the worker asks the runtime's resolver (Slack user groups through the policy, cached with a
bounded staleness; wired by the composition root) for the requester's current roles, records
a change, and authorises with them. When the resolver cannot answer within its bound, the
run stops rather than act on roles it cannot confirm (fail closed).
"""

from __future__ import annotations

from collections.abc import Callable

from worker.run import Requester, Run

# The requester's current roles; raises RolesUnavailable when they cannot be confirmed.
RolesResolver = Callable[[Requester], frozenset[str]]


class RolesUnavailable(Exception):
    """Group membership could not be read and what is cached is older than its bound."""


def recheck(resolver: RolesResolver | None, run: Run) -> tuple[list[str], list[str]] | None:
    """Bring `run.requester.roles` up to date. Returns (before, after) when they changed.
    Raises RolesUnavailable."""
    if resolver is None:
        return None
    current = sorted(resolver(run.requester))
    before = list(run.requester.roles)
    if current == sorted(before):
        return None
    run.requester.roles = current
    return before, current
