"""Tools from real MCP servers: `mcp-server-time` and `mcp-server-git` from PyPI, and a notes
server of our own (tests/support/mcp_server.py) over stdio and streamable HTTP. No protocol mocks:
the official SDK client talks to the servers as it would in production."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import tools.mcp
from tests.support.mcp_servers import (
    NotesServer,
    installed,
    starts,
    stdio_notes,
    write_config,
)
from tests.support.runtime import wait_until
from tools import ToolContext, register_tool
from tools.decode import decode_arguments
from tools.exceptions import ArgumentError, McpServerError
from tools.execute import execute
from tools.mcp import IDEMPOTENCY_META, McpServers
from tools.mcp.config import command_places, resolve_command
from tools.policy import Policy
from tools.registry import ToolRegistry

CTX = ToolContext(user_id="UALICE", run_id="r1", call_id="c1")

Loader = Callable[..., tuple[ToolRegistry, McpServers]]


@pytest.fixture
def load(tmp_path: Path) -> Iterator[Loader]:
    """Load a servers file into a fresh registry; every server is closed afterwards."""
    loaded: list[McpServers] = []
    files = iter(range(100))

    def load_servers(
        servers: dict, registry: ToolRegistry | None = None
    ) -> tuple[ToolRegistry, McpServers]:
        registry = registry if registry is not None else ToolRegistry()
        path = write_config(tmp_path / f"mcp-{next(files)}.yaml", servers)
        mcp = tools.mcp.load(path, registry)
        loaded.append(mcp)
        return registry, mcp

    yield load_servers
    for servers in loaded:
        tools.mcp.unload(servers)


@pytest.fixture(scope="module")
def git_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    git = ["git", "-C", str(repo), "-c", "user.name=T", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "README").write_text("hello\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first commit"], check=True)
    return repo


def run(registry: ToolRegistry, name: str, arguments: str, ctx: ToolContext = CTX) -> str:
    tool = registry.get(name)
    assert tool is not None, registry.names()
    observation = execute(tool, ctx, decode_arguments(tool, arguments))
    assert observation.ok, observation.text
    return observation.text


# -- servers from PyPI -----------------------------------------------------------------------


def test_the_time_server_from_pypi_brings_read_tools_that_answer(load: Loader) -> None:
    registry, _ = load({"time": {"command": installed("mcp-server-time")}})
    assert registry.names() == ["time_get_current_time", "time_convert_time"]
    tool = registry.get("time_get_current_time")
    assert tool is not None
    assert (tool.effect, tool.high_risk, tool.source) == ("read", False, "MCP server time")
    assert tool.strict  # titles dropped, closed, all required: OpenAI's strict mode takes it
    assert "title" not in json.dumps(tool.parameters)
    answer = json.loads(run(registry, "time_get_current_time", '{"timezone": "Europe/Paris"}'))
    assert answer["timezone"] == "Europe/Paris" and answer["datetime"].startswith("20")


def test_the_git_server_from_pypi_gets_effects_and_risk_from_its_annotations(
    load: Loader, git_repo: Path
) -> None:
    registry, _ = load(
        {
            "git": {
                "command": installed("mcp-server-git"),
                "args": ["--repository", str(git_repo)],
                "prefix": "",
            }
        }
    )
    effects = {tool.name: tool.effect for tool in registry}
    writes = {"git_add", "git_commit", "git_reset", "git_create_branch", "git_checkout"}
    assert {n for n, e in effects.items() if e == "write"} == writes
    assert {"git_status", "git_log", "git_diff", "git_show", "git_branch"} <= set(effects)
    assert [t.name for t in registry if t.high_risk] == ["git_reset"]  # destructiveHint: true

    log = run(registry, "git_log", json.dumps({"repo_path": str(git_repo)}))
    assert "first commit" in log
    status = run(registry, "git_status", json.dumps({"repo_path": str(git_repo)}))
    assert "branch" in status.lower()


def test_strict_decoding_accepts_what_the_git_server_publishes_and_explains_the_rest(
    load: Loader, git_repo: Path
) -> None:
    registry, _ = load({"git": {"command": installed("mcp-server-git"), "prefix": ""}})
    git_log = registry.get("git_log")
    assert git_log is not None
    repo = str(git_repo)
    # defaults filled in (so the approval shows what will be used); anyOf-with-null accepted
    assert decode_arguments(git_log, json.dumps({"repo_path": repo})) == {
        "repo_path": repo,
        "max_count": 10,
        "start_timestamp": None,
        "end_timestamp": None,
    }
    given = {"repo_path": repo, "max_count": 3, "start_timestamp": "2 weeks ago"}
    assert decode_arguments(git_log, json.dumps(given))["start_timestamp"] == "2 weeks ago"
    with pytest.raises(ArgumentError) as caught:
        decode_arguments(git_log, json.dumps({"repo_path": repo, "max_count": "ten", "x": 1}))
    message = str(caught.value)
    assert "unknown parameter 'x'" in message
    assert "'max_count' must be integer (got string)" in message
    assert "start_timestamp (string or null, default null)" in message
    with pytest.raises(ArgumentError, match="missing required parameter 'repo_path'"):
        decode_arguments(git_log, "{}")


# -- our own server, over both transports ----------------------------------------------------


@pytest.fixture(params=["stdio", "http"])
def notes(request: pytest.FixtureRequest, load: Loader, notes_dir: Path) -> ToolRegistry:
    if request.param == "stdio":
        entry = stdio_notes(notes_dir, prefix="")
    else:
        server = NotesServer(notes_dir)
        request.addfinalizer(server.stop)
        entry = {"url": server.url, "headers": {"Authorization": "Bearer t"}, "prefix": ""}
    registry, _ = load({"notes": entry})
    return registry


def test_reads_writes_and_destructive_writes_follow_the_annotations(notes: ToolRegistry) -> None:
    kinds = {t.name: (t.effect, t.high_risk) for t in notes}
    assert kinds["list_notes"] == ("read", False)
    assert kinds["add_note"] == ("write", False)  # no annotations at all: a write
    assert kinds["delete_note"] == ("write", True)  # destructiveHint: true


def test_a_rich_schema_decodes_strictly_refs_enums_formats_and_defaults(
    notes: ToolRegistry,
) -> None:
    add_note = notes.get("add_note")
    assert add_note is not None and not add_note.strict  # optional fields: sent non-strict
    owner = {"name": "Ana", "email": "ana@example.com"}
    args = decode_arguments(
        add_note, json.dumps({"title": "Q3", "owner": owner, "due": "2026-03-01"})
    )
    assert args == {
        "title": "Q3",
        "owner": owner,
        "due": "2026-03-01",
        "body": "",
        "tags": None,
        "priority": "normal",
    }
    bad = {"title": "Q3", "priority": "urgent", "due": "2026-13-01", "owner": {"name": "Ana"}}
    with pytest.raises(ArgumentError) as caught:
        decode_arguments(add_note, json.dumps(bad))
    message = str(caught.value)
    assert '\'priority\' must be one of "low", "normal", "high" (got string)' in message
    assert "'2026-13-01' is not a 'date'" in message
    assert "missing 'email' in 'owner'" in message
    assert "due (string (date) or null, default null)" in message
    assert "owner (object with name, email or null, default null)" in message


def test_the_idempotency_key_reaches_the_server_in_the_request_meta(
    notes: ToolRegistry, notes_dir: Path
) -> None:
    write = ToolContext(user_id="UALICE", call_id="c1", idempotency_key="ap_0123")
    assert run(notes, "add_note", '{"title": "once"}', write) == "added note 1"
    assert run(notes, "add_note", '{"title": "once"}', write) == "note 1 (already added)"
    assert starts(notes_dir, "add_note") == ["ap_0123", "ap_0123"]
    assert IDEMPOTENCY_META == "switchboard/idempotency-key"
    run(notes, "add_note", '{"title": "read ctx"}')  # no key, no _meta entry
    assert starts(notes_dir, "add_note", "read ctx") == [None]


def test_results_other_than_text_become_short_bounded_lines(notes: ToolRegistry) -> None:
    assert run(notes, "snapshot", "{}") == (
        "three notes\n"
        "[image: image/png, 2.0 KB]\n"
        "[resource <file:///notes.db>: application/octet-stream, 2.9 KB]\n"
        "[resource link: all notes <https://notes.example/all>]"
    )
    assert run(notes, "stats", "{}") == '{"notes":3,"oldest":"2026-01-02"}'


def test_an_is_error_result_is_an_error_observation_in_the_servers_words(
    notes: ToolRegistry,
) -> None:
    tool = notes.get("get_note")
    assert tool is not None
    observation = execute(tool, CTX, {"note_id": 404})
    assert not observation.ok
    assert observation.text == "Error executing tool get_note: no note 404"


def test_many_threads_share_one_session(notes: ToolRegistry) -> None:
    tool = notes.get("list_notes")
    assert tool is not None
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(execute(tool, CTX, {}).ok))
        for _ in range(24)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [True] * 24


# -- when servers fail ------------------------------------------------------------------------


def test_an_unreachable_server_at_start_up_stops_start_up_naming_it(
    load: Loader, tmp_path: Path
) -> None:
    started = time.monotonic()
    with pytest.raises(McpServerError) as caught:
        load(
            {
                "gone": {"command": "no-such-mcp-server-for-switchboard"},
                "down": {"url": "http://127.0.0.1:9/mcp", "connect_timeout": 1},
            }
        )
    lines = str(caught.value).splitlines()
    config = tmp_path / "mcp-0.yaml"
    assert lines == [
        f"MCP server 'down' ({config} line 4): cannot connect to http://127.0.0.1:9/mcp: "
        "ConnectError: All connection attempts failed; check its url and headers, or remove "
        "the server",
        f"MCP server 'gone' ({config} line 2): cannot connect to "
        "no-such-mcp-server-for-switchboard: command not found: "
        f"no-such-mcp-server-for-switchboard (looked in {' and '.join(command_places())}); "
        "check its command, or remove the server",
    ]
    assert time.monotonic() - started < 10


def test_a_bare_command_is_found_beside_the_running_python_when_path_does_not_have_it(
    load: Loader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service started as /opt/venv/bin/switchboard, virtualenv not activated: the servers
    pip installed into the same virtualenv are found, after PATH."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert shutil.which("mcp-server-time") is None
    assert resolve_command("mcp-server-time") == installed("mcp-server-time")
    assert resolve_command("git") == shutil.which("git")  # PATH first, as a shell would
    assert resolve_command("./bin/server") == "./bin/server"  # a path is used as it is
    registry, _ = load({"time": {"command": "mcp-server-time"}})
    assert registry.names() == ["time_get_current_time", "time_convert_time"]


def test_tools_and_effects_must_name_tools_the_server_has(
    load: Loader, notes_dir: Path, tmp_path: Path
) -> None:
    entry = stdio_notes(notes_dir, tools=["list_notes", "lsit_notes"], effects={"add_note": "read"})
    with pytest.raises(McpServerError) as caught:
        load({"notes": entry})
    where = f"MCP server 'notes' ({tmp_path / 'mcp-0.yaml'} line 2)"
    assert str(caught.value).splitlines() == [
        f"{where}: effects names 'add_note', left out by `tools:`",
        f"{where}: tools names 'lsit_notes', which the server does not have (did you mean "
        "'list_notes'?)",
    ]


def test_an_allow_list_and_effects_shape_what_is_registered(load: Loader, notes_dir: Path) -> None:
    entry = stdio_notes(notes_dir, tools=["list_notes", "add_note"], effects={"add_note": "read"})
    registry, _ = load({"n": entry})
    assert [(t.name, t.effect) for t in registry] == [
        ("n_list_notes", "read"),
        ("n_add_note", "read"),
    ]


def test_a_name_taken_by_another_source_is_an_error_naming_both(
    load: Loader, notes_dir: Path, tmp_path: Path
) -> None:
    registry = ToolRegistry()
    register_tool(
        name="list_notes",
        description="The operator's own.",
        parameters={"type": "object"},
        handler=lambda ctx, args: "",
        registry=registry,
    )
    with pytest.raises(McpServerError) as caught:
        load({"notes": stdio_notes(notes_dir, prefix="")}, registry)
    assert str(caught.value) == (
        f"MCP server 'notes' ({tmp_path / 'mcp-0.yaml'} line 2): its tool 'list_notes' has the "
        f"name of a tool from module {__name__}; tool names must be unique: set `prefix:` for "
        "the server, or leave the tool out with `tools:`"
    )
    assert registry.names() == ["list_notes"]  # none of the server's tools were registered

    with pytest.raises(McpServerError) as caught:
        load({"a": stdio_notes(notes_dir, prefix="x_"), "b": stdio_notes(notes_dir, prefix="x_")})
    first = str(caught.value).splitlines()[0]
    config = tmp_path / "mcp-1.yaml"
    assert first == (
        f"MCP server 'b' ({config} line 9): its tool 'x_list_notes' has the name of a tool of "
        f"MCP server 'a' ({config} line 2); give one of them another `prefix:`"
    )


def _server_pid(notes_dir: Path) -> int:
    out = subprocess.run(
        ["pgrep", "-f", f"{sys.executable} .*mcp_server.py"], capture_output=True, text=True
    ).stdout.split()
    env_match = []
    for pid in out:
        try:  # another test process's server may have ended since pgrep listed it
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"NOTES_DIR={notes_dir}".encode() in environ:
            env_match.append(int(pid))
    assert len(env_match) == 1, env_match
    return env_match[0]


def test_a_server_that_dies_is_restarted_and_reads_go_on(load: Loader, notes_dir: Path) -> None:
    registry, servers = load({"notes": stdio_notes(notes_dir, prefix="")})
    connection = servers.connections["notes"]
    assert run(registry, "list_notes", "{}") == "[]"
    subprocess.run(["kill", "-9", str(_server_pid(notes_dir))], check=True)
    assert run(registry, "list_notes", "{}") == "[]"  # reconnected and asked again
    assert connection.sessions == 2


def test_a_write_after_the_server_died_idle_is_sent_once_to_the_new_session(
    load: Loader, notes_dir: Path
) -> None:
    registry, servers = load({"notes": stdio_notes(notes_dir, prefix="")})
    subprocess.run(["kill", "-9", str(_server_pid(notes_dir))], check=True)
    write = ToolContext(user_id="UALICE", call_id="c1", idempotency_key="ap_after")
    assert run(registry, "add_note", '{"title": "t"}', write) == "added note 1"
    assert starts(notes_dir, "add_note") == ["ap_after"]
    assert servers.connections["notes"].sessions == 2


def test_a_write_whose_server_dies_while_it_runs_is_reported_unknown_and_not_retried(
    load: Loader, notes_dir: Path, notes_http: NotesServer
) -> None:
    registry, servers = load({"notes": {"url": notes_http.url, "prefix": ""}})
    tool = registry.get("slow_note")
    assert tool is not None
    write = ToolContext(user_id="UALICE", call_id="c1", idempotency_key="ap_dies")
    box: list = []
    thread = threading.Thread(target=lambda: box.append(execute(tool, write, {"title": "s"})))
    thread.start()
    wait_until(lambda: (notes_dir / "started-s").exists(), what="the write to start")
    notes_http.kill()
    thread.join(30)
    [observation] = box
    assert not observation.ok
    assert observation.text == (
        "Error: slow_note was sent, but the connection to the server closed; its outcome is "
        "unknown (it may have taken effect) and it was not retried"
    )
    assert starts(notes_dir, "slow_note") == ["ap_dies"]
    wait_until(lambda: servers.connections["notes"].last_error is not None, what="a reconnect")
    assert starts(notes_dir, "slow_note") == ["ap_dies"]  # nothing sent it again


def test_a_call_is_cut_at_the_tools_timeout_and_the_server_asked_to_cancel(
    load: Loader, notes_dir: Path
) -> None:
    registry, _ = load({"notes": stdio_notes(notes_dir, prefix="", timeout=1)})
    tool = registry.get("slow_note")
    assert tool is not None and tool.timeout == 1
    started = time.monotonic()
    observation = execute(tool, ToolContext(user_id="U", idempotency_key="ap_t"), {"title": "t"})
    assert 0.9 < time.monotonic() - started < 5
    assert observation.text == (
        "Error: slow_note timed out after 1 s; its outcome is unknown (it may have taken "
        "effect) and it was not retried"
    )
    wait_until(lambda: (notes_dir / "cancelled-t").exists(), what="the server to cancel it")
    assert run(registry, "list_notes", "{}") == "[]"  # cancelled before it wrote; session fine


# -- the policy, on MCP tools by their final names ----------------------------------------------

POLICY = """\
roles:
  admins: [U0ADMIN]
tools:
  "git_*":
    allow: [everyone]
    approvers: [admins]
  git_checkout:
    allow: [admins]
    approvers: [admins]
    high_risk: true
  "*_note*":
    allow: [everyone]
    approvers: [admins]
    high_risk: false
"""


def test_the_policy_governs_mcp_tools_by_their_final_names_and_keeps_destructive_high_risk(
    load: Loader, notes_dir: Path, git_repo: Path
) -> None:
    registry, _ = load(
        {
            "git": {"command": installed("mcp-server-git"), "prefix": ""},
            "notes": stdio_notes(notes_dir, prefix="", tools=["add_note", "delete_note"]),
        }
    )
    policy = Policy.parse(POLICY, registry, source="policy.yaml")
    assert policy.rule_source("git_status") == "tools.git_*"
    assert policy.rule_source("git_checkout") == "tools.git_checkout"
    assert policy.rule("git_checkout").allow == ("admins",)
    assert policy.rule("git_reset").high_risk  # destructiveHint, and git_* says nothing
    assert not policy.rule("git_commit").high_risk
    assert not policy.rule("delete_note").high_risk  # its entry said so itself
    assert policy.rule("git_status").approvers == ()  # a read needs no approval
