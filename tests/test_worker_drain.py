"""A stopping worker takes no new job in any slot: one hand-back per run in flight."""

from __future__ import annotations

import os
import shutil
import signal
import threading

import pytest
import redis
from rq import Worker

from tests.fakes.openai_server import Turn
from tests.support.processes import WorkerProcess, worker_env
from tests.support.redis_server import RedisServer
from tests.support.runtime import ALICE, make_runtime, wait_for_run, wait_until
from worker import service
from worker.process import UNBLOCKED_BY_CLIENT, unblock_idle_slots
from worker.run import RunStatus

pytestmark = pytest.mark.slow


def test_sigterm_at_concurrency_32_with_one_run_in_flight_hands_it_back_once(
    redis_conn, redis_url, model_server, tmp_path
):
    slow_first = Turn(tool_calls=[("calculate", {"expression": "6 * 7"})], delay=1.0)
    model_server.route("drain once", [slow_first, "it is 42"])
    rt = make_runtime(redis_conn, model_server.url)
    env = worker_env(redis_url, model_server.url, tmp_path)
    worker = WorkerProcess(env, tmp_path / "worker.log", "--concurrency", "32")
    try:
        wait_until(
            lambda: Worker.count(connection=redis_conn, queue=rt.queue) == 32,
            what="the worker's 32 slots registered with RQ",
        )
        run = service.submit(rt, "drain once: what is 6 * 7?", ALICE)
        wait_until(
            lambda: any("drain once" in str(r) for r in model_server.chat_requests),
            what="the model call in flight",
        )
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    finally:
        worker.stop()
    kinds = [e.kind for e in rt.events.read(run.id)]
    assert kinds.count("handed_back") == 1, kinds
    assert redis_conn.llen(rt.queue.key) == 1  # its one job waits for the next worker
    assert redis_conn.llen(rt.queue.key + ":intermediate") == 0

    second = WorkerProcess(env, tmp_path / "second.log", "--concurrency", "2")
    try:
        done = wait_for_run(rt, run.id)
    finally:
        second.stop()
    assert done.status == RunStatus.COMPLETED and done.answer == "it is 42"
    assert [e.kind for e in rt.events.read(run.id)].count("handed_back") == 1


def test_waking_a_slot_whose_dequeue_waits_out_a_client_pause_leaves_redis_up(
    tmp_path, model_server
):
    """CLIENT UNBLOCK's TIMEOUT form crashes Redis 7.0 (Debian 12's redis-server 7.0.15)
    on a dequeue held back by CLIENT PAUSE WRITE, as during an operator's failover: the chaos
    soak's primary went down when a worker stopped during one. The ERROR form is used; the
    slot reads its UNBLOCKED answer as "nothing taken"."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("needs Debian's redis-server (apt-get install redis-server)")
    server = RedisServer(tmp_path / "redis", binary=binary).start()
    try:
        admin = redis.Redis(unix_socket_path=server.socket)
        rt = make_runtime(admin, model_server.url)
        slot = redis.Redis(unix_socket_path=server.socket)
        slot.client_setname(f"switchboard-{os.getpid()}")  # as this process's slots are named
        admin.execute_command("CLIENT", "PAUSE", "5000", "WRITE")
        answered: list[object] = []

        def dequeue() -> None:  # a BLMOVE sent during the pause is held back by it
            try:
                answered.append(slot.blmove(rt.queue.key, rt.queue.key + ":taken", 10))
            except redis.ResponseError as exc:
                answered.append(str(exc))

        waiting = threading.Thread(target=dequeue)
        waiting.start()
        wait_until(
            lambda: any(c["cmd"] == "blmove" for c in admin.client_list()),
            what="the dequeue waiting",
        )
        assert unblock_idle_slots(rt) == 1
        waiting.join(10)
        assert answered == [UNBLOCKED_BY_CLIENT]
        assert admin.ping()  # before: "Guru Meditation: Unknown btype", and no Redis
        admin.execute_command("CLIENT", "UNPAUSE")
    finally:
        server.stop()
