"""What a process loads that its configuration does not use costs memory in every process of a
deployment: a worker or a bot with neither MCP servers nor per-user connections does not
import the `mcp` SDK (~25 MiB a process) or cryptography's Fernet (~6 MiB). Both were
imported by every process through the per-user connections' modules: a worker at rest went
from 110.7 to 84.1 MiB without them. A process with connection keys imports both as it
starts (the bot and workers; a command that only reads does not), not inside the first
connect click."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from tests.fakes.slack_server import FakeSlack
from tests.support.processes import worker_env

UNUSED = ("mcp", "cryptography.fernet")

# What `switchboard worker` and `switchboard bot` import, build and do before they serve (the
# bot's Slack app too, against FakeSlack), then which of UNUSED were imported.
LOADS = f"""
import os, sys
import switchboard.cli, switchboard.services_cli
import worker.process
from bot.transport.serve import build_app
from switchboard.settings import Config
from switchboard.startup import load_connections_sdk
from switchboard.wiring import open_runtime
rt = open_runtime(Config())
load_connections_sdk(rt)
build_app(rt, bot_token="xoxb-test", signing_secret="s", api_url=os.environ["SLACK_API_URL"])
print(sorted(m for m in {UNUSED!r} if m in sys.modules))
"""


def loaded(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", LOADS], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_process_with_no_mcp_server_or_connection_keys_loads_neither_sdk(
    redis_url: str, tmp_path: Path
) -> None:
    with FakeSlack() as slack:
        env = worker_env(redis_url, "http://127.0.0.1:9/v1", tmp_path, SLACK_API_URL=slack.url)
        assert loaded(env) == "[]"
        keys = Fernet.generate_key().decode()
        with_keys = {
            **env,
            "SWITCHBOARD_CONNECTION_KEYS": keys,
            "SWITCHBOARD_PUBLIC_URL": "https://sb.test",
        }
        assert loaded(with_keys) == str(sorted(UNUSED))


# What `switchboard bot` does before it serves, with a model configured; then a worker's
# start-up check of the model server (`check_model`), which the bot does not make.
BOT_THEN_CHECK = """
import os, sys
import switchboard.cli, switchboard.services_cli
from bot.transport.serve import build_app
from switchboard.settings import Config
from switchboard.startup import check_model, load_connections_sdk
from switchboard.wiring import open_runtime
rt = open_runtime(Config())
load_connections_sdk(rt)
build_app(rt, bot_token="xoxb-test", signing_secret="s", api_url=os.environ["SLACK_API_URL"])
print("BOT", rt.model.model, "openai" in sys.modules, "httpcore2" in sys.modules)
check_model(rt)
print("CHECKED", "openai" in sys.modules)
"""


@pytest.mark.parametrize("selector", ["bm25", "embeddings"])
def test_the_bot_does_not_load_the_openai_sdk_that_a_worker_loads_to_call_the_model(
    redis_url: str, tmp_path: Path, selector: str
) -> None:
    """The bot never calls the model (~19 MiB a process for the SDK, 4.5 MiB more for the
    HTTP library under it that a worker posts completions with): it knows the model's
    name, for the runs it creates; the SDK is loaded by the first request, as a worker's
    start-up check makes it (the demonstrations' embeddings selector too: by its first
    text embedded, which the bot never asks for)."""
    with FakeSlack() as slack:
        env = worker_env(redis_url, "http://127.0.0.1:9/v1", tmp_path, SLACK_API_URL=slack.url)
        done = subprocess.run(
            [sys.executable, "-c", BOT_THEN_CHECK],
            env={**env, "SWITCHBOARD_MODEL": "gpt-named", "SWITCHBOARD_DEMO_SELECTOR": selector},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stdout.splitlines() if line.startswith(("BOT", "CHECKED"))]
    assert said == ["BOT gpt-named False False", "CHECKED True"]


# `python -m switchboard ARGS` as a shell runs it, then whether redis-py, OpenTelemetry's
# metrics SDK, structlog and rich were imported.
COMMAND = """
import runpy, sys
sys.argv = ["switchboard", *sys.argv[1:]]
try:
    runpy.run_module("switchboard", run_name="__main__")
except SystemExit:
    pass
print("LOADED", "redis" in sys.modules, "opentelemetry.sdk.metrics" in sys.modules)
print("LOGS", "structlog" in sys.modules, "rich" in sys.modules)
"""


@pytest.mark.parametrize("args", [["bot", "--help"], ["worker", "--help"], ["status"]])
def test_commands_do_not_load_the_metrics_sdk_that_redis_py_would_import(
    redis_url: str, tmp_path: Path, args: list[str]
) -> None:
    """redis-py imports OpenTelemetry's metrics SDK when it is installed (as it is, for
    traces), to learn whether it could record metrics Switchboard never asks for: ~0.5 s of a
    loaded machine's start-up and 2 MiB of an idle bot. The verbs' modules import redis before
    the command runs (the bot's and the worker's through approvals): a hiding done only in
    `run` came too late for them (`status`, whose module does not, is the `run` path).
    Likewise structlog and `rich` (installed here by import-linter, never in a deployment):
    4.8 MiB of every process."""
    import importlib.util

    assert importlib.util.find_spec("rich") is not None  # else this proves nothing of it
    env = worker_env(redis_url, "http://127.0.0.1:9/v1", tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", COMMAND, *args], env=env, capture_output=True, text=True, timeout=120
    )
    said = [line for line in done.stdout.splitlines() if line.startswith(("LOADED", "LOGS"))]
    assert said == ["LOADED True False", "LOGS True False"], (
        done.stdout[-1000:],
        done.stderr[-2000:],
    )
