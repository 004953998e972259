"""Runs cross processes: suspended in one worker, resumed in another; inspected by the CLI."""

from __future__ import annotations

import os

import pytest

from switchboard.cli import main
from tests.fakes.openai_server import Turn
from tests.support.processes import WorkerProcess, worker_env
from tests.support.runtime import ALICE, approve_first, make_runtime, wait_until, work
from tools.builtin.tickets import TicketStore
from worker import service
from worker.run import RunStatus

pytestmark = pytest.mark.slow

CREATE = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Printer jam"})])


def test_approval_resumes_the_run_in_another_worker_process(
    redis_conn, redis_url, model_server, tmp_path, monkeypatch, capsys
):
    tickets = tmp_path / "tickets.sqlite3"
    monkeypatch.setenv("SWITCHBOARD_TICKETS_DB", str(tickets))
    model_server.route("Printer", [CREATE, "Filed ticket #1 for the printer jam."])
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "Printer jam on floor 2, file a ticket", ALICE)
    work(rt)  # this process takes the run as far as the approval
    run = rt.store.load(run.id)
    assert run.status == RunStatus.AWAITING_APPROVAL

    worker = WorkerProcess(worker_env(redis_url, model_server.url, tmp_path), tmp_path / "w.log")
    try:
        approve_first(rt, run.id)
        wait_until(lambda: rt.store.load(run.id).status.terminal, what="the run to end")
    finally:
        worker.stop()

    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED, run.detail
    [started] = [e for e in rt.events.read(run.id) if e.kind == "write_started"]
    assert started.data["pid"] == worker.pid != os.getpid()
    assert TicketStore(tickets).count_executions("create_ticket") == 1

    # `switchboard runs show ID` prints the whole trajectory, including who decided
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("OPENAI_BASE_URL", model_server.url)
    capsys.readouterr()
    assert main(["runs", "show", run.id]) == 0
    shown = capsys.readouterr().out
    for expected in (
        "Run " + run.id + ": completed",
        "create_ticket",
        '"title":"Printer jam"',
        "approved by UALICE",
        "write started",
        "Filed ticket #1",
        "tokens",
        "Totals: 2 steps",
    ):
        assert expected in shown, (expected, shown)
    assert main(["runs", "show", run.id, "--json"]) == 0
    assert '"approval_decided"' in capsys.readouterr().out
    assert main(["runs", "list"]) == 0
    assert run.id in capsys.readouterr().out


def test_worker_processes_are_restarted_when_one_dies(
    redis_conn, redis_url, model_server, tmp_path
):
    import signal
    import subprocess
    import sys

    from rq import Worker

    from tests.support.processes import ROOT

    env = worker_env(redis_url, model_server.url, tmp_path)
    parent = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "worker", "--processes", "2"],
        env=env,
        cwd=ROOT,
        stdout=open(tmp_path / "workers.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    try:

        def pids() -> set[int]:
            return {w.pid for w in Worker.all(connection=redis_conn) if w.pid}

        first = wait_until(lambda: len(pids()) >= 2 and pids(), timeout=30, what="two workers")
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: pids() - first, timeout=30, what="a replacement worker")
        model_server.route("still there", ["yes"])
        rt = make_runtime(redis_conn, model_server.url)
        run = service.submit(rt, "still there?", ALICE)
        wait_until(lambda: rt.store.load(run.id).status.terminal, timeout=30, what="the run to end")
    finally:
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(30) == 0
