"""Runs in Redis: the document, its indexes, the due set, cancellation marks, retention."""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis
import structlog

from approvals import WAKE_LUA
from worker.eventlog import APPEND_LUA, MAX_EVENTS_PER_RUN, said_full
from worker.keys import Keys
from worker.limits import RELEASE_LUA, SPEND_LUA, Charge, Release, admitted
from worker.run import Run, RunSchemaError, RunStatus, migrate

# KEYS: doc, lease, new status index, events, cancel mark, the mark of a run not yet said to
# have ended, then the other status indexes, then (with a charge) the keys of the person's day
# (worker/limits.py `Charge`), then (with a release) the person's places in flight, their line,
# the due set and the set of people with a line (worker/limits.py `Release`).
# ARGV: lease token ('' = unfenced), json, run id, score, ttl seconds (0 = keep), the most
# events the log keeps, the lease's term in ms (0 = leave it), the run's status, how long the
# not-yet-said mark lives (0: none is set: the run has not ended), how many other status
# indexes, the charge's cost ('': no charge) and the run whose place in flight it ends, the
# release's limit ('': no release), now, stale cutoff and user id, then events to append.
# The step's model call is charged first, fenced off or not: it was made (issue 28: in the
# save's round trip, not one of its own). The run's place in flight is given back, and who
# waits in line admitted, once the run is saved (a save that ends or suspends it).
# A worker that lost its lease (it stalled and another took over) can no longer overwrite;
# one whose save goes through holds the run, and with a term its lease runs that long from then.
# A run's index entry is scored when it reached its status, and its document and event log
# expire `ttl` after that: a save that keeps the status (most of them: every step of a running
# run) writes the document and the events, and touches no index.
# Returns 0 when fenced off, else {1, who asked to cancel the run or false, 1 when the event log
# was full and its newest events were dropped, else 0, the runs the release admitted}: the
# loop learns of a cancellation from its own save instead of asking at every step.
_SAVE = (
    APPEND_LUA
    + SPEND_LUA
    + RELEASE_LUA
    + """
local others = tonumber(ARGV[10])
local line = 7 + others  -- the release's keys: after the charge's, if any
if ARGV[11] ~= '' then
  spend(KEYS[line], KEYS[line + 1], KEYS[line + 2], ARGV[11], ARGV[12])
  line = line + 3
end
-- the lease and the cancel mark in one read (a command fewer than two GETs, at every save)
local marks = redis.call('MGET', KEYS[2], KEYS[5])
if ARGV[1] ~= '' and marks[1] ~= ARGV[1] then return 0 end
-- renewed here when the process's keeper thread is late (it competes for the GIL with every
-- run of the process: 1,000 runs in one), so a run that is saving keeps its lease
if ARGV[1] ~= '' and tonumber(ARGV[7]) > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[7]) end
-- The status the stored document has, from its first bytes (the status is its third field),
-- not from what this process remembers: a Redis that lost its last writes (a failover, a
-- restart) rolled the document and its index back together.
local head = redis.call('GETRANGE', KEYS[1], 0, 255)
local was = string.match(head, '"status"%s*:%s*"([%w_]+)"')
local ttl = tonumber(ARGV[5])
local kept = was ~= nil and was == ARGV[8]
if kept then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
else
  -- ZADD answers 1 only when the run was not in this status's index. It then leaves the
  -- index of the status its stored document has; every other index when that is unknown.
  if redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3]) == 1 then
    local left = false
    if was then
      for i = 7, 6 + others do
        if string.sub(KEYS[i], -(#was + 1)) == ':' .. was then
          redis.call('ZREM', KEYS[i], ARGV[3])
          left = true
        end
      end
    end
    if not left then
      for i = 7, 6 + others do redis.call('ZREM', KEYS[i], ARGV[3]) end
    end
  end
  if ttl > 0 then
    redis.call('SET', KEYS[1], ARGV[2], 'EX', ttl)
  else
    redis.call('SET', KEYS[1], ARGV[2])
  end
end
-- ended: said to the person next; a worker that finds the run ended with this mark still set
-- says it (the one that ended it stopped before it could, or lost this script's answer)
if tonumber(ARGV[9]) > 0 then redis.call('SET', KEYS[6], '1', 'EX', ARGV[9]) end
local full, began = false, false
if #ARGV > 16 then full, began = append(KEYS[4], 17, ttl, tonumber(ARGV[6])) end
-- the log expires with the document (one these events began got its time in `append`)
if ttl > 0 and not kept and not began then redis.call('EXPIRE', KEYS[4], ttl) end
local admitted = {}
if ARGV[13] ~= '' then
  admitted = release(KEYS[line], KEYS[line + 1], KEYS[line + 2], KEYS[line + 3], ARGV[3],
    ARGV[13], ARGV[14], ARGV[15], ARGV[16])
end
return {1, marks[2], full and 1 or 0, admitted}
"""
)

_WAKE = WAKE_LUA + "\nwake(KEYS[1], ARGV[1])\nreturn 1\n"

# KEYS: the run's mark of not yet said, its late teller's hold.  ARGV: the teller's lease
# token, the hold's term (ms).  0: nothing to say; 1: held by this caller, to say; 2: another
# holds it, saying it now.
_CLAIM_UNTOLD = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 2
"""

# KEYS: the mark, the hold.  ARGV: the teller's lease token, then 'said' (the mark dropped)
# or the mark's new life in seconds (still to say).  A hold that lapsed and was taken by
# another teller is that one's: left alone.
_LET_GO_UNTOLD = """
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
if ARGV[2] == 'said' then return redis.call('DEL', KEYS[1]) end
return redis.call('EXPIRE', KEYS[1], ARGV[2])
"""

log = structlog.get_logger(__name__)

# How long a queued mark may outlive its job. A mark names its job, and the sweeper checks that
# job is really in the queue, so a stale mark costs nothing; this only bounds the key's life.
QUEUED_MARK_SECONDS = 24 * 3600


# How long a run saved as ended waits, at most, to be said to have ended (its mark's life, and
# how long after the run ended a late teller still tries): a worker that stopped between the
# save and saying it leaves the run due, and the sweeper has it said within seconds; a day
# covers a Redis, a Slack or a fleet down for hours.
UNTOLD_SECONDS = 24 * 3600
# How long the count of a run's recoveries lives after the last one (`count_recovery`).
RECOVERIES_KEPT_SECONDS = 24 * 3600


class RunNotFound(LookupError):
    pass


class Untold(enum.Enum):
    """What a worker that finds a run ended learns of saying so (`RunStore.claim_untold`)."""

    SAID = 0  # said already: nothing to do
    TO_SAY = 1  # not yet said, and held by this worker for a while: say it
    BEING_SAID = 2  # another worker holds it: saying it now, or stopped (its hold lapses)


class LeaseLost(RuntimeError):
    """This worker no longer holds the run's lease; another worker has taken over."""


class RunStore:
    def __init__(
        self, connection: redis.Redis, namespace: str = "sb:", retention: int = 30 * 24 * 3600
    ) -> None:
        self.redis = connection
        self.ns = namespace
        self.keys = Keys(namespace)
        self.retention = retention
        self._save = connection.register_script(_SAVE)
        self._wake = connection.register_script(_WAKE)
        self._claim_untold = connection.register_script(_CLAIM_UNTOLD)
        self._let_go_untold = connection.register_script(_LET_GO_UNTOLD)
        # Runs of a schema version this process cannot read, skipped by every listing: how
        # many times, and the versions already logged (each once per process, not per listing).
        self.skipped_unknown = 0
        self._logged_versions: set[str] = set()
        self._skip_lock = threading.Lock()

    # documents
    def create(
        self,
        run: Run,
        *,
        wake: bool = True,
        events: Sequence[str] = (),
        then: Callable[[redis.client.Pipeline], None] | None = None,
    ) -> None:
        """The run, its indexes, its first `events` (encoded by EventLog), with `wake` its due
        entry, and what `then` adds (its job), in one transaction: a Redis that fails
        half-way leaves either nothing or a run the sweeper finds (a run created but neither
        due nor in its person's line would sit `queued` for good: found by the chaos soak)."""
        user_key = self.keys.user_runs(run.requester.user_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.multi()  # begun before `then`: RQ's enqueue would begin it itself, mid-transaction
        pipe.set(self.keys.run(run.id), run.to_json(), nx=True, ex=self.retention)
        pipe.zadd(self.keys.all_runs, {run.id: run.created_at})
        pipe.zadd(user_key, {run.id: run.created_at})
        # a person's index is trimmed when they ask again, and goes when they stop asking
        pipe.zremrangebyscore(user_key, 0, time.time() - self.retention)
        pipe.expire(user_key, self.retention)
        pipe.zadd(self.keys.status(run.status), {run.id: run.updated_at})
        if events:
            pipe.rpush(self.keys.events(run.id), *events)
            pipe.expire(self.keys.events(run.id), self.retention)
        if wake:
            # A new run has no due entry to stay ahead of (what the wake script is for): its
            # first is stamped here, without the script's three commands and the SCRIPT EXISTS
            # redis-py sends before a script in a transaction. With this host's clock, as the
            # sweeper reads the due set with its own (`overdue`): hosts' clocks must agree to
            # well within a lease (15 s by default), as they must for that.
            pipe.zadd(self.keys.due, {run.id: int(time.time() * 1000)})
        if then is not None:
            then(pipe)
        pipe.execute()

    def load(self, run_id: str, document: bytes | None = None) -> Run:
        """The run as stored; from `document` when the caller read it already."""
        raw = document if document is not None else self.redis.get(self.keys.run(run_id))
        if raw is None:
            raise RunNotFound(run_id)
        return Run.from_json(raw)

    def find(self, run_id: str) -> Run | None:
        try:
            return self.load(run_id)
        except RunNotFound:
            return None

    def save(
        self,
        run: Run,
        lease_token: str = "",
        events: Sequence[str] = (),
        lease_ms: int = 0,
        charge: Charge | None = None,
        release: Release | None = None,
    ) -> tuple[str | None, list[str]]:
        """Write the run (fenced by `lease_token`, unless empty) and append `events` (encoded
        by EventLog) to its log, in one script; with `lease_ms`, the lease is renewed for that
        long as well, a model call's `charge` is written first, fenced off or not, and with
        `release` the run's place in flight is given back once it is saved (it ended, or
        waits for people). Returns who asked to cancel it, if anyone, and the runs admitted
        from its person's line in its place (each marked due), to queue."""
        assert release is None or release.run_id == run.id  # the script gives back `run`'s
        run.updated_at = time.time()
        others = [self.keys.status(s) for s in RunStatus if s != run.status]
        # Every run expires `retention` after it reached its status, finished or not: a run
        # nothing advances any more (its approvals expired long ago, its worker gone) is not
        # kept forever.
        ttl = self.retention
        saved = self._save(
            keys=[
                self.keys.run(run.id),
                self.keys.lease(run.id),
                self.keys.status(run.status),
                self.keys.events(run.id),
                self.keys.cancel(run.id),
                self.keys.untold(run.id),
                *others,
                *(charge.keys if charge is not None else ()),
                *(release.keys if release is not None else ()),
            ],
            args=[
                lease_token,
                run.to_json(),
                run.id,
                run.updated_at,
                ttl,
                MAX_EVENTS_PER_RUN,
                lease_ms,
                run.status.value,
                UNTOLD_SECONDS if run.status.terminal else 0,
                len(others),
                *((charge.cost, charge.ends) if charge is not None else ("", "")),
                *(release.args()[1:] if release is not None else ("", "", "", "")),
                *events,
            ],
        )
        if not saved:
            raise LeaseLost(run.id)
        if saved[2]:
            said_full(run.id)
        cancelled_by = saved[1]
        return (cancelled_by.decode() if cancelled_by else None), admitted(saved[3])

    def claim_untold(self, run_id: str, token: str, hold_seconds: float) -> Untold:
        """Whether the run, saved as ended, may not have been said to have ended yet, and if
        so, hold it for `hold_seconds` (as the holder of lease `token`): one worker says it
        late, not each that finds it (Slack and Redis failing together had three say it,
        each release refused). Held, not taken: a worker killed while it says the run
        leaves the mark, and the next says it once the hold lapses (taken, the chaos soak
        saw a run never said)."""
        held = self._claim_untold(
            keys=[self.keys.untold(run_id), self.keys.untold_hold(run_id)],
            args=[token, max(int(hold_seconds * 1000), 1)],
        )
        return Untold(int(held))

    def said(self, run_id: str, token: str) -> None:
        """The run was said late: its mark dropped now, so a worker that finds it next finds
        it said, even when this one's release is refused; its hold let go."""
        self._let_go(run_id, token, "said")

    def unhold_untold(self, run_id: str, token: str) -> None:
        """The late teller could not say the run for now: its hold let go, so the next may
        try at once, and the mark kept a day from now, so the try past the day since the run
        ended finds it and gives up saying so (`run_never_said`), not in silence."""
        self._let_go(run_id, token, UNTOLD_SECONDS)

    def _let_go(self, run_id: str, token: str, then: str | int) -> None:
        keys = [self.keys.untold(run_id), self.keys.untold_hold(run_id)]
        self._let_go_untold(keys=keys, args=[token, then])

    def due_in(self, run_id: str, seconds: float) -> None:
        """The run is due `seconds` from now (the sweeper queues it a grace period after)."""
        self.redis.zadd(self.keys.due, {run_id: int((time.time() + seconds) * 1000)})

    # scheduling
    def wake(self, run_id: str) -> None:
        """Mark the run as needing a worker (the sweeper enqueues it if nobody does)."""
        self._wake(keys=[self.keys.due], args=[run_id])

    def mark_queued(self, run_id: str, job_id: str, pipeline: redis.client.Pipeline) -> None:
        """The run's advance job `job_id` is in the queue (it is enqueued in `pipeline`, after
        this): the sweeper leaves it alone."""
        pipeline.set(self.keys.queued(run_id), job_id, ex=QUEUED_MARK_SECONDS)

    def overdue(self, older_than: float, limit: int = 200) -> list[str]:
        cutoff_ms = (time.time() - older_than) * 1000
        ids = self.redis.zrangebyscore(self.keys.due, 0, cutoff_ms, 0, limit)
        return [i.decode() for i in ids]

    # cancellation lives beside the document so a worker holding the lease cannot overwrite it
    def request_cancel(self, run_id: str, by: str) -> None:
        self.redis.set(self.keys.cancel(run_id), by, ex=self.retention)
        self.wake(run_id)

    def cancel_requested_by(self, run_id: str) -> str | None:
        who = self.redis.get(self.keys.cancel(run_id))
        return who.decode() if who is not None else None

    # recovery
    def count_recovery(self, run_id: str) -> int:
        """The sweeper queues the run again: how many times it has since the run's last step
        was saved (`forget_recoveries`), this one included."""
        key = self.keys.recovered(run_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, RECOVERIES_KEPT_SECONDS)
        return int(pipe.execute()[0])

    def forget_recoveries(self, run_id: str) -> None:
        """A run taken up again saved a step past where it stopped: its count starts over. A
        Redis that refuses this for now is logged, not raised: the count lapses in a day."""
        try:
            self.redis.delete(self.keys.recovered(run_id))
        except redis.RedisError as exc:
            log.warning("run_recoveries_kept", run_id=run_id, error=str(exc))

    def resumed_marks(self, run_id: str) -> tuple[str | None, int]:
        """What a worker reads of a run it finds running (it goes on where another stopped):
        who asked to cancel it, and how many times the sweeper queued it again; one MGET."""
        who, recovered = self.redis.mget(self.keys.cancel(run_id), self.keys.recovered(run_id))
        return (who.decode() if who is not None else None), int(recovered or 0)

    # inspection
    def recent(
        self,
        *,
        user_id: str | None = None,
        status: RunStatus | None = None,
        limit: int = 20,
    ) -> list[Run]:
        """Newest first. Filters by user or status through the indexes."""
        if status is not None and user_id is None:
            ids = self.redis.zrevrange(self.keys.status(status), 0, limit - 1)
        else:
            index = self.keys.user_runs(user_id) if user_id else self.keys.all_runs
            ids = self.redis.zrevrange(index, 0, (limit * 5 if status else limit) - 1)
        raws = self.redis.mget([self.keys.run(i.decode()) for i in ids]) if ids else []
        runs = self.readable(zip(ids, raws, strict=True))
        if status is not None:
            runs = [r for r in runs if r.status == status]
        return runs[:limit]

    def created_since(self, since: float, limit: int = 5000) -> list[Run]:
        """Runs created at or after `since` (oldest first), for totals such as today's spend.
        Runs written by another schema version are skipped, not fatal."""
        ids = self.redis.zrangebyscore(self.keys.all_runs, since, "+inf", start=0, num=limit)
        runs: list[Run] = []
        for start in range(0, len(ids), 200):
            chunk = ids[start : start + 200]
            raws = self.redis.mget([self.keys.run(i.decode()) for i in chunk])
            runs += self.readable(zip(chunk, raws, strict=True))
        return runs

    def readable(self, stored: Iterable[tuple[bytes, bytes | None]]) -> list[Run]:
        """The runs among (id, document) pairs that this version reads: gone ones are left
        out, and so are runs of an unknown schema version (a newer release wrote them, or one
        without a migration), counted in `skipped_unknown` and logged once per version."""
        return [Run.from_document(data) for data in self.documents(stored)]

    def documents(self, stored: Iterable[tuple[bytes, bytes | None]]) -> list[dict[str, Any]]:
        """As `readable`, the documents as stored (migrated to this version), not validated
        into runs: for reading many (a filter, an export) where most are not needed as runs."""
        documents: list[dict[str, Any]] = []
        for run_id, raw in stored:
            if raw is None:
                continue
            try:
                documents.append(migrate(json.loads(raw)))
            except RunSchemaError as exc:
                self._skipped(run_id.decode(), exc)
        return documents

    def _skipped(self, run_id: str, exc: RunSchemaError) -> None:
        with self._skip_lock:
            self.skipped_unknown += 1
            first = repr(exc.version) not in self._logged_versions
            self._logged_versions.add(repr(exc.version))
        if first:
            log.warning(
                "run_schema_unknown_skipped",
                run_id=run_id,
                schema_version=repr(exc.version),
                error=str(exc),
            )

    def trim_indexes(self) -> None:
        """Drop index entries of runs past retention. A run's document expires `retention`
        after it reached its status, when its status index entry was scored, so such an entry
        scored before the cutoff has no document (or one about to expire, if the saving
        worker's clock is behind this one's). The index of all runs is scored by creation:
        a run created before the cutoff leaves it, its document kept if its status changed
        since, as the README says (listings by time reach the runs created within it)."""
        cutoff = time.time() - self.retention
        pipe = self.redis.pipeline(transaction=False)
        pipe.zremrangebyscore(self.keys.all_runs, 0, cutoff)
        for status in RunStatus:
            pipe.zremrangebyscore(self.keys.status(status), 0, cutoff)
        pipe.execute()
