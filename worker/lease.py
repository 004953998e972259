"""Run leases: only one worker advances a run at a time, and a crashed worker's lease lapses.

A process holds up to `--concurrency` leases at once. One keeper thread renews all of them in
one pipeline per beat, rather than one heartbeat thread and one round trip per run. When the
keeper, one thread among the process's many, gets the GIL late, each fenced save renews its
run's lease as well (worker/store.py), so a run that is saving keeps it.
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import time

import redis
import structlog

from worker.store import RunStore

log = structlog.get_logger(__name__)

# KEYS: leases.  ARGV: milliseconds, then each lease's token.  Returns 1 or 0 per lease:
# renewed, or no longer this holder's. One script for all of a beat's leases: one command to
# pack and one reply to read, so a process busy with many runs renews them in one turn of
# the GIL, not one per lease (1,000 runs in one process: leases lapsed, runs were re-queued).
# A key that cannot be read (not a string) is that lease's 0, not the others' failure.
_RENEW = """
local renewed = {}
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[i + 1] then
    renewed[i] = redis.call('PEXPIRE', KEYS[i], ARGV[1])
  else
    renewed[i] = 0
  end
end
return renewed
"""

# KEYS: lease, due set, the run, and the run's queued mark when the job a worker took drops
# it.  ARGV: token, the lease's term (ms), run id, that job's id ('' = whichever).
# False when another holds the lease; else the run's score in the due set and its document
# (each false when there is none), read with the lease held. The mark goes first, held or not
# (the job that set it is taken), unless it already names a later job. One round trip for
# what a worker that takes a job does before its first step (issue 28).
_ACQUIRE = """
if KEYS[4] and (ARGV[4] == '' or redis.call('GET', KEYS[4]) == ARGV[4]) then
  redis.call('DEL', KEYS[4])
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
return {redis.call('ZSCORE', KEYS[2], ARGV[3]) or false, redis.call('GET', KEYS[3]) or false}
"""

RENEW_CHUNK = 500  # leases per script call: bounds the time Redis runs one

# KEYS: lease, due set, and the run's mark of not yet said to have ended when it was (it is
# dropped).  ARGV: token, run id, due score seen when the work began.
# Returns 1 when the run was woken again while we worked (someone must look again).
# A lease that lapsed meanwhile (Redis stalled longer than the lease: paused, stopped) leaves
# the run due: the work stopped at its next fenced save, so the run is still to do, and the
# sweeper re-queues what is due and unleased. Dropping it then left the run `running` with
# no lease and nothing to find it, for good (found by the chaos soak).
_RELEASE = """
if KEYS[3] then redis.call('DEL', KEYS[3]) end
local held = redis.call('GET', KEYS[1]) == ARGV[1]
if held then redis.call('DEL', KEYS[1]) end
local cur = redis.call('ZSCORE', KEYS[2], ARGV[2])
if not cur then return 0 end
if not held then return 1 end
if ARGV[3] ~= '' and tonumber(cur) == tonumber(ARGV[3]) then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 0
end
return 1
"""


class Lease:
    """A held lease on one run. Release it exactly once.

    `due_seen` (the run's score in the due set) and `document` (the run as stored, None if
    there is none) were read right after the lease was taken, in the same round trip."""

    def __init__(
        self,
        keeper: LeaseKeeper,
        run_id: str,
        token: str,
        due_seen: str,
        document: bytes | None,
    ) -> None:
        self.keeper = keeper
        self.run_id = run_id
        self.token = token
        self.due_seen = due_seen
        self.document = document

    def release(self, due_seen: str, *, told: bool = False) -> bool:
        """Let go of the run (`told`: it ended and that was said). True when it was woken
        meanwhile and needs another look."""
        return self.keeper.release(self, due_seen, told=told)


class LeaseKeeper:
    """Takes, renews and releases the leases of one process's runs."""

    def __init__(self, store: RunStore, seconds: float) -> None:
        self.store = store
        self.redis: redis.Redis = store.redis
        self.ms = max(int(seconds * 1000), 100)
        self._held: dict[str, str] = {}  # run id -> token
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.every = self.ms / 3000  # seconds between beats: a lease lapses after three missed
        # Every lease held now began its current term (taken, or renewed by a beat) at or after
        # this (monotonic); and the earliest a lease was asked for since the keeper last listed
        # the leases to renew (not in that list: its own term counts).
        self._fresh_since = time.monotonic()
        self._unlisted = math.inf
        self._acquire = self.redis.register_script(_ACQUIRE)
        self._renew = self.redis.register_script(_RENEW)
        self._release = self.redis.register_script(_RELEASE)

    def acquire(self, run_id: str, *, taken_job: str | None = None) -> Lease | None:
        """The run's lease, with what its holder reads first; None while another holds it.
        `taken_job`: the id of the job this worker took for the run ('' for whichever): the
        run's queued mark is dropped first, unless it already names a later job."""
        keys = self.store.keys
        # the holder's pid in the token: who holds a run is visible to operators and tests
        token = f"{os.getpid()}-{secrets.token_hex(6)}"
        asked = time.monotonic()  # its term begins after this
        lease_keys = [keys.lease(run_id), keys.due, keys.run(run_id)]
        if taken_job is not None:
            lease_keys.append(keys.queued(run_id))
        args = [token, self.ms, run_id, taken_job or ""]
        held = self._acquire(keys=lease_keys, args=args)
        if not held:
            return None
        due, document = held
        with self._lock:
            # the only one held: its term alone counts; else the earliest (a beat may have
            # ended, or another lease been taken, between its SET and this)
            self._fresh_since = asked if not self._held else min(self._fresh_since, asked)
            self._held[run_id] = token
            self._unlisted = min(self._unlisted, asked)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._heartbeat, name="lease-keeper", daemon=True
                )
                self._thread.start()
        return Lease(self, run_id, token, "" if due is None else repr(float(due)), document)

    def release(self, lease: Lease, due_seen: str, *, told: bool = False) -> bool:
        with self._lock:
            if self._held.get(lease.run_id) == lease.token:
                del self._held[lease.run_id]
        keys = [self.store.keys.lease(lease.run_id), self.store.keys.due]
        if told:
            keys.append(self.store.keys.untold(lease.run_id))
        again = self._release(keys=keys, args=[lease.token, lease.run_id, due_seen])
        return bool(again)

    def held(self) -> list[str]:
        """Ids of the runs this process holds now."""
        with self._lock:
            return list(self._held)

    def save_term(self) -> int:
        """The term a fenced save renews its lease for (ms): none while the keeper keeps up;
        the full term once a lease held may have gone half its term without a renewal (the
        keeper is late, or its renewal failed), so a run that is saving keeps its lease."""
        return self.ms if time.monotonic() - self._fresh_since > 1.5 * self.every else 0

    def _heartbeat(self) -> None:
        while True:  # a daemon thread: it goes with the process
            due = time.monotonic() + self.every
            time.sleep(self.every)
            try:
                self._beat(due)
            except Exception:  # the next beat tries again; meanwhile saves renew (save_term)
                log.exception("lease_keeper_failed")

    def _beat(self, due: float) -> None:
        began = time.monotonic()
        with self._lock:
            held = list(self._held.items())
            self._unlisted = math.inf  # those asked for before now are in `held`
        if held and not self.renew(held):
            return
        with self._lock:  # those taken since the list was made: from when they were asked for
            self._fresh_since = min(began, self._unlisted)
        # A beat done a third of a lease late (the process too busy to run this thread, more
        # runs than its CPU serves; or Redis slow to answer) leaves leases near lapsing, and a
        # lapsed one's run is queued again while its worker goes on: said, with how late.
        late = time.monotonic() - due
        if held and late > self.every:
            log.warning("lease_renew_late", seconds=round(late, 2), runs=len(held))

    def renew(self, held: list[tuple[str, str]]) -> bool:
        """Renew `held` (run id, token) leases; False when Redis failed (logged)."""
        renewed: list[int] = []
        try:
            for start in range(0, len(held), RENEW_CHUNK):
                chunk = held[start : start + RENEW_CHUNK]
                keys = [self.store.keys.lease(run_id) for run_id, _ in chunk]
                renewed += self._renew(keys=keys, args=[self.ms, *(t for _, t in chunk)])
        except redis.RedisError:
            log.warning("lease_renew_failed", runs=len(held), exc_info=True)
            return False
        for (run_id, token), ok in zip(held, renewed, strict=True):
            if ok:
                continue
            with self._lock:  # released since the snapshot (nothing to say), or really lost
                lost = self._held.get(run_id) == token
                if lost:
                    del self._held[run_id]
            if lost:  # another worker took it over: our next fenced save fails
                log.warning("lease_lost", run_id=run_id)
        return True
