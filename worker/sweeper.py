"""Recovery that does not depend on anyone restarting anything: runs whose worker died are
re-queued once their lease lapses, overdue approvals expire, old index entries go."""

from __future__ import annotations

import threading

import redis
import structlog
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer

from worker.jobs import enqueue_advance, expire
from worker.runtime import Runtime

log = structlog.get_logger(__name__)


def sweep(rt: Runtime) -> int:
    """One pass. Returns how many runs it re-queued."""
    grace = rt.settings.lease_seconds
    requeued = 0
    for run_id in rt.store.overdue(older_than=grace):
        if held_or_queued(rt, run_id):
            continue
        # one sweeper re-queues a given run per grace period, however many workers sweep
        marker = f"{rt.settings.namespace}sweep:{run_id}"
        if not rt.redis.set(marker, 1, nx=True, px=max(int(grace * 1000), 100)):
            continue
        log.info("sweeper_requeue", run_id=run_id)
        enqueue_advance(rt, run_id)
        requeued += 1
    for approval_id in rt.approvals.overdue():
        expire(rt, approval_id)  # a backstop for the scheduled expiry job
    rt.store.trim_indexes()
    return requeued


def held_or_queued(rt: Runtime, run_id: str) -> bool:
    """A live worker holds the run, or its advance job is still waiting in the queue, however
    long the backlog. A job a worker took and then died with is neither: recover it."""
    pipe = rt.redis.pipeline(transaction=False)
    pipe.exists(rt.store.lease_key(run_id))
    pipe.get(rt.store.queued_key(run_id))
    leased, job_id = pipe.execute()
    if leased:
        return True
    return job_id is not None and rt.redis.lpos(rt.queue.key, job_id) is not None


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
