"""Recovery that does not depend on anyone restarting anything: runs whose worker died are
re-queued once their lease lapses, overdue approvals expire, old index entries go."""

from __future__ import annotations

import threading

import redis
import structlog

from worker.jobs import enqueue_advance, expire
from worker.runtime import Runtime

log = structlog.get_logger(__name__)


def sweep(rt: Runtime) -> int:
    """One pass. Returns how many runs it re-queued."""
    grace = rt.settings.lease_seconds
    requeued = 0
    for run_id in rt.store.overdue(older_than=grace):
        if rt.redis.exists(rt.store.lease_key(run_id), rt.store.queued_key(run_id)):
            continue  # a live worker holds it, or its job is still waiting in the queue
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


class Sweeper(threading.Thread):
    def __init__(self, rt: Runtime, interval: float | None = None) -> None:
        super().__init__(name="switchboard-sweeper", daemon=True)
        self.rt = rt
        self.interval = interval if interval is not None else rt.settings.sweep_interval
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                sweep(self.rt)
            except redis.RedisError:
                log.warning("sweep_failed", exc_info=True)

    def stop(self) -> None:
        self.stopping.set()
