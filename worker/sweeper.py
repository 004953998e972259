"""Recovery that does not depend on anyone restarting anything: runs whose worker died are
re-queued once their lease lapses, overdue approvals expire, questions nothing else would
admit leave their person's line, old index entries go."""

from __future__ import annotations

import threading
import time

import redis
import structlog
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer

from worker.jobs import expire
from worker.runtime import Runtime

log = structlog.get_logger(__name__)


# KEYS: due set, lease, queued mark, the RQ queue's list.  ARGV: run id, cutoff (ms).
# 1 when the run needs a new job: still overdue, no live worker holds it, and the job its mark
# names is not waiting in the queue (however long the backlog). One script, so a worker that
# finishes the run meanwhile (its release drops the lease and the due entry at once) is seen.
_LOST = """
local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[2]) then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local job = redis.call('GET', KEYS[3])
if job and redis.call('LPOS', KEYS[4], job) then return 0 end
return 1
"""


def sweep(rt: Runtime) -> int:
    """One pass. Returns how many runs it re-queued."""
    grace = rt.settings.lease_seconds
    lost = rt.redis.register_script(_LOST)
    requeued = 0
    for run_id in rt.store.overdue(older_than=grace):
        cutoff_ms = (time.time() - grace) * 1000
        keys = [
            rt.store.keys.due,
            rt.store.keys.lease(run_id),
            rt.store.keys.queued(run_id),
            rt.queue.key,
        ]
        if not lost(keys=keys, args=[run_id, cutoff_ms]):
            continue
        # one sweeper re-queues a given run per grace period, however many workers sweep
        marker = f"{rt.settings.namespace}sweep:{run_id}"
        if not rt.redis.set(marker, 1, nx=True, px=max(int(grace * 1000), 100)):
            continue
        # counted, so a run that stops its worker every time (a crash it causes, a step Redis
        # keeps interrupting) ends once it has been taken up too often (worker/loop.py)
        log.info("sweeper_requeue", run_id=run_id, recovered=rt.store.count_recovery(run_id))
        rt.enqueue_advance(run_id)
        requeued += 1
    for approval_id in rt.approvals.overdue():
        expire(rt, approval_id)  # a backstop for the scheduled expiry job
    admit_waiting(rt)
    redraw_owed_cards(rt)
    rt.store.trim_indexes()
    return requeued


def admit_waiting(rt: Runtime) -> int:
    """Questions waiting in their person's line are admitted when a run of theirs ends; this
    admits those nothing else would: after a policy reload raised or removed the limit, or
    when the places ahead of them went stale (their workers died) and the person asks
    nothing more. Returns how many it admitted and queued."""
    admitted = 0
    for user_id in rt.limits.lines():
        for run_id in rt.limits.drain(user_id, rt.store.keys.due):
            log.info("sweeper_admitted_from_line", run_id=run_id, user=user_id)
            rt.enqueue_advance(run_id)  # due already: the next pass queues it if this fails
            admitted += 1
    return admitted


OWED_GRACE = 15.0  # s a decision's own card update may take (Slack's retries included)
OWED_GIVE_UP = 3600.0  # s after which a card Slack never took is left as it is


def redraw_owed_cards(rt: Runtime, grace: float = OWED_GRACE) -> int:
    """Decisions whose cards still show buttons: whoever decided (a click, the expiry job, a
    withdrawal) died before redrawing them, or Slack could not take the update then. Their
    run's surface draws them again (the same update, so doing it twice is harmless) and
    clears the debt when every card shows the outcome. Returns how many it redrew."""
    redrawn = 0
    for approval_id in rt.approvals.owed_cards(older_than=grace):
        request = rt.approvals.find(approval_id)
        run = rt.store.find(request.run_id) if request is not None else None
        if request is None or run is None or not request.cards:  # nothing left to draw on
            # (a card recorded since the request was read stays owed)
            rt.approvals.card_shown(approval_id, drawn=len(request.cards) if request else None)
            continue
        if request.decided_at and time.time() - request.decided_at > OWED_GIVE_UP:
            log.warning("approval_card_abandoned", approval_id=approval_id, run_id=run.id)
            rt.approvals.card_shown(approval_id)
            continue
        marker = f"{rt.settings.namespace}sweep:card:{approval_id}"  # one sweeper per pass
        if not rt.redis.set(marker, 1, nx=True, px=int(OWED_GRACE * 1000)):
            continue
        log.info("approval_card_redrawn", approval_id=approval_id, run_id=run.id)
        rt.surface(run).approval_resolved(run, request)
        redrawn += 1
    return redrawn


class Sweeper(threading.Thread):
    """Runs in every worker process: RQ's scheduler (approval expiry jobs) and `sweep`.

    RQ's scheduler runs here, in a thread, rather than in the child process RQ forks for it:
    a forked child inherits the worker's Redis sockets, and when the worker alone is killed
    (the OOM killer, a stray kill -9) the child keeps its blocked dequeue open, so Redis hands
    the next job to a socket nobody reads. One process at a time holds RQ's scheduler lock.
    """

    def __init__(self, rt: Runtime, interval: float | None = None) -> None:
        super().__init__(name="switchboard-sweeper", daemon=True)
        self.rt = rt
        self.interval = interval if interval is not None else rt.settings.sweep_interval
        self.stopping = threading.Event()
        self.scheduler = RQScheduler(  # its lock TTL is interval + 60 whole seconds
            [rt.queue.name],
            connection=rt.redis,
            interval=max(1, round(self.interval)),
            serializer=JSONSerializer,
        )

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.tick()
            except redis.RedisError:
                log.warning("sweep_failed", exc_info=True)

    def tick(self) -> None:
        """One pass: move due scheduled jobs (if this process holds RQ's scheduler lock) to
        the queue, then sweep."""
        if self.scheduler.acquire_locks():
            self.scheduler.enqueue_scheduled_jobs()
        sweep(self.rt)

    def stop(self) -> None:
        self.stopping.set()
        self.join(self.interval + 5)
        try:
            self.scheduler.release_locks()
        except redis.RedisError:
            log.warning("scheduler_release_failed", exc_info=True)
