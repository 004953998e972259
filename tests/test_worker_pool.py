"""worker/pool.py: a worker process carries its runs on one gevent hub (the default) or in OS
threads (`--pool threads`), with the same results, approvals and job timeouts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import NoReturn
from unittest import mock

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from rq.job import Job, JobStatus

from switchboard.settings import Config
from tests.fakes.openai_server import Fault, Script, Turn
from tests.support.mcp_servers import installed, write_config
from tests.support.processes import ROOT, WorkerProcess, logged, worker_env
from tests.support.runtime import approve_first, make_runtime, requester, wait_for_run, wait_until
from tools.builtin.tickets import TicketStore
from worker import pool, service
from worker.run import Run, RunStatus

pytestmark = pytest.mark.slow


def started_line(log: Path) -> dict:
    wait_until(lambda: logged(log, "worker_started"), timeout=60, what="the worker to start")
    for line in log.read_text().splitlines():
        if '"worker_started"' in line:
            return json.loads(line)
    raise AssertionError(log.read_text()[-2000:])


@pytest.mark.parametrize("chosen", ["gevent", "threads"])
def test_a_worker_process_answers_and_writes_once_after_approval_in_either_pool(
    chosen, redis_url, redis_conn, model_server, tmp_path, tickets_db
) -> None:
    for i in range(6):
        create = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": f"Jam {i}"})])
        model_server.route(f"Printer {i} ", [create, f"Filed jam {i}."])
    rt = make_runtime(redis_conn, model_server.url)
    log = tmp_path / "worker.log"
    env = worker_env(redis_url, model_server.url, tmp_path, SWITCHBOARD_TICKETS_DB=str(tickets_db))
    worker = WorkerProcess(env, log, "--pool", chosen, "--concurrency", "16")
    try:
        assert started_line(log)["pool"] == chosen
        people = [requester(rt, f"UPOOL{i}") for i in range(6)]
        runs = [
            service.submit(rt, f"Printer {i} jammed, file it", who) for i, who in enumerate(people)
        ]
        for run, who in zip(runs, people, strict=True):
            wait_for_run(rt, run.id, RunStatus.AWAITING_APPROVAL, timeout=30)
            approve_first(rt, run.id, user=who)
        for i, run in enumerate(runs):
            done = wait_for_run(rt, run.id, timeout=30)
            assert (done.status, done.answer) == (RunStatus.COMPLETED, f"Filed jam {i}.")
        found = TicketStore(tickets_db).search(project="IT", limit=50)
        titles = sorted(t["title"] for t in found["tickets"])
        assert (found["total"], titles) == (6, [f"Jam {i}" for i in range(6)])  # each once
        threads = psutil.Process(worker.pid).num_threads()
        if chosen == "gevent":  # the 16 slots are greenlets, not threads
            assert threads < 16, threads
        else:
            assert threads > 16, threads
    finally:
        worker.stop()


@pytest.mark.parametrize("chosen", ["gevent", "threads"])
def test_a_job_past_its_timeout_is_stopped_and_its_slot_serves_the_next_run(
    chosen, redis_url, redis_conn, model_server, tmp_path, tickets_db
) -> None:
    model_server.route("Fee", ["It costs 10."])
    rt = make_runtime(redis_conn, model_server.url)
    log = tmp_path / "worker.log"
    env = worker_env(redis_url, model_server.url, tmp_path)
    worker = WorkerProcess(env, log, "--pool", chosen, "--concurrency", "1")
    try:
        assert started_line(log)["pool"] == chosen
        job = rt.queue.enqueue("tests.support.jobs.dawdle", 120, job_timeout=1)
        wait_until(
            lambda: Job.fetch(job.id, connection=redis_conn).get_status() == JobStatus.FAILED,
            timeout=30,
            what="the job to time out",
        )
        result = Job.fetch(job.id, connection=redis_conn).latest_result()
        assert result is not None and "JobTimeoutException" in (result.exc_string or "")
        assert logged(log, "job_timed_out")
        run = service.submit(rt, "Fee for the course?", requester(rt, "UFEE"))
        assert wait_for_run(rt, run.id, timeout=30).answer == "It costs 10."
    finally:
        worker.stop()


def test_the_supervisor_gives_its_children_the_pool_it_was_asked_for(
    redis_url, redis_conn, model_server, tmp_path
) -> None:
    env = worker_env(redis_url, model_server.url, tmp_path, SWITCHBOARD_WORKER_POOL="gevent")
    log = tmp_path / "workers.log"
    workers = WorkerProcess(env, log, "--processes", "2", "--pool", "threads", "--concurrency", "2")
    try:
        wait_until(
            lambda: log.exists() and log.read_text().count('"worker_started"') == 2,
            timeout=60,
            what="both children to start",
        )
        pools = [
            json.loads(line)["pool"]
            for line in log.read_text().splitlines()
            if '"worker_started"' in line
        ]
        assert pools == ["threads", "threads"]
    finally:
        workers.stop()


# -- which pool a command line asks for, read before anything is imported ----------------------

WORDS = st.sampled_from(
    (
        *("worker", "--pool", "--poo", "--p", "--processes", "--proc", "--pool=threads"),
        *("--concurrency", "--conc=1", "gevent", "threads", "Threads", "2", "1", "--", "x"),
        "--burst",
    )
)
NAMES = st.sampled_from(
    [
        *(pool.ENV, pool.ENV.lower(), "SWITCHBOARD_WORKER_POOLS", pool.CONCURRENCY_ENV),
        *("WORKER_POOL", "worker_pool", "WORKER_CONCURRENCY", "worker_concurrency"),
    ]
)


@given(
    args=st.lists(st.one_of(WORDS, st.text(max_size=12)), max_size=8),
    env=st.dictionaries(
        NAMES,
        st.one_of(
            st.sampled_from((*pool.POOLS, "1", "2", "1.0")),
            # no NUL: os.environ cannot hold one (patch.dict would fail having cleared it)
            st.text(st.characters(blacklist_characters="\x00"), max_size=8),
        ),
    ),
)
def test_any_command_line_gives_what_the_parser_and_config_would_or_none(
    args: list[str], env: dict[str, str]
) -> None:
    """Whatever the line and the environment, the pool patched is the one the worker's own
    parser and Config then read, or none is, and they refuse the line or the value."""
    import argparse

    got = pool.requested(["worker", *args], env, env_file="/nonexistent/.env")
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.error = _raise  # type: ignore[method-assign]  # some errors skip exit_on_error
    parser.add_argument("verb")
    parser.add_argument("--pool", choices=pool.POOLS)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--burst", action="store_true")
    try:
        parsed = parser.parse_args(["worker", *args])
    except (argparse.ArgumentError, ValueError):
        return  # the worker's parser refuses the line: nothing runs, patched or not
    if parsed.processes != 1:
        assert got is None  # a supervisor (or refused): its children decide
        return
    if parsed.pool is not None:
        assert got == parsed.pool
        return
    with mock.patch.dict(os.environ, env, clear=True):
        try:
            config = Config(_env_file=None)
        except ValidationError:
            return  # Config refuses the environment: nothing runs, patched or not
    if config.worker_pool is not None:
        assert got == config.worker_pool
    else:
        slots = parsed.concurrency if parsed.concurrency is not None else config.worker_concurrency
        assert got == ("threads" if slots == 1 else "gevent")


def _raise(message: str) -> NoReturn:
    raise ValueError(message)


@pytest.mark.parametrize(
    ("args", "environ", "expected"),
    [
        (["worker"], {}, "gevent"),
        (["worker"], {pool.ENV: "threads"}, "threads"),
        (["worker"], {pool.ENV.lower(): "threads"}, "threads"),  # as pydantic-settings reads
        (["worker"], {pool.ENV: " Threads "}, None),  # Config refuses it
        (["worker", "--pool", "threads"], {pool.ENV: "gevent"}, "threads"),
        (["worker", "--poo", "threads"], {}, "threads"),  # argparse takes the prefix
        (["worker", "--pool=gevent"], {pool.ENV: "threads"}, "gevent"),
        (["worker", "--pool", "fibers"], {}, None),  # the parser says what is wrong
        (["worker"], {pool.ENV: "fibers"}, None),  # Config says what is wrong
        (["worker", "--processes", "2"], {}, None),  # a supervisor: its children decide
        (["worker", "--proc=2"], {}, None),
        (["worker", "--processes=1", "--pool", "threads"], {}, "threads"),
        (["worker", "--processes", "two"], {}, None),
        (["worker", "--p", "threads"], {}, None),  # ambiguous: the parser refuses it
        (["worker", "--", "--pool", "threads"], {}, "gevent"),
        # one slot: nothing to switch between, and a thread's wait costs less
        (["worker", "--concurrency", "1"], {}, "threads"),
        (["worker", "--conc=1"], {pool.CONCURRENCY_ENV: "64"}, "threads"),
        (["worker"], {pool.CONCURRENCY_ENV.lower(): "1"}, "threads"),
        (["worker", "--concurrency", "2"], {pool.CONCURRENCY_ENV: "1"}, "gevent"),
        (["worker", "--concurrency", "1"], {pool.ENV: "gevent"}, "gevent"),
        (["worker", "--concurrency", "1", "--pool", "gevent"], {}, "gevent"),
        # Config reads a setting by its field's name too, after its own name
        (["worker"], {"WORKER_POOL": "threads"}, "threads"),
        (["worker"], {"worker_pool": "threads", pool.ENV: "gevent"}, "gevent"),
        (["worker"], {"WORKER_CONCURRENCY": "1"}, "threads"),
    ],
)
def test_the_pool_comes_from_the_flag_then_the_environment_then_the_slots(
    args: list[str], environ: dict[str, str], expected: str | None
) -> None:
    assert pool.requested(args, environ, env_file="/nonexistent/.env") == expected


def test_the_pool_is_read_from_the_env_file_when_the_environment_has_none(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(f"{pool.ENV.lower()}=threads\n")
    assert pool.requested(["worker"], {}, env_file=str(env_file)) == "threads"
    assert pool.requested(["worker"], {pool.ENV: "gevent"}, env_file=str(env_file)) == "gevent"
    env_file.write_text(f"{pool.CONCURRENCY_ENV}=1\n")
    assert pool.requested(["worker"], {}, env_file=str(env_file)) == "threads"


# -- what runs in a gevent worker's one OS thread ----------------------------------------------


def test_a_second_sigterm_stops_a_gevent_worker_at_once_whichever_greenlet_it_lands_in(
    redis_url, redis_conn, model_server, tmp_path
) -> None:
    """The handler runs in whichever greenlet holds the thread (here most often the busy
    job's; the lifeline's when it signals its own process): a SystemExit raised there would
    end that greenlet only, and the worker would wait out its grace with a run in flight."""
    model_server.route("slow", Script(["The slow answer."], faults={0: [Fault.slow(60)]}))
    rt = make_runtime(redis_conn, model_server.url)
    log = tmp_path / "worker.log"
    env = worker_env(redis_url, model_server.url, tmp_path)
    worker = WorkerProcess(env, log, "--grace", "120", "--concurrency", "4")
    try:
        assert started_line(log)["pool"] == "gevent"
        run = service.submit(rt, "a slow one please", requester(rt, "USLOW"))
        wait_for_run(rt, run.id, RunStatus.RUNNING, timeout=30)
        wait_until(lambda: model_server.chats_open == 1, timeout=30, what="the model call")
        job = rt.queue.enqueue("tests.support.jobs.churn", 60, job_timeout=300)
        wait_until(
            lambda: Job.fetch(job.id, connection=redis_conn).get_status() == JobStatus.STARTED,
            timeout=30,
            what="the busy job to start",
        )
        worker.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: logged(log, "worker_stopping"), timeout=30, what="the first signal")
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait(20) == 1  # not the 120 s grace
        assert logged(log, "worker_stop_now")
    finally:
        worker.stop()


def test_an_async_tool_runs_in_a_gevent_worker_beside_the_mcp_servers_loop(
    redis_url, redis_conn, model_server, tmp_path
) -> None:
    """asyncio's running loop is per OS thread, and a gevent worker has one: with the MCP
    servers' loop running, `asyncio.run` in a slot raised "cannot be called from a running
    event loop"."""
    mcp_file = write_config(
        tmp_path / "mcp.yaml", {"time": {"command": installed("mcp-server-time")}}
    )
    call = Turn(tool_calls=[("echo_later", {"text": "hi"})])
    model_server.route("Echo", [call, "It said: echo: hi."])
    env = worker_env(
        redis_url,
        model_server.url,
        tmp_path,
        SWITCHBOARD_MCP=str(mcp_file),
        SWITCHBOARD_TOOLS="tests.support.async_tools",
    )
    done, said = asked_in_gevent(redis_conn, model_server, env, tmp_path, "Echo hi for me")
    assert (done.status, done.answer) == (RunStatus.COMPLETED, "It said: echo: hi.")
    assert "echo: hi" in said, said


def asked_in_gevent(
    redis_conn, model_server, env: dict[str, str], tmp_path: Path, question: str, *flags: str
) -> tuple[Run, list[str]]:
    """`question` answered by a gevent worker of `env`: the run as it ended, and what the
    model was last sent (the tools' results among it)."""
    rt = make_runtime(redis_conn, model_server.url)
    log = tmp_path / "worker.log"
    worker = WorkerProcess(env, log, *flags)
    try:
        assert started_line(log)["pool"] == "gevent"
        run = service.submit(rt, question, requester(rt, "UGREEN"))
        done = wait_for_run(rt, run.id, timeout=30)
        return done, [m["content"] for m in model_server.chat_requests[-1]["messages"]]
    finally:
        worker.stop()


def test_a_gevent_workers_slots_each_keep_their_own_spare_thread(
    redis_url, redis_conn, model_server, tmp_path
) -> None:
    """tools.threads keeps each slot's spare in a thread-local. Imported before the patch (by
    worker/pool.py), it was the OS thread's: the one all greenlets share, so every model and
    tool call started a thread of its own (32 us of CPU a call against 14-20 for the spare's,
    calls one after another)."""
    model_server.route("Where", [Turn(tool_calls=[("where_am_i", {})]), "Found."])
    env = worker_env(
        redis_url, model_server.url, tmp_path, SWITCHBOARD_TOOLS="tests.support.thread_tools"
    )
    done, said = asked_in_gevent(
        redis_conn, model_server, env, tmp_path, "Where do calls run?", "--concurrency", "4"
    )
    assert done.status == RunStatus.COMPLETED
    assert "spares kept per greenlet" in said, said


def test_code_that_holds_the_event_loop_is_said_with_where_it_was(
    redis_url, redis_conn, model_server, tmp_path
) -> None:
    rt = make_runtime(redis_conn, model_server.url)
    log = tmp_path / "worker.log"
    worker = WorkerProcess(worker_env(redis_url, model_server.url, tmp_path), log)
    try:
        assert started_line(log)["pool"] == "gevent"
        assert not logged(log, "worker_loop_blocked")
        job = rt.queue.enqueue("tests.support.jobs.hog", 3 * pool.BLOCKED_AFTER)
        wait_until(lambda: logged(log, "worker_loop_blocked"), timeout=30, what="the report")
        said = [
            json.loads(line)
            for line in log.read_text().splitlines()
            if "worker_loop_blocked" in line
        ]
        assert said[0]["level"] == "warning" and said[0]["seconds"] == pool.BLOCKED_AFTER
        assert any("jobs.py" in where and "hog" in where for where in said[0]["at"]), said[0]
        wait_until(
            lambda: Job.fetch(job.id, connection=redis_conn).get_status() == JobStatus.FINISHED,
            timeout=30,
            what="the job to finish",
        )
    finally:
        worker.stop()


# A slot waiting for a coroutine in the shared loop (an async tool) is stopped the way the
# watchdog stops a job past its timeout: the coroutine is cancelled with it.
STOPPED_WAITER = """
from worker import pool
pool.patch()
import asyncio
import gevent
from tools.mcp.loop import run_to_end

ended = []

async def forever():
    try:
        await asyncio.sleep(3600)
    finally:
        ended.append("cancelled")

slot = gevent.spawn(run_to_end, forever())
gevent.sleep(0.2)
slot.kill(RuntimeError, block=True)
for _ in range(250):
    if ended:
        break
    gevent.sleep(0.02)
print(ended)
"""


def test_a_coroutine_whose_waiting_slot_is_stopped_is_cancelled_not_left_running() -> None:
    done = subprocess.run(
        [sys.executable, "-c", STOPPED_WAITER],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['cancelled']", done.stdout
