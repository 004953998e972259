"""What is waiting and who is working, as `switchboard status` reports it: the queue's depth,
runs in flight, approvals pending and the oldest, and the worker fleet by heartbeat. One
round trip to Redis, whatever the size of the deployment."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from worker.fleet import Fleet, ask_fleet, fleet_of
from worker.keys import Keys
from worker.run import RunStatus


@dataclass(frozen=True)
class Backlog:
    queue_depth: int  # jobs waiting in the RQ queue
    runs_running: int
    runs_queued: int
    approvals_pending: int
    oldest_approval_seconds: float  # 0.0 when none is pending
    fleet: Fleet


def backlog(
    conn: redis.Redis, *, queue: str, namespace: str, approval_ttl: float, now: float | None = None
) -> Backlog:
    """Raises redis.RedisError when Redis does not answer."""
    keys = Keys(namespace)
    pipe = conn.pipeline(transaction=False)
    pipe.llen(f"rq:queue:{queue}")
    pipe.zcard(keys.status(RunStatus.RUNNING))
    pipe.zcard(keys.status(RunStatus.QUEUED))
    pipe.zcard(keys.pending)
    pipe.zrange(keys.pending, 0, 0, withscores=True)
    ask_fleet(conn, queue, pipe)
    depth, running, queued, pending, first, workers = pipe.execute()
    oldest = 0.0
    if first:  # the pending index is scored by expiry; every request gets the same TTL
        created = first[0][1] - approval_ttl
        oldest = round(max(0.0, (time.time() if now is None else now) - created), 1)
    return Backlog(
        queue_depth=depth,
        runs_running=running,
        runs_queued=queued,
        approvals_pending=pending,
        oldest_approval_seconds=oldest,
        fleet=fleet_of(workers),
    )
