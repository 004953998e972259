"""Per-person limits: runs in flight, runs per minute, model cost per day.

Runs in flight are also what keeps the queue fair: one person's burst of questions waits in
their own line (`sb:user:{id}:waiting`) instead of the shared RQ queue, so someone else's
question is not stuck behind thirty of theirs. A run counts as in flight from submission until
it first suspends for a person or ends; the next one in that person's line is then admitted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from approvals import WAKE_LUA
from worker.keys import Keys


@dataclass(frozen=True)
class Limits:
    """0 means no limit."""

    runs_in_flight: int = 0
    runs_per_minute: int = 0
    cost_per_day: float = 0.0


class LimitExceeded(Exception):
    """Said to the person who asked; the question is not queued."""


# KEYS: active zset, waiting list.  ARGV: run id, limit, now, stale cutoff.
# 1: admitted now; 0: waits in the person's line.
_ADMIT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[4])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  return 1
end
redis.call('RPUSH', KEYS[2], ARGV[1])
return 0
"""

# KEYS: active zset, waiting list, due set.  ARGV: run id, limit, now.
# Returns the runs admitted from the line; each is marked due first, so the sweeper queues it
# even if this process stops before it does.
_RELEASE = (
    WAKE_LUA
    + """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('LREM', KEYS[2], 0, ARGV[1])
local admitted = {}
while redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) do
  local next = redis.call('LPOP', KEYS[2])
  if not next then break end
  redis.call('ZADD', KEYS[1], ARGV[3], next)
  wake(KEYS[3], next)
  table.insert(admitted, next)
end
return admitted
"""
)


class PersonLimits:
    def __init__(self, connection: redis.Redis, namespace: str, limits: Limits, stale: float):
        self.redis = connection
        self.ns = namespace
        self.keys = Keys(namespace)
        self.limits = limits
        self.stale = stale  # an admitted run not seen ending within this long stops counting
        self._admit = connection.register_script(_ADMIT)
        self._release = connection.register_script(_RELEASE)

    def _cost_key(self, user_id: str) -> str:
        return self.keys.person(user_id, "cost:" + time.strftime("%Y%m%d", time.gmtime()))

    def check(self, user_id: str) -> None:
        """Before a question is accepted: the rate and the day's spend."""
        per_minute = self.limits.runs_per_minute
        if per_minute:
            key = self.keys.person(user_id, "minute:" + str(int(time.time() // 60)))
            pipe = self.redis.pipeline(transaction=True)
            pipe.incr(key)
            pipe.expire(key, 120)
            count = int(pipe.execute()[0])
            if count > per_minute:
                raise LimitExceeded(
                    f"You asked {count} questions this minute; the limit is {per_minute} a "
                    "minute. Please ask again in a minute."
                )
        over = self.over_spend(user_id)
        if over is not None:
            raise LimitExceeded(
                over[0].upper() + over[1:] + " Please ask again tomorrow or ask an admin."
            )

    def over_spend(self, user_id: str) -> str | None:
        """Before every model call of a run (and when a question is asked): the day's spend
        in words when it has reached the cap, else None. Checked per call, not only when a
        question is accepted, so neither a run admitted later from the person's line nor a
        long run can spend past the cap by more than the one call that crossed it."""
        per_day = self.limits.cost_per_day
        if not per_day:
            return None
        spent = float(self.redis.get(self._cost_key(user_id)) or 0)
        if spent < per_day:
            return None
        return (
            f"your questions today have used ${spent:.2f} of model time; the limit is "
            f"${per_day:.2f} a day (UTC)."
        )

    def admit(self, user_id: str, run_id: str) -> bool:
        """True when the run may be queued now; False when it waits in the person's line."""
        limit = self.limits.runs_in_flight
        if not limit:
            return True
        now = time.time()
        keys = [self.keys.person(user_id, "active"), self.keys.person(user_id, "waiting")]
        return bool(self._admit(keys=keys, args=[run_id, limit, now, now - self.stale]))

    def release(self, user_id: str, run_id: str, due_key: str) -> list[str]:
        """The run stops counting; returns the runs of this person admitted in its place."""
        limit = self.limits.runs_in_flight
        if not limit:
            return []
        keys = [self.keys.person(user_id, "active"), self.keys.person(user_id, "waiting"), due_key]
        admitted = self._release(keys=keys, args=[run_id, limit, time.time()])
        return [a.decode() for a in admitted]

    def waiting(self, user_id: str) -> int:
        return int(self.redis.llen(self.keys.person(user_id, "waiting")))

    def spend(self, user_id: str, cost: float) -> None:
        if cost > 0:
            key = self._cost_key(user_id)
            pipe = self.redis.pipeline(transaction=False)
            pipe.incrbyfloat(key, cost)
            pipe.expire(key, 2 * 24 * 3600)
            pipe.execute()
