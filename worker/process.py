"""A worker process: RQ's SimpleWorker plus Switchboard's sweeper.

SimpleWorker runs jobs in the worker process instead of forking one per job: measured here,
two fork-per-job workers did ~74 no-op jobs/s and two SimpleWorkers ~370. Forking buys crash
isolation, but a run's state is in Redis and crashed runs are recovered by lease expiry and
the sweeper, so Switchboard does not need RQ to notice a dead work-horse.
"""

from __future__ import annotations

import structlog
from rq import SimpleWorker
from rq.serializers import JSONSerializer

from worker import runtime
from worker.runtime import Runtime
from worker.sweeper import Sweeper

log = structlog.get_logger(__name__)


def make_worker(rt: Runtime, name: str | None = None) -> SimpleWorker:
    return SimpleWorker(
        [rt.queue],
        connection=rt.redis,
        serializer=JSONSerializer,
        name=name,
        # RQ's own liveness bookkeeping; Switchboard's recovery does not wait for it.
        worker_ttl=60,
        maintenance_interval=60,
    )


def serve(rt: Runtime, *, burst: bool = False) -> None:
    """Work the queue until stopped (SIGINT/SIGTERM finish the current job first). RQ's
    scheduler runs in the sweeper thread (see worker/sweeper.py), not in a forked child."""
    runtime.install(rt)
    sweeper = Sweeper(rt)
    sweeper.start()
    worker = make_worker(rt)
    log.info("worker_started", name=worker.name, queue=rt.queue.name)
    try:
        worker.work(burst=burst, logging_level="WARNING")
    finally:
        sweeper.stop()
        log.info("worker_stopped", name=worker.name)
