"""Log lines as an operator reads them: with SWITCHBOARD_LOG_FORMAT=json every line of a
process is one JSON object, the libraries' (RQ, slack_sdk) included; a worker start says
nothing about Redis timeouts against a healthy Redis."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slack_sdk import WebClient

from switchboard import logs, redisconn
from tests.fakes.slack_server import FakeSlack
from tests.support.processes import ROOT, WorkerProcess, worker_env
from tests.support.runtime import make_runtime, wait_until
from worker.process import make_worker


@pytest.fixture
def json_logs() -> Iterator[None]:
    logs.configure("json", logging.INFO)
    yield
    logs.configure("console", logging.INFO)


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line, each of which must be a JSON object (json.loads raises otherwise)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.slow
def test_with_json_logs_a_worker_writes_rqs_lines_as_json_too(
    redis_conn, redis_url, model_server, tmp_path
):
    log = tmp_path / "worker.log"
    worker = WorkerProcess(worker_env(redis_url, model_server.url, tmp_path), log)
    try:
        wait_until(lambda: "Acquired scheduler lock" in log.read_text(), what="RQ's first line")
    finally:
        worker.stop()
    lines = json_lines(log.read_text())
    [rq_line] = [x for x in lines if x.get("logger") == "rq.scheduler"]
    assert rq_line["event"] == "Acquired scheduler lock for switchboard"
    assert rq_line["level"] == "info" and rq_line["timestamp"].endswith("Z")
    assert any(x["event"] == "worker_started" for x in lines)
    assert not [x for x in lines if "could not connect to Redis" in x["event"]]


def test_with_json_logs_a_slack_sdk_warning_is_one_json_object(json_logs, capsys):
    with FakeSlack() as slack:
        client = WebClient(token="xoxb-not-logged", base_url=slack.url)
        client.api_call("auth.test", auth=42)  # type: ignore[arg-type]  # slack_sdk warns, skips it
    said = capsys.readouterr().err
    [line] = [x for x in json_lines(said) if x.get("logger", "").startswith("slack_sdk")]
    assert line["event"].startswith("As the auth: 42")
    assert line["level"] == "warning" and "timestamp" in line
    assert "xoxb-not-logged" not in said


def test_library_lines_stay_plain_text_in_console_format(capsys):
    logs.configure("console", logging.INFO)
    logging.getLogger("rq.worker").warning("Worker %s: something", "w1")
    assert "rq.worker Worker w1: something" in capsys.readouterr().err


def test_configured_twice_a_library_line_is_written_once(json_logs, capsys):
    logs.configure("json", logging.WARNING)  # as the CLI does again for --verbose or a quiet verb
    logging.getLogger("rq.worker").warning("once")
    assert [x["event"] for x in json_lines(capsys.readouterr().err)] == ["once"]


@pytest.mark.slow
def test_an_idle_slot_waits_out_rqs_blocking_dequeue_on_the_start_up_connection(
    redis_conn, redis_url, model_server, tickets_db
):
    conn = redisconn.connect(redis_url)  # its start-up PING opens the pool's first connection
    try:
        worker = make_worker(make_runtime(conn, model_server.url))
        assert conn.connection_pool.connection_kwargs["socket_timeout"] >= (
            worker.connection_timeout
        )
        # Longer than redis-py's default read timeout (5 s), on that same pooled connection:
        # before, RQ's idle dequeue failed here with "Timeout reading from socket".
        assert conn.blpop(["sb:test:nothing"], 6) is None
    finally:
        conn.close()


INTERLEAVED = """
import logging, sys, threading
import structlog
from switchboard import logs

logs.configure("json", logging.INFO)
sys.setswitchinterval(1e-6)  # threads switch as often as they can: any split line shows
ours, rqs = structlog.get_logger("worker"), logging.getLogger("rq.worker")

def write(say, n):
    for i in range(n):
        say(f"line {i}")

threads = [threading.Thread(target=write, args=(say, 1500))
           for say in (ours.info, ours.info, rqs.warning, rqs.warning)]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_lines_from_our_loggers_and_the_libraries_never_split_each_other(tmp_path):
    """A worker's threads log at once through structlog (the runs) and the standard library
    (RQ's slots): each line is written whole, in one write, or a line ends up inside another
    and neither parses (a worker's `worker_started` was lost so, with RQ's first line)."""
    out = tmp_path / "stderr.log"
    with open(out, "wb") as stderr:
        subprocess.run(
            [sys.executable, "-c", INTERLEAVED], stderr=stderr, check=True, cwd=ROOT, timeout=120
        )
    lines = out.read_text().split("\n")
    assert lines.pop() == ""  # the last line ends with its newline
    assert len(json_lines("\n".join(lines))) == len(lines) == 6000


SIGNALLED = """
import logging, os, signal, sys, threading, time
import structlog
from switchboard import logs

logs.configure("json", logging.INFO)
WHO = sys.argv[1]

class SlowStderr:  # a write that blocks a while: a full pipe to a log collector that stalled
    def write(self, text):
        if "slow" in text:
            time.sleep(0.5)
        return sys.__stderr__.write(text)
    def flush(self):
        sys.__stderr__.flush()

sys.stderr = SlowStderr()
ours = structlog.get_logger("worker")

def on_signal(signum, frame):  # as worker/process.py Signals does on a second SIGTERM
    ours.warning("worker_stop_now")
    raise SystemExit(3)

signal.signal(signal.SIGUSR1, on_signal)
threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()
if WHO == "ours":
    ours.info("slow line")
else:
    logging.getLogger("rq.worker").warning("slow line")
"""


@pytest.mark.parametrize("writing", ["ours", "library"])
def test_a_signal_handler_that_logs_during_a_write_of_its_own_thread_goes_on(tmp_path, writing):
    """The lock that keeps lines whole is reentrant: a handler that logs while its thread
    was writing a line (a slow one, cut short by the exit) logs and exits, instead of waiting
    on itself for good (structlog's own per-file lock did, before)."""
    done = subprocess.run(
        [sys.executable, "-c", SIGNALLED, writing],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert [x["event"] for x in json_lines(done.stderr)] == ["worker_stop_now"]


STOPPED_MID_WRITE = """
import logging, os, signal, threading
from switchboard import logs
from worker.process import Signals

logs.configure("json", logging.INFO)
signals = Signals()  # the worker's: a first SIGTERM asks to stop, a second stops at once
main = threading.get_native_id()

def blocked() -> bool:  # the main thread waits in write(2): stderr's pipe is full
    try:
        with open(f"/proc/self/task/{main}/wchan") as wchan:
            return "pipe" in wchan.read()
    except OSError:
        return False

def wait_blocked() -> None:
    for _ in range(3000):  # 30 s at most: said, not hung, should it never block
        if blocked():
            return
        threading.Event().wait(0.01)
    os.write(1, b"never blocked\\n")

def twice() -> None:  # to the main thread: its write is cut (EINTR), handled, tried again
    wait_blocked()
    signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
    signals.stop.wait(30)
    wait_blocked()
    signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
    os.write(1, b"sent\\n")  # not through stdout's buffer: the process may be exiting

threading.Thread(target=twice, daemon=True).start()
print("ready", flush=True)
logging.getLogger("rq.worker").warning("big " + "x" * 300_000)  # more than the pipe holds
print("went on", flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_a_second_sigterm_during_a_blocked_log_write_stops_the_worker(tmp_path):
    """The second SIGTERM's handler logs, and that write may be refused (a reentrant call
    into stderr's buffer, which the first write holds): it stops all the same, instead of
    the refusal being swallowed by logging and the stop with it (found by review)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered stderr
    child = subprocess.Popen(
        [sys.executable, "-c", STOPPED_MID_WRITE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    assert child.stdout.readline() == "sent\n"  # both signals in, stderr still unread
    out, _err = child.communicate(timeout=60)  # reading stderr lets the blocked write go on
    assert child.returncode == 1 and "went on" not in out
