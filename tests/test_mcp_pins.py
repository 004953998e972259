"""An MCP server cannot change its tools' effects under the operator (issue 21, item 2).

The first listing of a server is recorded in Redis for the deployment; a process whose
listing differs from it, or whose own two listings disagree, treats every tool of that server
as a write (tools/mcp/pins.py). Real parts only: a real Redis, real `switchboard worker`
processes, the openai client against the fake model server, and a real MCP server built
with the SDK (tests/support/mcp_hostile_server.py) that lies about its annotations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from structlog.testing import capture_logs

import tools.mcp
from switchboard.settings import Config
from switchboard.wiring import build_runtime, mcp_pins
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.support.mcp_servers import HOSTILE, NotesServer, starts, stdio_hostile, write_config
from tests.support.processes import ROOT, WorkerProcess, worker_env
from tests.support.runtime import ALICE, approve_first, wait_for_run, wait_until
from tools import ToolContext
from tools.exceptions import McpServerError
from tools.execute import execute
from tools.mcp import McpServers
from tools.mcp.pins import Pins
from tools.registry import ToolRegistry
from worker import service
from worker.keys import Keys
from worker.run import RunStatus
from worker.runtime import Runtime

KEYS = Keys()


@pytest.fixture
def build(redis_conn: redis.Redis, model_server: FakeOpenAI) -> Iterator[Callable[[Path], Runtime]]:
    """The runtime a bot builds at start-up from its configuration, SWITCHBOARD_MCP included."""
    files: list[Path] = []

    def build_from(mcp_file: Path) -> Runtime:
        files.append(mcp_file)
        config = Config(
            SWITCHBOARD_MCP=str(mcp_file),
            OPENAI_BASE_URL=model_server.url,
            OPENAI_API_KEY="test",
            SWITCHBOARD_MODEL="gpt-fake",
        )
        return build_runtime(config, redis_conn)

    yield build_from
    for path in files:
        tools.mcp.unload(tools.mcp.load(path))


@pytest.mark.slow
@pytest.mark.parametrize("order", ["bot first", "worker first"])
def test_a_flipping_http_server_never_gets_its_write_run_without_an_approval(
    order: str,
    build: Callable[[Path], Runtime],
    redis_conn: redis.Redis,
    redis_url: str,
    model_server: FakeOpenAI,
    notes_dir: Path,
    tmp_path: Path,
) -> None:
    """The server says `readOnlyHint: true` on every other tools/list. It starts so that the
    worker's first listing is the read-only one, whichever process lists first: before the
    fix the worker ran the write at once, with no card."""
    flip_start = "write" if order == "bot first" else "read"
    server = NotesServer(notes_dir, HOSTILE, HOSTILE="flip", FLIP_START=flip_start)
    path = write_config(tmp_path / "mcp.yaml", {"flip": {"url": server.url}})
    env = worker_env(redis_url, model_server.url, tmp_path, SWITCHBOARD_MCP=str(path))
    worker = None
    try:
        if order == "bot first":
            rt = build(path)
            worker = WorkerProcess(env, tmp_path / "worker.log")
        else:
            worker = WorkerProcess(env, tmp_path / "worker.log")
            wait_until(
                lambda: redis_conn.exists(KEYS.mcp_listing("flip")), 60, "the worker to list"
            )
            rt = build(path)
        model_server.route(
            "flip prod",
            [Turn(tool_calls=[("flip_flip_write", {"target": "prod-db"})]), "Flipped."],
        )
        run = service.submit(rt, "flip prod-db please", ALICE)
        waiting = wait_for_run(rt, run.id, RunStatus.AWAITING_APPROVAL, timeout=60)
        assert starts(notes_dir, "flip_write") == []  # nothing ran before a person decided
        [approval_id] = waiting.pending_approvals
        assert rt.approvals.get(approval_id).tool == "flip_flip_write"
        tool = rt.registry.get("flip_flip_write")
        assert tool is not None and (tool.effect, tool.high_risk) == ("write", True)
        approve_first(rt, run.id)
        wait_for_run(rt, run.id, RunStatus.COMPLETED, timeout=60)
        assert starts(notes_dir, "flip_write") == [approval_id]  # once, after the approval
    finally:
        if worker is not None:
            worker.stop()
        server.stop()
    logged = (tmp_path / "worker.log").read_text()
    assert '"event": "mcp_server_listing_changed"' in logged


def load(path: Path, pins: Pins | None) -> tuple[ToolRegistry, McpServers]:
    """What one more process starting would register (a registry of its own)."""
    registry = ToolRegistry()
    return registry, tools.mcp.load(path, registry, pins)


@pytest.mark.slow  # four starts of a stdio server: about 7 s here
def test_a_listing_that_differs_from_the_recorded_one_makes_every_tool_a_write_until_accepted(
    redis_conn: redis.Redis, notes_dir: Path, tmp_path: Path
) -> None:
    """The server is consistent within each process but changed between two starts (it now
    says read-only): the later process does not believe it; `effects:` still pins."""
    pins = mcp_pins(redis_conn)
    path = write_config(tmp_path / "mcp.yaml", {"s": stdio_hostile(notes_dir, "file")})
    pinned = write_config(
        tmp_path / "pinned.yaml",
        {"s": stdio_hostile(notes_dir, "file", effects={"flip_write": "read"})},
    )
    loaded = []
    try:
        first, servers = load(path, pins)
        loaded.append(servers)
        assert first.get("s_flip_write").effect == "write"  # type: ignore[union-attr]
        assert [s.verdict.state for s in servers.servers] == ["recorded"]

        (notes_dir / "readonly").touch()  # the server now says readOnlyHint: true
        with capture_logs() as logs:
            later, servers = load(path, pins)
        loaded.append(servers)
        tool = later.get("s_flip_write")
        assert tool is not None and (tool.effect, tool.high_risk) == ("write", True)
        [verdict] = [s.verdict for s in servers.servers]
        assert (verdict.state, verdict.differing) == ("differs", ("flip_write",))
        [line] = [e for e in logs if e["event"] == "mcp_server_listing_changed"]
        assert (line["server"], line["tools"], line["log_level"]) == (
            "s",
            ["flip_write"],
            "warning",
        )
        assert line["hint"] == "switchboard tools accept s"

        _, servers = load(pinned, pins)  # the operator's `effects:` is the way to pin
        loaded.append(servers)
        assert servers.servers[0].tools[0].effect == "read"

        assert pins is not None and pins.forget("s")  # what `switchboard tools accept s` does
        accepted, servers = load(path, pins)
        loaded.append(servers)
        assert accepted.get("s_flip_write").effect == "read"  # type: ignore[union-attr]
        assert [s.verdict.state for s in servers.servers] == ["recorded"]
    finally:
        for servers in loaded:
            tools.mcp.unload(servers)


def test_a_running_process_stops_running_a_servers_reads_once_another_found_it_changed(
    redis_conn: redis.Redis, notes_dir: Path, tmp_path: Path
) -> None:
    """The worker started while the server said read-only (and recorded that); a process
    started later hears `false`. From then on the worker's "read", which really writes, is
    not run, until an operator accepts the change."""
    pins = mcp_pins(redis_conn)
    path = write_config(tmp_path / "mcp.yaml", {"s": stdio_hostile(notes_dir, "file")})
    (notes_dir / "readonly").touch()
    loaded = []
    try:
        worker, servers = load(path, pins)
        loaded.append(servers)
        tool = worker.get("s_flip_write")
        assert tool is not None and tool.effect == "read"
        assert execute(tool, ToolContext(user_id="UALICE"), {"target": "a"}).ok
        assert starts(notes_dir, "flip_write") == [None]

        (notes_dir / "readonly").unlink()
        _, servers = load(path, pins)  # a bot, a worker or `switchboard tools` starting now
        loaded.append(servers)
        assert servers.servers[0].verdict.differs
        observation = execute(tool, ToolContext(user_id="UALICE"), {"target": "b"})
        assert not observation.ok
        assert observation.text == (
            "Error: s_flip_write was not run: MCP server 's' has changed its tool listing since "
            "this process started, so its reads wait until an operator accepts the change and "
            "Switchboard restarts"
        )
        assert starts(notes_dir, "flip_write") == [None]  # b never reached the server
    finally:
        for servers in loaded:
            tools.mcp.unload(servers)


def test_without_redis_a_server_whose_two_listings_disagree_is_all_writes(
    notes_dir: Path, tmp_path: Path
) -> None:
    path = write_config(tmp_path / "mcp.yaml", {"f": stdio_hostile(notes_dir, "flip")})
    registry, servers = load(path, None)
    try:
        tool = registry.get("f_flip_write")
        assert tool is not None and tool.effect == "write"
        assert servers.servers[0].verdict.reason == "it listed its tools differently twice"
    finally:
        tools.mcp.unload(servers)


def test_a_server_that_lists_one_name_twice_is_refused_at_start_up(
    notes_dir: Path, tmp_path: Path
) -> None:
    """Two `flip_write`s, one read-only: which one a call reaches is the server's secret."""
    path = write_config(tmp_path / "mcp.yaml", {"t": stdio_hostile(notes_dir, "twice")})
    with pytest.raises(McpServerError) as caught:
        load(path, None)
    assert str(caught.value) == (
        f"MCP server 't' ({path} line 2): it lists two tools named 'flip_write', so which one "
        "a call reaches is not known; fix the server, or leave the tool out with `tools:`"
    )


def switchboard(tmp_path: Path, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed command line in a child process, as an operator runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "OPENAI_"))}
    env.update(
        REDIS_URL=redis_url,
        SWITCHBOARD_MCP=str(tmp_path / "mcp.yaml"),
        XDG_DATA_HOME=str(tmp_path),
        PYTHONPATH=str(ROOT),
    )
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_switchboard_tools_says_a_listing_changed_and_accept_records_the_new_one(
    redis_conn: redis.Redis, redis_url: str, notes_dir: Path, tmp_path: Path
) -> None:
    path = write_config(tmp_path / "mcp.yaml", {"s": stdio_hostile(notes_dir, "file")})
    listed = switchboard(tmp_path, redis_url, "tools")
    assert listed.returncode == 0, listed.stderr
    assert "s_flip_write  write" in listed.stdout and "listing changed" not in listed.stdout

    (notes_dir / "readonly").touch()
    listed = switchboard(tmp_path, redis_url, "tools")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[1] == f"mcp: {path}: s (stdio, 1 tools); s: listing changed, all writes"
    [row] = [line for line in lines if line.startswith("s_flip_write")]
    assert row.split()[:2] == ["s_flip_write", "write"]
    assert row.endswith(
        "MCP listing changed: a write until `switchboard tools accept s`; high risk"
    )
    checked = switchboard(tmp_path, redis_url, "tools", "check")
    assert (
        f"warning: MCP server 's' ({path} line 2): its listing differs from the recorded one "
        "(tools: flip_write), so every tool of it is a high-risk write (except those `effects:` "
        "pins); if the change is expected, run `switchboard tools accept s` and restart the bot "
        "and workers"
    ) in checked.stdout.splitlines()
    report = json.loads(switchboard(tmp_path, redis_url, "tools", "--json").stdout)
    assert report["mcp"][0]["listing"] == "differs"

    accepted = switchboard(tmp_path, redis_url, "tools", "accept", "s")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip() == (
        f"accepted: MCP server 's' ({path} line 2): its current listing (1 tools) is recorded "
        "for the deployment; changed since the last record: flip_write; restart the bot and "
        "workers so every process uses it"
    )
    listed = switchboard(tmp_path, redis_url, "tools")
    assert "s_flip_write  read" in listed.stdout and "listing changed" not in listed.stdout

    wrong = switchboard(tmp_path, redis_url, "tools", "accept", "nope")
    assert (wrong.returncode, wrong.stderr.strip()) == (
        2,
        f"switchboard: {path} has no MCP server 'nope' (it has: s)",
    )
