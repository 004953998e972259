"""One worker process carries many runs at once: RQ worker loops in threads."""

from __future__ import annotations

import json
import signal
import threading

import pytest
from rq import Queue
from rq.job import JobStatus
from rq.serializers import JSONSerializer

from tests.fakes.openai_server import Turn
from tests.support.processes import WorkerProcess, worker_env
from tests.support.runtime import ALICE, make_runtime, wait_for_run, wait_until
from worker import service
from worker.process import make_worker
from worker.run import RunStatus

pytestmark = pytest.mark.slow


def test_sigterm_hands_runs_in_flight_back_and_another_worker_finishes_them(
    redis_conn, redis_url, model_server, tmp_path
):
    slow_first = Turn(tool_calls=[("calculate", {"expression": "6 * 7"})], delay=1.0)
    for n in range(4):
        model_server.route(f"handback [{n}]", [slow_first, f"it is 42 [{n}]"])
    rt = make_runtime(redis_conn, model_server.url)
    env = worker_env(redis_url, model_server.url, tmp_path)
    first = WorkerProcess(env, tmp_path / "first.log", "--concurrency", "4")
    runs = [service.submit(rt, f"handback [{n}]: what is 6 * 7?", ALICE) for n in range(4)]
    wait_until(
        lambda: (
            sum(f"handback [{n}]" in str(r) for n in range(4) for r in model_server.chat_requests)
            == 4
        ),
        what="four model calls in flight",
    )
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(20) == 0  # well inside the grace period
    for run in runs:
        kinds = [e.kind for e in rt.events.read(run.id)]
        assert "handed_back" in kinds and not rt.store.load(run.id).status.terminal
    second = WorkerProcess(env, tmp_path / "second.log", "--concurrency", "4")
    try:
        for n, run in enumerate(runs):
            done = wait_for_run(rt, run.id)
            assert done.status == RunStatus.COMPLETED and done.answer == f"it is 42 [{n}]"
            assert done.usage.steps == 2  # the first step was kept, not made again
    finally:
        second.stop()
        first.stop()
    # every line a worker logged about a run names it, from whichever thread wrote it
    lines = [
        json.loads(x)
        for x in (tmp_path / "first.log").read_text().splitlines()
        if x.startswith("{")
    ]
    executed = [x for x in lines if x.get("event") == "tool_executed"]
    assert len(executed) == 4 and all(x.get("run_id") for x in executed)
    assert {x["run_id"] for x in executed} == {r.id for r in runs}


def test_a_slot_enforces_the_job_timeout_without_sigalrm(redis_conn, model_server):
    rt = make_runtime(redis_conn, model_server.url)
    queue = Queue("timeouts", connection=redis_conn, serializer=JSONSerializer)
    job = queue.enqueue_call("time.sleep", args=(5,), timeout=1)
    worker = make_worker(rt)
    worker.queues = [queue]
    worker._ordered_queues = [queue]
    thread = threading.Thread(target=worker.work, kwargs={"burst": True}, daemon=True)
    thread.start()  # not the main thread: SIGALRM could not reach it
    thread.join(10)
    assert not thread.is_alive()
    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    result = job.latest_result()
    assert result is not None and "JobTimeoutException" in (result.exc_string or "")


def _registration_writes(conn, work) -> tuple[int, int]:
    """(HSET + EXPIRE calls, of which HSETs) Redis counted while `work()` ran: what RQ's
    bookkeeping of a worker's registration (heartbeats, state) costs, beside the jobs'
    own writes, which are the same for every worker class."""
    conn.config_resetstat()
    work()
    stats = conn.info("commandstats")
    hset = int(stats.get("cmdstat_hset", {}).get("calls", 0))
    expire = int(stats.get("cmdstat_expire", {}).get("calls", 0))
    return hset + expire, hset


def test_a_slot_heartbeats_once_for_a_burst_of_quick_jobs_and_stays_alive(redis_conn, model_server):
    """RQ's SimpleWorker sends its heartbeat (HSET + 2 EXPIRE) four to six times per job,
    however short; a slot sends it only when the last one is older than HEARTBEAT_EVERY,
    and still reads as alive (worker/fleet.py) with the time to live RQ asked for."""
    from rq import SimpleWorker

    from worker.fleet import FRESH_SECONDS
    from worker.process import HEARTBEAT_EVERY

    rt = make_runtime(redis_conn, model_server.url)
    queue = Queue("beats", connection=redis_conn, serializer=JSONSerializer)
    jobs = 20

    def burst(worker) -> None:
        worker.queues = [queue]
        worker._ordered_queues = [queue]
        for n in range(jobs):
            queue.enqueue_call("builtins.abs", args=(-n,), result_ttl=600)
        worker.work(burst=True)

    class Plain(SimpleWorker):  # as a slot, without RQ's command channel: its pubsub
        def subscribe(self) -> None:  # thread, stopped at the end of a burst, can hold the
            pass  # test for a minute on a loaded machine

        def unsubscribe(self) -> None:
            pass

    plain = Plain([queue], connection=redis_conn, serializer=JSONSerializer)
    rq_writes, _ = _registration_writes(redis_conn, lambda: burst(plain))
    slot = make_worker(rt)
    slot_writes, _ = _registration_writes(redis_conn, lambda: burst(slot))
    assert queue.finished_job_registry.count == 2 * jobs
    # at least two of RQ's heartbeats (3 commands each) and one state write saved per job
    assert slot_writes <= rq_writes - jobs * 7, (slot_writes, rq_writes)

    # what reads a slot as alive still does, within the heartbeat interval
    assert HEARTBEAT_EVERY < FRESH_SECONDS - 45  # an idle slot beats every 45 s
    redis_conn.delete(*redis_conn.keys("rq:worker:*"))
    alive = make_worker(rt)
    alive.queues, alive._ordered_queues = [queue], [queue]
    queue.enqueue_call("builtins.abs", args=(-1,), result_ttl=60)
    alive.register_birth()
    alive.dequeue_job_and_maintain_ttl(timeout=1)
    assert redis_conn.hget(alive.key, "last_heartbeat") is not None
    assert redis_conn.ttl(alive.key) >= alive.worker_ttl
    # a longer time to live (a job's start asks for one) is sent however recent the last beat
    alive.heartbeat(540)
    assert redis_conn.ttl(alive.key) >= 530


def test_a_slots_heartbeat_sent_on_its_own_is_one_round_trip(redis_conn, model_server):
    """RQ sends its heartbeat's HSET and two EXPIREs one by one: three round trips, every
    10 s for each idle slot of a worker (128 by default)."""
    slot = make_worker(make_runtime(redis_conn, model_server.url))
    slot.register_birth()
    before = slot.connection.hget(slot.key, "last_heartbeat")
    redis_conn.config_resetstat()
    slot._beat_at = float("-inf")  # the last one long ago
    slot.heartbeat()
    reads = int(redis_conn.info("stats")["total_reads_processed"])
    assert reads == 2  # the heartbeat's pipeline, and this INFO
    assert slot.connection.hget(slot.key, "last_heartbeat") != before
    assert 0 < redis_conn.ttl(slot.key) <= slot.worker_ttl + 60
