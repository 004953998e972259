"""Live policy across processes: the policy file rewritten under a running `switchboard
worker` (a real RQ worker in a child process) takes effect within the check interval, with
no restart; a broken rewrite is refused in one log line and the policy in force stays."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import tools.builtin
from tests.fakes.openai_server import Turn
from tests.support.processes import WorkerProcess, worker_env
from tests.support.runtime import ALICE, make_runtime, wait_for_run, wait_until
from tests.test_policy_watch import BROKEN, OPEN, WITHDRAWN, configmap, offered
from tools.policy import Policy
from tools.registry import registry
from worker import service

pytestmark = pytest.mark.slow

LOOKUP = Turn(tool_calls=[("knowledge_lookup", {"name": "Python Basics"})])
INTERVAL = 1.0


def log_events(path: Path, event: str) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and entry.get("event") == event:
            found.append(entry)
    return found


def ask(rt, model_server, words: str):
    model_server.route(words, [LOOKUP, "Done."])
    run = service.submit(rt, f"{words}: what is the fee for Python Basics?", ALICE)
    run = wait_for_run(rt, run.id, timeout=30)
    [request] = [r for r in model_server.chat_requests if words in json.dumps(r["messages"])][:1]
    kinds = {e.kind: e for e in rt.events.read(run.id)}
    return run, offered(request), kinds


def test_a_policy_rewritten_under_a_running_worker_withdraws_a_tool_without_a_restart(
    redis_conn, redis_url, model_server, tmp_path
):
    mount = tmp_path / "config"  # mounted as Kubernetes mounts a ConfigMap
    mount.mkdir()
    configmap(mount, OPEN, 1)
    path = mount / "policy.yaml"
    env = worker_env(
        redis_url,
        model_server.url,
        tmp_path,
        SWITCHBOARD_POLICY=str(path),
        SWITCHBOARD_TOOLS="tools.builtin",
        SWITCHBOARD_POLICY_CHECK_SECONDS=str(INTERVAL),
    )
    rt = make_runtime(redis_conn, model_server.url, policy_file=path)  # the asking side
    log = tmp_path / "worker.log"
    worker = WorkerProcess(env, log)
    try:
        wait_until(lambda: log_events(log, "policy_watch_started"), 30, "the worker to start")
        run, tools, kinds = ask(rt, model_server, "first")
        assert "knowledge_lookup" in tools and "tool_denied" not in kinds
        assert kinds["tool_result"].data["ok"] is True

        withdrawn = Policy.parse(WITHDRAWN, registry).version
        started = time.monotonic()
        configmap(mount, WITHDRAWN, 2)
        wait_until(lambda: log_events(log, "policy_reloaded"), 15, "the reload")
        took = time.monotonic() - started
        [reloaded] = log_events(log, "policy_reloaded")
        assert reloaded["version"] == withdrawn and took < INTERVAL + 2.0, took
        print(f"policy picked up {took:.2f}s after the rewrite (interval {INTERVAL}s)")

        rt.use_policy(Policy.load(path, registry))  # (the asking process's own watch)
        run, tools, kinds = ask(rt, model_server, "second")
        assert "knowledge_lookup" not in tools and "calculate" in tools
        assert kinds["tool_denied"].data["tool"] == "knowledge_lookup"
        assert "tool_result" not in kinds
        assert run.policy_version == withdrawn

        configmap(mount, BROKEN, 3)
        wait_until(lambda: log_events(log, "policy_reload_refused"), 15, "the refusal")
        run, tools, kinds = ask(rt, model_server, "third")  # the withdrawn policy stays
        assert "knowledge_lookup" not in tools and kinds["tool_denied"]
        [refused] = log_events(log, "policy_reload_refused")  # one line, once
        assert "unknown role 'admnis'" in refused["error"] and refused["keeping"] == withdrawn
        assert len(log_events(log, "policy_reloaded")) == 1
        assert worker.proc.poll() is None  # never restarted
    finally:
        worker.stop()


def test_sighup_makes_a_worker_look_at_the_policy_file_at_once(
    redis_conn, redis_url, model_server, tmp_path
):
    path = tmp_path / "policy.yaml"
    path.write_text(OPEN)
    env = worker_env(
        redis_url,
        model_server.url,
        tmp_path,
        SWITCHBOARD_POLICY=str(path),
        SWITCHBOARD_TOOLS="tools.builtin",
        SWITCHBOARD_POLICY_CHECK_SECONDS="0",  # never by itself: only the signal
    )
    log = tmp_path / "worker.log"
    worker = WorkerProcess(env, log)
    try:
        wait_until(lambda: log_events(log, "worker_started"), 30, "the worker to start")
        path.write_text(WITHDRAWN)
        os.kill(worker.pid, signal.SIGHUP)
        wait_until(lambda: log_events(log, "policy_reloaded"), 10, "the reload on SIGHUP")
        assert worker.proc.poll() is None
    finally:
        worker.stop()


def test_the_slack_bot_process_picks_up_a_rewritten_policy_too(redis_url, model_server, tmp_path):
    import socket
    import subprocess
    import sys

    from tests.fakes.slack_server import FakeSlack
    from tests.support.processes import ROOT

    path = tmp_path / "policy.yaml"
    path.write_text(OPEN)
    with socket.socket() as probe:  # a free port for the bot's HTTP server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with FakeSlack(tokens={"xoxb-good"}) as slack:
        env = worker_env(
            redis_url,
            model_server.url,
            tmp_path,
            SWITCHBOARD_POLICY=str(path),
            SWITCHBOARD_TOOLS="tools.builtin",
            SWITCHBOARD_POLICY_CHECK_SECONDS=str(INTERVAL),
            SLACK_API_URL=slack.url,
            SLACK_BOT_TOKEN="xoxb-good",
            SLACK_SIGNING_SECRET="test-secret",
        )
        log = tmp_path / "bot.log"
        with open(log, "wb") as out:
            bot = subprocess.Popen(
                [sys.executable, "-m", "switchboard", "bot", "--http", "--port", str(port)],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(lambda: log_events(log, "bot_started"), 30, "the bot to start")
            path.write_text(BROKEN)
            wait_until(lambda: log_events(log, "policy_reload_refused"), 15, "the refusal")
            path.write_text(WITHDRAWN)
            wait_until(lambda: log_events(log, "policy_reloaded"), 15, "the reload")
            [reloaded] = log_events(log, "policy_reloaded")
            tools.builtin.load()  # the tools the bot loaded, for the version here
            assert reloaded["version"] == Policy.parse(WITHDRAWN, registry).version
            assert bot.poll() is None
        finally:
            bot.terminate()
            bot.wait(15)
