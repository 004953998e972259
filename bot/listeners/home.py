"""App Home: everyone sees their own runs, what waits for their decision, the standing
grants that concern them and their connections (where per-user connections are set up);
admins also see everyone's recent runs, all pending approvals, failures and today's
spend."""

from __future__ import annotations

import calendar
import time
from typing import Any

from bot.render.connections import home_connections
from bot.render.grants import home_grants
from bot.render.views import home_view
from worker.run import RunStatus
from worker.runtime import Runtime
from worker.service import Access, approvals, connections, grants, runs


def build_home(
    rt: Runtime, user_id: str, roles: frozenset[str], *, team: str = "", page: int = 0
) -> dict[str, Any]:
    """`page`: of the requests waiting for this person; `team`: theirs (connections are per
    team and person)."""
    mine = runs.recent(rt, user_id=user_id, limit=15)
    waiting = approvals.pending_for(rt, user_id, roles)
    one_per_tool = {r.tool: r for r in waiting}  # a tool is high-risk or not: ask once each
    high_risk = frozenset(t for t, r in one_per_tool.items() if approvals.facts(rt, r).high_risk)
    allowed = allowed_section(rt, user_id)
    connected = connections_section(rt, team, user_id)
    if not Access.of(rt).may_administer(roles):
        return home_view(
            mine=mine,
            waiting=waiting,
            admin=False,
            high_risk=high_risk,
            page=page,
            allowed=allowed,
            connections=connected,
        )
    spend = runs.spend_since(rt, start_of_day())
    return home_view(
        mine=mine,
        waiting=waiting,
        admin=True,
        high_risk=high_risk,
        recent=runs.recent(rt, limit=15),
        pending=approvals.pending(rt, limit=50),
        failures=runs.recent(rt, status=RunStatus.FAILED, limit=5),
        spend=(spend.cost, spend.runs, spend.tokens),
        page=page,
        allowed=allowed,
        connections=connected,
    )


def allowed_section(rt: Runtime, user_id: str) -> list[dict[str, Any]]:
    """App Home's "Allowed for you": the grants covering this person's calls or made by them."""
    found = grants.allowed_for(rt, user_id)
    return home_grants(found, frozenset(g.id for g in found if grants.in_force(rt, g)))


def connections_section(rt: Runtime, team: str, user_id: str) -> list[dict[str, Any]]:
    """App Home's "Your connections": every provider the deployment knows, with this
    person's state (nothing when connections are not set up)."""
    names = connections.providers(rt)
    if not names:
        return []
    mine = {c.provider: c for c in connections.listing(rt, team, user_id)}
    return home_connections([(n, connections.label(rt, n), mine.get(n)) for n in names])


def start_of_day(now: float | None = None) -> float:
    """Midnight UTC today."""
    day = time.gmtime(time.time() if now is None else now)
    return float(calendar.timegm((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0)))
