"""A slot runs a run's `advance` job with its own bookkeeping, not RQ's (worker/process.py):
what RQ's registries would have held is not written, what the job's safety needs is."""

from __future__ import annotations

import threading

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.worker import WorkerStatus
from structlog.testing import capture_logs

from tests.fakes.openai_server import Turn
from tests.support.redis_server import RedisServer
from tests.support.runtime import ALICE, make_runtime, wait_for_run, wait_until
from worker import service
from worker.process import make_worker
from worker.run import RunStatus

pytestmark = pytest.mark.slow


def _slot_in_a_thread(rt):
    slot = make_worker(rt)
    thread = threading.Thread(target=slot.work, kwargs={"burst": True}, daemon=True)
    thread.start()
    return slot, thread


def test_an_advance_job_leaves_no_rq_records_and_is_bounded_while_it_runs(redis_conn, model_server):
    slow = Turn(tool_calls=[("calculate", {"expression": "6 * 7"})], delay=1.0)
    model_server.route("bookkeeping", [slow, "it is 42"])
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "bookkeeping: what is 6 * 7?", ALICE)
    job_id = redis_conn.get(rt.store.keys.queued(run.id)).decode()
    slot, thread = _slot_in_a_thread(rt)

    wait_until(lambda: model_server.chat_requests, what="the model call in flight")
    queue = rt.queue
    # taken: out of RQ's intermediate queue, which RQ's maintenance fails as stuck after a minute
    assert redis_conn.lrange(queue.intermediate_queue_key, 0, -1) == []
    # a worker killed now leaves the job's key for no longer than the job could have run
    ttl = redis_conn.ttl(Job.key_for(job_id))
    assert 0 < ttl <= rt.settings.job_timeout + 60
    # the slot reads as busy, and its registration outlives the job
    assert redis_conn.hget(slot.key, "state").decode() == WorkerStatus.BUSY
    assert redis_conn.ttl(slot.key) >= rt.settings.job_timeout

    thread.join(20)
    assert not thread.is_alive()
    assert wait_for_run(rt, run.id).status == RunStatus.COMPLETED
    assert redis_conn.exists(Job.key_for(job_id)) == 0  # no result kept: nobody reads it
    assert queue.started_job_registry.count == 0
    assert queue.finished_job_registry.count == 0
    assert redis_conn.keys("rq:execution*") == [] and redis_conn.keys("rq:results:*") == []
    assert redis_conn.hget(slot.key, "state").decode() == WorkerStatus.IDLE


def test_an_advance_job_that_raises_is_kept_as_failed_as_rq_keeps_it(redis_conn, model_server):
    rt = make_runtime(redis_conn, model_server.url)
    job = rt.queue.enqueue_call(  # advance's signature refused: it raises before any run
        "worker.jobs.advance", args=("r1", "extra"), failure_ttl=3600
    )
    slot, thread = _slot_in_a_thread(rt)
    thread.join(20)
    assert not thread.is_alive()
    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    assert job.id in rt.queue.failed_job_registry
    result = job.latest_result()
    assert result is not None and "TypeError" in (result.exc_string or "")
    assert 3500 < redis_conn.ttl(job.key) <= 3600
    assert redis_conn.lrange(rt.queue.intermediate_queue_key, 0, -1) == []
    assert redis_conn.hget(slot.key, "state").decode() == WorkerStatus.IDLE


def test_a_slot_goes_on_when_redis_refuses_an_advance_jobs_bookkeeping(model_server, tmp_path):
    """Redis refuses the slot's taking of the job (LREM from RQ's intermediate queue, which
    nothing else in a slot's loop sends): the job is not run (its run stays due for the
    sweeper; RQ's maintenance records the job as stuck a minute later), and the slot takes
    the next one instead of leaving its loop with the rest still queued."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        admin = redis.Redis(unix_socket_path=server.socket)
        admin.acl_setuser(
            "slot",
            enabled=True,
            reset=True,
            passwords=["+slot-password"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", "-lrem"],
        )
        slot_conn = redis.Redis(
            unix_socket_path=server.socket, username="slot", password="slot-password"
        )
        rt = make_runtime(slot_conn, model_server.url)
        queue = Queue(rt.queue.name, connection=admin, serializer=JSONSerializer)
        jobs = [
            queue.enqueue_call("worker.jobs.advance", args=(f"r-missing-{n}",)) for n in range(3)
        ]
        slot = make_worker(rt)
        with capture_logs() as logs:
            thread = threading.Thread(target=slot.work, kwargs={"burst": True}, daemon=True)
            thread.start()
            thread.join(20)
        assert not thread.is_alive()
        assert admin.llen(queue.key) == 0  # all three taken, none left behind
        not_taken = [e["job_id"] for e in logs if e["event"] == "worker_slot_job_not_taken"]
        assert not_taken == [job.id for job in jobs]
        for job in jobs:
            job.refresh()
            assert job.get_status() == JobStatus.QUEUED  # not run
            assert 0 < admin.ttl(job.key) <= rt.settings.job_timeout + 60  # and not kept
        assert admin.hget(slot.key, "state").decode() == WorkerStatus.IDLE
        slot_conn.close()
        admin.close()
    finally:
        server.stop()
