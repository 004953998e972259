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
