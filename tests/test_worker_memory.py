"""A worker process gives its free memory back to the system once each time it goes idle,
never while a run is in flight (worker/memory.py, issue 28)."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
from collections.abc import Iterator

import psutil
import pytest

from switchboard import redisconn
from tests.support.processes import WorkerProcess, worker_env
from tests.support.runtime import ALICE, make_runtime, wait_for_run, wait_until
from worker import memory, service
from worker.process import serve
from worker.run import RunStatus

glibc = pytest.mark.skipif(not memory.available(), reason="malloc_trim is glibc's")


@glibc
def test_trim_gives_back_the_free_memory_inside_the_heap_not_only_its_top():
    # 32 MiB in 64 KiB blocks (malloc's, not Python's small-object allocator, and under the
    # mmap threshold), every 16th kept, the last one too: the heap's top stays in use, so
    # free() gives none of the 30 MiB between the kept blocks back; malloc_trim does.
    blocks = [b"x" * (64 * 1024) for _ in range(512)]
    kept = blocks[15::16]
    del blocks
    before = memory.rss_kib()
    assert memory.trim()
    assert before - memory.rss_kib() > 16 * 1024
    assert len(kept) == 32


@pytest.fixture
def no_sigterm_exit() -> Iterator[None]:
    """SIGTERM stops the worker loop this test runs in its main thread; should the signal
    come when that loop has already ended, it must not end pytest."""
    previous = signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_a_worker_releases_memory_once_per_idle_period_and_never_while_a_slot_is_busy(
    redis_conn, redis_url, model_server, no_sigterm_exit
):
    answers = threading.Semaphore(0)  # the model answers a run only when the test says so

    def held_answer(body: dict[str, object]) -> str | None:
        if "idle memory" not in json.dumps(body):
            return None
        assert answers.acquire(timeout=30)
        return "Done."

    model_server.route(held_answer)
    # connected as a process is (named after it), so that stopping wakes its idle slots
    rt = make_runtime(redisconn.connect(redis_url), model_server.url)
    in_flight_at_release: list[int] = []

    def release() -> None:
        in_flight_at_release.append(len(rt.leases.held()))
        memory.release()

    hook = memory.IdleHook(release, min_interval=0)
    serving = threading.Event()
    failures: list[BaseException] = []

    def turns_pass(what: str) -> None:
        """The worker's main loop looks at its slots three more times."""
        seen = hook.ticks
        wait_until(lambda: hook.ticks >= seen + 3, what=what)

    def one_busy_period(question: str, releases_before: int) -> None:
        run = service.submit(rt, question, ALICE)
        wait_until(lambda: run.id in rt.leases.held(), what="the run in flight in a slot")
        turns_pass("the main loop looking while the run is in flight")
        assert hook.runs == releases_before  # nothing released while a slot is busy
        answers.release()
        assert wait_for_run(rt, run.id).status == RunStatus.COMPLETED
        wait_until(lambda: hook.runs == releases_before + 1, what="the release once idle")
        turns_pass("the main loop looking at its idle slots")
        assert hook.runs == releases_before + 1  # once per idle period, not at every turn

    def drive() -> None:
        try:
            wait_until(serving.is_set, what="the worker loop started")
            turns_pass("the main loop looking at its idle slots before any work")
            assert hook.runs == 0  # idle since start: nothing to give back yet
            one_busy_period("idle memory: the first question", 0)
            one_busy_period("idle memory: the second question", 1)
        except BaseException as exc:  # reported by the test's own thread below
            failures.append(exc)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # the worker loop's stop

    def on_tick(busy: bool) -> object:
        serving.set()
        return hook.observe(busy)

    driver = threading.Thread(target=drive, name="test-driver")
    driver.start()
    try:
        serve(rt, concurrency=2, grace=5.0, on_tick=on_tick)
    finally:
        driver.join(60)
        rt.redis.close()
    if failures:
        raise failures[0]
    assert in_flight_at_release == [0, 0]


def test_the_idle_hook_waits_its_interval_and_then_serves_the_period_it_skipped():
    now = [100.0]
    ran: list[float] = []
    hook = memory.IdleHook(lambda: ran.append(now[0]), min_interval=1.0, clock=lambda: now[0])
    for busy in (False, True, False, False):
        hook.observe(busy)
    assert ran == [100.0]
    now[0] = 100.5
    hook.observe(True)
    hook.observe(False)  # idle again within the interval: not yet
    assert ran == [100.0]
    now[0] = 101.0
    hook.observe(False)  # still idle once the interval has passed: served now
    hook.observe(False)
    assert ran == [100.0, 101.0]


def test_every_connection_reads_into_a_small_buffer(redis_url):
    # A connection keeps its read buffer for its life: redis-py's 32 KiB each was 32 MiB of a
    # worker at 1,000 slots, one connection each (bench/bench_latency.py --large).
    conn = redisconn.connect(redis_url)
    held = [conn.connection_pool.get_connection() for _ in range(3)]
    try:
        assert {len(c._parser._buffer) for c in held} == {2 * 1024}  # hiredis's buffer
    finally:
        for c in held:
            conn.connection_pool.release(c)
        conn.close()


@glibc
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, "glibc.malloc.tcache_count=0"),
        ("glibc.malloc.tcache_count=7", "glibc.malloc.tcache_count=7"),  # the operator's
    ],
)  # (glibc cuts the value it parsed at its first ':' in /proc/PID/environ: one tunable here)
def test_a_worker_process_runs_without_the_threads_malloc_caches(
    given, expected, redis_url, model_server, tmp_path
):
    env = worker_env(redis_url, model_server.url, tmp_path)
    env.pop("GLIBC_TUNABLES", None)
    if given is not None:
        env["GLIBC_TUNABLES"] = given
    log = tmp_path / "worker.log"
    worker = WorkerProcess(env, log, "--concurrency", "3")
    try:
        wait_until(lambda: "worker_started" in log.read_text(), what="the worker's start")
        # the same process (its supervisor's child, its PID), started again with the setting
        # and its arguments
        assert worker.proc.poll() is None
        assert psutil.Process(worker.pid).environ().get("GLIBC_TUNABLES") == expected
        with open(f"/proc/{worker.pid}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[-3:-1] == [b"--concurrency", b"3"]
        assert '"concurrency": 3' in log.read_text()
    finally:
        worker.stop()


def test_the_setting_is_added_once_and_an_operators_choice_is_kept():
    tuned = memory.tuned_environment({"PATH": "/bin"})
    if not memory.available():
        assert tuned is None
        return
    assert tuned == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}
    assert memory.tuned_environment(tuned) is None  # no second start
    for theirs in (
        "glibc.malloc.tcache_count=7",
        "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=7",
    ):
        assert memory.tuned_environment({"GLIBC_TUNABLES": theirs}) is None
    kept = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count_x=1"}  # not the same tunable
    assert memory.tuned_environment(kept) == {
        "GLIBC_TUNABLES": "glibc.malloc.tcache_count_x=1:glibc.malloc.tcache_count=0"
    }


@pytest.mark.parametrize("given", ["", "glibc.malloc.arena_max=2"])
def test_the_process_started_again_gives_its_children_the_environment_it_was_given(
    given, monkeypatch
):
    # as `reexec_with_tunables` leaves it for the process it starts again: glibc has read
    # the setting by then; what this process starts (the embedded Redis, tools) should not
    monkeypatch.setenv(
        "GLIBC_TUNABLES", (given + ":" if given else "") + "glibc.malloc.tcache_count=0"
    )
    monkeypatch.setenv(memory.GIVEN, given)
    memory.reexec_with_tunables()  # returns: it is the process started again
    assert os.environ.get("GLIBC_TUNABLES") == (given or None)
    assert memory.GIVEN not in os.environ


def test_a_worker_process_keeps_what_start_up_made_out_of_the_collectors_sight(
    redis_url, model_server, tmp_path
):
    """At 1,000 runs a process's full collections walked start-up's objects five times a
    burst, 0.27 s each with every run stopped: they are frozen once the worker is up."""
    log = tmp_path / "worker.log"
    worker = WorkerProcess(worker_env(redis_url, model_server.url, tmp_path), log)
    try:
        wait_until(lambda: "worker_started" in log.read_text(), what="the worker's start")
        [started] = [
            json.loads(line) for line in log.read_text().splitlines() if "worker_started" in line
        ]
        assert started["gc_frozen"] > 10_000  # modules, classes, the registry: ~100,000
    finally:
        worker.stop()


def test_going_idle_collects_the_garbage_the_collector_now_leaves_longer(monkeypatch):
    """With the youngest generation collected every 10,000 allocations, cycles a burst left
    wait longer: going idle collects them, before the free memory is handed back."""
    import gc

    from structlog.testing import capture_logs

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    monkeypatch.setattr(memory, "_collected_at", -math.inf)  # none in this process yet
    gc.disable()  # none collected before `release` is asked to
    try:
        for _ in range(100):
            Cycle()  # garbage only a collection finds
        with capture_logs() as said:
            memory.release()
    finally:
        gc.enable()
    [released] = [x for x in said if x["event"] == "worker_memory_released"]
    assert released["collected"] >= 100
    # idle again within the minute: only the trim (at 1,000 slots a collection takes 60-100
    # ms, and a trickle of runs makes the process go idle every second or two)
    with capture_logs() as said:
        memory.release()
    [again] = [x for x in said if x["event"] == "worker_memory_released"]
    assert again["collected"] is None
