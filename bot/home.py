"""App Home: everyone sees their own runs and what waits for their decision; admins also
see everyone's recent runs, all pending approvals, failures and today's spend."""

from __future__ import annotations

import calendar
import time
from typing import Any

from bot.views import home_view
from worker import service
from worker.run import Run, RunSchemaError, RunStatus
from worker.runtime import Runtime

SPEND_SCAN = 5000  # runs created today that the spend figure looks at, at most
BATCH = 500


def build_home(rt: Runtime, user_id: str, roles: frozenset[str]) -> dict[str, Any]:
    admin = rt.policy.is_admin(roles)
    mine = rt.store.list(user_id=user_id, limit=15)
    waiting = service.pending_for(rt, user_id, roles)
    if not admin:
        return home_view(mine=mine, waiting=waiting, admin=False)
    return home_view(
        mine=mine,
        waiting=waiting,
        admin=True,
        recent=rt.store.list(limit=15),
        pending=rt.approvals.pending(limit=50),
        failures=rt.store.list(status=RunStatus.FAILED, limit=5),
        spend=spend_since(rt, start_of_day()),
    )


def start_of_day(now: float | None = None) -> float:
    """Midnight UTC today."""
    day = time.gmtime(time.time() if now is None else now)
    return float(calendar.timegm((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0)))


def spend_since(rt: Runtime, since: float) -> tuple[float, int, int]:
    """(cost, runs, tokens) of the runs created since `since`."""
    ids = rt.redis.zrangebyscore(rt.store.all_key, since, "+inf", start=0, num=SPEND_SCAN)
    cost, count, tokens = 0.0, 0, 0
    for start in range(0, len(ids), BATCH):
        keys = [rt.store.key(i.decode()) for i in ids[start : start + BATCH]]
        for raw in rt.redis.mget(keys):
            if raw is None:
                continue
            try:
                run = Run.from_json(raw)
            except RunSchemaError:  # written by another version: not counted
                continue
            cost += run.usage.cost
            tokens += run.usage.tokens
            count += 1
    return cost, count, tokens
