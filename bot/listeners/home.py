"""App Home: everyone sees their own runs and what waits for their decision; admins also
see everyone's recent runs, all pending approvals, failures and today's spend."""

from __future__ import annotations

import calendar
import time
from typing import Any

from bot.render.grants import home_grants
from bot.render.views import home_view
from worker.run import RunStatus
from worker.runtime import Runtime
from worker.service import Access, approvals, grants, runs


def build_home(
    rt: Runtime, user_id: str, roles: frozenset[str], *, page: int = 0
) -> dict[str, Any]:
    """`page`: of the requests waiting for this person."""
    mine = runs.recent(rt, user_id=user_id, limit=15)
    waiting = approvals.pending_for(rt, user_id, roles)
    one_per_tool = {r.tool: r for r in waiting}  # a tool is high-risk or not: ask once each
    high_risk = frozenset(t for t, r in one_per_tool.items() if approvals.facts(rt, r).high_risk)
    allowed = allowed_section(rt, user_id)
    if not Access.of(rt).may_administer(roles):
        return home_view(
            mine=mine,
            waiting=waiting,
            admin=False,
            high_risk=high_risk,
            page=page,
            allowed=allowed,
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
    )


def allowed_section(rt: Runtime, user_id: str) -> list[dict[str, Any]]:
    """App Home's "Allowed for you": the grants covering this person's calls or made by them."""
    found = grants.allowed_for(rt, user_id)
    return home_grants(found, frozenset(g.id for g in found if grants.in_force(rt, g)))


def start_of_day(now: float | None = None) -> float:
    """Midnight UTC today."""
    day = time.gmtime(time.time() if now is None else now)
    return float(calendar.timegm((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0)))
