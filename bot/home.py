"""App Home: everyone sees their own runs and what waits for their decision; admins also
see everyone's recent runs, all pending approvals, failures and today's spend."""

from __future__ import annotations

import calendar
import time
from typing import Any

from bot.blocks import is_high_risk
from bot.views import home_view
from worker import service
from worker.run import RunStatus
from worker.runtime import Runtime

SPEND_SCAN = 5000  # runs created today that the spend figure looks at, at most
BATCH = 500


def build_home(
    rt: Runtime,
    user_id: str,
    roles: frozenset[str],
    *,
    decides: service.Decides | None = None,
    page: int = 0,
) -> dict[str, Any]:
    """`decides`: who may decide, when the surface knows more than the policy (Slack:
    external people); `service.pending_for` already asked the policy. `page`: of the
    requests waiting for this person."""
    admin = service.is_admin(rt, roles)
    mine = rt.store.recent(user_id=user_id, limit=15)
    waiting = [
        r
        for r in service.pending_for(rt, user_id, roles)
        if decides is None or decides(r, user_id, roles)
    ]
    high_risk = frozenset(r.tool for r in waiting if is_high_risk(rt.policy, r.tool))
    if not admin:
        return home_view(mine=mine, waiting=waiting, admin=False, high_risk=high_risk, page=page)
    return home_view(
        mine=mine,
        waiting=waiting,
        admin=True,
        high_risk=high_risk,
        recent=rt.store.recent(limit=15),
        pending=rt.approvals.pending(limit=50),
        failures=rt.store.recent(status=RunStatus.FAILED, limit=5),
        spend=spend_since(rt, start_of_day()),
        page=page,
    )


def start_of_day(now: float | None = None) -> float:
    """Midnight UTC today."""
    day = time.gmtime(time.time() if now is None else now)
    return float(calendar.timegm((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0)))


def spend_since(rt: Runtime, since: float) -> tuple[float, int, int]:
    """(cost, runs, tokens) of the runs created since `since`."""
    runs = rt.store.created_since(since, limit=SPEND_SCAN)
    return (
        sum(r.usage.cost for r in runs),
        len(runs),
        sum(r.usage.tokens for r in runs),
    )
