"""A stopping worker takes no new job in any slot: one hand-back per run in flight."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading

import pytest
import redis
from rq import Worker

from switchboard import redisconn
from tests.fakes.openai_server import Turn
from tests.support.processes import WorkerProcess, worker_env
from tests.support.redis_server import RedisServer
from tests.support.runtime import ALICE, make_runtime, wait_for_run, wait_until
from worker import service
from worker.process import (
    DEQUEUERS,
    UNBLOCKED_BY_CLIENT,
    Slot,
    Turns,
    drain,
    slot_queue_class,
    unblock_idle_slots,
)
from worker.run import RunStatus

pytestmark = pytest.mark.slow


def blocked_dequeues(conn: redis.Redis) -> int:
    return sum(c["cmd"] in ("blmove", "blpop") for c in conn.client_list())


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


def test_idle_slots_wait_in_redis_a_few_at_a_time_yet_take_a_burst_together_and_stop_at_once(
    redis_conn, redis_url, model_server, tmp_path
):
    """At most DEQUEUERS of a process's idle slots hold a connection blocked in Redis (at
    1,000 slots there were 1,000); the others wait their turn in the process. A burst is
    still taken by as many slots as it has runs, and a SIGTERM ends every slot, those
    waiting their turn too."""
    slots = 32
    together = threading.Barrier(slots)

    def all_at_the_model(body: dict[str, object]) -> str | None:
        if "all together" not in str(body["messages"]):
            return None
        # answered once every run is at the model; else (broken) the peak says so
        with contextlib.suppress(threading.BrokenBarrierError):
            together.wait(timeout=30)
        return "here"

    model_server.route(all_at_the_model)
    rt = make_runtime(redis_conn, model_server.url)
    env = worker_env(redis_url, model_server.url, tmp_path)
    worker = WorkerProcess(env, tmp_path / "worker.log", "--concurrency", str(slots))
    try:
        wait_until(
            lambda: Worker.count(connection=redis_conn, queue=rt.queue) == slots,
            what="the worker's slots registered with RQ",
        )
        wait_until(lambda: blocked_dequeues(redis_conn) == DEQUEUERS, what="slots waiting")
        model_server.take_peak_chats()
        runs = [
            service.submit(
                rt, "all together: where?", ALICE.model_copy(update={"user_id": f"U{n:04d}"})
            )
            for n in range(slots)
        ]
        for run in runs:
            assert wait_for_run(rt, run.id).answer == "here"
        assert model_server.take_peak_chats() == slots  # each run in a slot of its own
        wait_until(lambda: blocked_dequeues(redis_conn) == DEQUEUERS, what="slots waiting")
        assert blocked_dequeues(redis_conn) == DEQUEUERS
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    finally:
        worker.stop()
    assert Worker.count(connection=redis_conn, queue=rt.queue) == 0  # every slot left


def test_a_drained_process_ends_every_slot_those_waiting_for_a_turn_too(
    redis_conn, redis_url, model_server
):
    # connected as a process is (its connections named after it, so its slots can be woken)
    rt = make_runtime(redisconn.connect(redis_url), model_server.url)
    shared = slot_queue_class(rt.stopping)
    slots = [Slot(rt, n, burst=False, queue_class=shared) for n in range(DEQUEUERS + 4)]
    for slot in slots:
        slot.start()
    try:
        wait_until(lambda: blocked_dequeues(redis_conn) == DEQUEUERS, what="slots waiting")
        drain(rt, slots, grace=5)
        for slot in slots:
            slot.thread.join(5)
        assert not [slot.index for slot in slots if slot.alive]
    finally:
        rt.stopping.set()
        unblock_idle_slots(rt)
        for slot in slots:
            slot.worker.register_death()
        rt.redis.close()  # its pool's connections, named after this process, closed too


def test_a_slot_waiting_for_a_turn_leaves_once_woken_in_a_stopping_process():
    """Even while the turns are held (a slot that began to wait in Redis just after the
    process woke its slots there waits out its dequeue's timeout)."""
    turns, stopping = Turns(1), threading.Event()
    assert turns.take(1, stopping)
    answers: list[bool] = []
    waiting = threading.Thread(target=lambda: answers.append(turns.take(60, stopping)))
    waiting.start()
    assert not turns.take(0.05, stopping)  # none free: a wait that runs out says so
    stopping.set()
    turns.wake_all()
    waiting.join(5)
    assert answers == [False]
    turns.give_back()
    assert not turns.take(1, stopping)  # a free turn is not taken by a stopping process
    stopping.clear()
    assert turns.take(1, stopping)
