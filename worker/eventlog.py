"""The event log of each run: an append-only Redis list of what happened (worker/events.py
names the kinds). Kept back while a worker holds the run and written with its save, so a
step's events and its state land together."""

from __future__ import annotations

import json
import time
from typing import Any

import redis
import structlog

from worker.events import Event, EventKind
from worker.keys import Keys

log = structlog.get_logger(__name__)

MAX_EVENTS_PER_RUN = 5000  # a run is bounded by its budgets; this only stops a runaway log
POLL_SECONDS = 0.05

# For every script that appends to a run's log (this module's, a save's, a model call's
# start): the events ARGV[first..] at the end of `log`, which gets its time to live `ttl`
# (0: none) when they began it (it had gone while its run stayed: in the same script, so it
# is never left without one), capped at `most` events. Returns whether the log was full (its
# newest events dropped), and whether these events began it.
APPEND_LUA = """
local function append(log, first, ttl, most)
  local length = redis.call('RPUSH', log, unpack(ARGV, first))
  local began = length == #ARGV - first + 1
  if began and ttl > 0 then redis.call('EXPIRE', log, ttl) end
  if length > most then
    redis.call('LTRIM', log, 0, most - 1)
    return true, began
  end
  return false, began
end
"""

# KEYS: the log.  ARGV: its time to live should these events begin it, the most events it
# keeps, the events. Returns 1 when the log was full.
_APPEND = (
    APPEND_LUA
    + """
if append(KEYS[1], 3, tonumber(ARGV[1]), tonumber(ARGV[2])) then return 1 end
return 0
"""
)


def said_full(run_id: str) -> None:
    """A write found the run's log full and dropped what it brought (here, or in the save's
    and a model call's scripts, worker/store.py and worker/limits.py)."""
    log.warning("event_log_full", run_id=run_id)


class EventLog:
    def __init__(self, connection: redis.Redis, namespace: str = "sb:", retention: int = 0) -> None:
        self.redis = connection
        self.ns = namespace
        self.keys = Keys(namespace)
        # A log's time to live, given by whichever write creates it (0: none): a log is kept
        # as long as its run (worker/store.py), and one begun again outside a save (it had
        # gone while its run stayed) must not be kept for good.
        self.retention = retention
        self._append = connection.register_script(_APPEND)
        # run id -> events not written yet, while this process holds the run. One thread works
        # a run at a time, and each touches only its own run's list.
        self._held: dict[str, list[str]] = {}

    @staticmethod
    def encode(kind: EventKind, **data: Any) -> str:
        """One event as the log keeps it (for a write that carries it, e.g. a run's creation)."""
        return json.dumps({"k": kind, "at": round(time.time(), 3), **data}, default=str)

    def append(self, run_id: str, kind: EventKind, **data: Any) -> None:
        body = self.encode(kind, **data)
        held = self._held.get(run_id)
        if held is not None:
            held.append(body)
        else:
            self._push(run_id, [body])

    def hold(self, run_id: str) -> None:
        """Keep this run's events until `take` or `flush` (the caller holds its lease)."""
        self._held[run_id] = []

    def take(self, run_id: str) -> list[str]:
        """The run's kept events, for the caller to write (with a save)."""
        held = self._held.get(run_id)
        if not held:
            return []
        self._held[run_id] = []
        return held

    def put_back(self, run_id: str, bodies: list[str]) -> None:
        """Events `take`n for a write that did not happen: held again, ahead of any held
        since (nothing, when this process does not keep the run's events)."""
        if bodies and run_id in self._held:
            self._held[run_id] = [*bodies, *self._held[run_id]]

    def flush(self, run_id: str) -> None:
        """Write the run's kept events now."""
        events = self.take(run_id)
        if events:
            self._push(run_id, events)

    def flush_live(self, run_id: str) -> None:
        """As `flush`, for those watching the run live (a retry starting, an attempt that
        failed): when Redis does not take them now (restarting, loading its data, failing
        over) they stay kept, for the run's next save, and the step goes on. That write
        failing failed the run (internal_error; found by the chaos soak: a restarted Redis
        answered LOADING). Not for a record that must be made before what follows (a write
        about to start): that one is `flush`, which raises."""
        events = self.take(run_id)
        if not events:
            return
        try:
            self._push(run_id, events)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.put_back(run_id, events)
            log.warning("run_events_kept", run_id=run_id, events=len(events), error=str(exc))

    def release(self, run_id: str) -> None:
        """Write what is left and stop keeping (kept no longer if the write fails)."""
        try:
            self.flush(run_id)
        finally:
            self._held.pop(run_id, None)

    def _push(self, run_id: str, bodies: list[str]) -> None:
        args = [self.retention, MAX_EVENTS_PER_RUN, *bodies]
        if self._append(keys=[self.keys.events(run_id)], args=args):
            said_full(run_id)

    def read(self, run_id: str, after: str = "0", count: int | None = None) -> list[Event]:
        """Events after id `after` ("0" or "-": from the first), oldest first."""
        start = 0 if after in ("-", "") else int(after)
        stop = -1 if count is None else start + count - 1
        rows = self.redis.lrange(self.keys.events(run_id), start, stop)
        return [_decode(str(start + n + 1), raw) for n, raw in enumerate(rows)]

    def read_all(self, run_ids: list[str]) -> list[list[Event]]:
        """The whole log of each run, in one round trip (an export reads runs by the page)."""
        pipe = self.redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.lrange(self.keys.events(run_id), 0, -1)
        return [[_decode(str(n + 1), raw) for n, raw in enumerate(rows)] for rows in pipe.execute()]

    def wait(self, run_id: str, after: str, block_ms: int) -> list[Event]:
        """Events after `after`, waiting up to `block_ms` for the first one."""
        deadline = time.monotonic() + block_ms / 1000
        while True:
            events = self.read(run_id, after)
            if events or time.monotonic() >= deadline:
                return events
            time.sleep(POLL_SECONDS)


def _decode(event_id: str, raw: bytes) -> Event:
    body = json.loads(raw)
    kind = body.pop("k")
    at = body.pop("at")
    return Event(id=event_id, at=at, kind=kind, data=body)
