"""Run leases: only one worker advances a run at a time, and a crashed worker's lease lapses."""

from __future__ import annotations

import os
import secrets
import threading

import redis
import structlog

from worker.store import RunStore

log = structlog.get_logger(__name__)

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: lease, due set.  ARGV: token, run id, due score seen when the work began.
# Returns 1 when the run was woken again while we worked (someone must look again).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
local cur = redis.call('ZSCORE', KEYS[2], ARGV[2])
if not cur then return 0 end
if ARGV[3] ~= '' and tonumber(cur) == tonumber(ARGV[3]) then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 0
end
return 1
"""


class Lease:
    """A lease on one run, renewed by a heartbeat thread while held."""

    def __init__(self, store: RunStore, run_id: str, seconds: float) -> None:
        self.store = store
        self.redis: redis.Redis = store.redis
        self.run_id = run_id
        self.ms = max(int(seconds * 1000), 100)
        # the holder's pid in the token: who holds a run is visible to operators and tests
        self.token = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renew = self.redis.register_script(_RENEW)
        self._release = self.redis.register_script(_RELEASE)

    @property
    def key(self) -> str:
        return self.store.lease_key(self.run_id)

    def acquire(self) -> bool:
        if not self.redis.set(self.key, self.token, nx=True, px=self.ms):
            return False
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"lease-{self.run_id}", daemon=True
        )
        self._thread.start()
        return True

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ms / 3000):
            try:
                if not self._renew(keys=[self.key], args=[self.token, self.ms]):
                    log.warning("lease_lost", run_id=self.run_id)
                    return
            except redis.RedisError:
                log.warning("lease_renew_failed", run_id=self.run_id, exc_info=True)

    def release(self, due_seen: str) -> bool:
        """Let go of the run. True when it was woken meanwhile and needs another look."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        again = self._release(
            keys=[self.key, self.store.due_key], args=[self.token, self.run_id, due_seen]
        )
        return bool(again)
