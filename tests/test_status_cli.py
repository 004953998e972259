"""`switchboard status` as an operator or a probe runs it: the real command in a subprocess,
against a real worker process, a real Redis and the fake model server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import Turn
from tests.support.processes import ROOT, WorkerProcess, worker_env
from tests.support.redis_server import free_port
from tests.support.runtime import ALICE, make_runtime, wait_for_run, wait_until
from worker import service
from worker.fleet import read_fleet
from worker.run import RunStatus

pytestmark = pytest.mark.slow

CREATE = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "VPN is down"})])


def status(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "switchboard", "status", *args],
        env=env,
        cwd=env["XDG_DATA_HOME"],  # no .env there
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr


def as_json(env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    code, out, err = status(env, "--json")
    assert not err.strip(), err
    return code, json.loads(out)


def env_for(redis_url: str, model_url: str, tmp: Path) -> dict[str, str]:
    env = worker_env(redis_url, model_url, tmp)
    Path(env["XDG_DATA_HOME"]).mkdir(parents=True, exist_ok=True)
    return env


def test_with_a_worker_running_status_is_healthy_and_counts_what_waits(
    redis_conn, redis_url, model_server, tmp_path
):
    env = env_for(redis_url, model_server.url, tmp_path)
    rt = make_runtime(redis_conn, model_server.url)
    model_server.route("VPN", [CREATE, "Filed it."])
    worker = WorkerProcess(env, tmp_path / "worker.log", "--concurrency", "3")
    try:
        wait_until(lambda: read_fleet(redis_conn, rt.queue.name).slots == 3, what="3 slots")
        run = service.submit(rt, "the VPN is down, file a ticket", ALICE)
        wait_for_run(rt, run.id, RunStatus.AWAITING_APPROVAL)
        code, report = as_json(env)
        text_code, text, _ = status(env)
    finally:
        worker.stop()
    assert code == 0 and report["healthy"] is True and report["problems"] == []
    assert report["redis_ok"] and report["model_ok"]
    assert report["workers"] == 1 and report["slots"] == 3
    [one] = report["worker_list"]
    assert one["worker"].endswith(f".{worker.pid}") and one["slots"] == 3
    assert report["queue_depth"] == 0 and report["runs_running"] == 0
    assert report["approvals_pending"] == 1 and 0 <= report["oldest_approval_seconds"] < 60
    assert text_code == 0 and text.splitlines()[0] == "healthy"
    assert "workers    1 alive, 3 slots, 0 busy" in text
    assert "approvals  1 pending, the oldest" in text


def test_with_no_worker_status_is_unhealthy_and_says_why(
    redis_conn, redis_url, model_server, tmp_path
):
    env = env_for(redis_url, model_server.url, tmp_path)
    rt = make_runtime(redis_conn, model_server.url)
    service.submit(rt, "what is 2 + 3?", ALICE)  # one job waits, nobody takes it
    code, report = as_json(env)
    assert code == 1 and report["healthy"] is False
    assert report["redis_ok"] and report["model_ok"] and report["workers"] == 0
    assert report["queue_depth"] == 1
    [problem] = report["problems"]
    assert problem.startswith("no live worker takes jobs from the queue 'switchboard'")
    text_code, text, _ = status(env)
    assert (
        text_code == 1 and text.splitlines()[0] == "UNHEALTHY" and "problem: no live worker" in text
    )


def test_with_redis_down_status_is_unhealthy_in_its_own_words(model_server, tmp_path):
    env = env_for(f"unix://{tmp_path}/no-redis.sock", model_server.url, tmp_path)
    code, report = as_json(env)
    assert code == 1 and report["redis_ok"] is False and report["model_ok"] is True
    [problem] = report["problems"]
    assert problem.startswith("Redis: cannot reach Redis")


def test_with_the_model_server_down_status_is_unhealthy_naming_it(
    redis_conn, redis_url, tmp_path, model_server
):
    port = free_port()
    env = env_for(redis_url, f"http://127.0.0.1:{port}/v1", tmp_path)
    code, report = as_json(env)
    assert code == 1 and report["model_ok"] is False
    assert any(
        p.startswith(f"model server 127.0.0.1:{port}: could not reach") for p in report["problems"]
    )


def test_status_help_says_what_healthy_means():
    done = subprocess.run(
        [sys.executable, "-m", "switchboard", "status", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "healthy means all three: Redis answers, at least one worker process is alive" in (
        done.stdout.replace("\n", " ").replace("  ", " ")
    )
