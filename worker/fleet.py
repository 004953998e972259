"""The worker fleet as Redis shows it: RQ's worker registrations, live by their heartbeat.

Each slot of a worker process is an RQ worker named `HOST.PID.SLOT`. A slot waiting for a job
heartbeats every 45 s (worker_ttl 60 - 15, worker/process.py); a busy one does not until its
job ends, so a busy slot counts as live. A killed process stays registered with RQ for
minutes, so being registered proves nothing: only a fresh heartbeat (or a job in hand) does.
Read in one round trip (a Lua script), whatever the fleet's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from rq.utils import utcparse
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

FRESH_SECONDS = 75.0  # 45 s between an idle slot's heartbeats, and some slack

# KEYS: the queue's worker set. Returns, per registered worker whose key still exists:
# name, last heartbeat, state.
_REGISTERED = """
local out = {}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local f = redis.call('HMGET', key, 'last_heartbeat', 'state')
  if f[1] or f[2] then
    table.insert(out, string.sub(key, string.len('rq:worker:') + 1))
    table.insert(out, f[1] or '')
    table.insert(out, f[2] or '')
  end
end
return out
"""


@dataclass(frozen=True)
class Fleet:
    processes: int  # worker processes with at least one live slot
    slots: int  # live slots
    busy: int  # slots working on a job now
    by_process: tuple[tuple[str, int, int], ...] = ()  # ("HOST.PID", live slots, busy)

    @property
    def alive(self) -> bool:
        return self.processes > 0


def read_fleet(connection: redis.Redis, queue_name: str, now: datetime | None = None) -> Fleet:
    return fleet_of(ask_fleet(connection, queue_name, connection), now)


def ask_fleet(connection: redis.Redis, queue_name: str, client: Any) -> Any:
    """Run the script on `client`: the connection (the reply), or a pipeline (queued, its
    reply among the pipeline's; pass that to `fleet_of`)."""
    script = connection.register_script(_REGISTERED)
    return script(keys=[WORKERS_BY_QUEUE_KEY % queue_name], client=client)


def fleet_of(raw: list[bytes], now: datetime | None = None) -> Fleet:
    return judge(_triples(raw), now or datetime.now(UTC))


def _triples(raw: list[bytes]) -> list[tuple[str, str, str]]:
    text = [item.decode() if isinstance(item, bytes) else str(item) for item in raw]
    return [(text[i], text[i + 1], text[i + 2]) for i in range(0, len(text) - 2, 3)]


def judge(workers: list[tuple[str, str, str]], now: datetime) -> Fleet:
    """(name, last heartbeat, state) of each registered slot, as live processes and slots."""
    processes: dict[str, list[int]] = {}
    for name, beat, state in workers:
        working = state == "busy"
        try:
            fresh = bool(beat) and (now - utcparse(beat)).total_seconds() < FRESH_SECONDS
        except ValueError:
            fresh = False
        if not (fresh or working):
            continue
        counts = processes.setdefault(
            name.rsplit(".", 1)[0] if name.count(".") >= 2 else name, [0, 0]
        )
        counts[0] += 1
        counts[1] += working
    return Fleet(
        processes=len(processes),
        slots=sum(c[0] for c in processes.values()),
        busy=sum(c[1] for c in processes.values()),
        by_process=tuple((name, c[0], c[1]) for name, c in sorted(processes.items())),
    )
