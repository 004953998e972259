"""`switchboard tools [check] [--json]`: every registered tool with the rule that applies,
and a check of the policy file against the registered tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from switchboard.cli import main

POLICY = """\
roles:
  support: [U0SUP]
tools:
  knowledge_lookup:
    allow: [everyone]
  close_ticket:
    allow: [support]
    approvers: [support]
    high_risk: true
  "search_*":
    allow: [support]
  "jira_*": {}
"""


@pytest.fixture
def policy(cli_env, monkeypatch, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    monkeypatch.setenv("SWITCHBOARD_POLICY", str(path))
    return path


def rows(text: str) -> dict[str, str]:
    """The table's lines by tool name."""
    return {line.split()[0]: line for line in text.splitlines() if line.split()}


def test_tools_lists_every_tool_and_says_which_are_disabled(policy, capsys):
    assert main(["tools"]) == 0
    out = capsys.readouterr().out
    table = rows(out)
    assert out.startswith(f"policy: {policy} (")
    assert " ".join(table["TOOL"].split()) == "TOOL EFFECT FROM RULE MAY CALL APPROVERS NOTES"
    assert table["knowledge_lookup"].split() == [
        "knowledge_lookup", "read", "module", "tools.builtin.knowledge",
        "tools.knowledge_lookup", "(line", "4)", "everyone", "-",
    ]  # fmt: skip
    assert table["search_tickets"].split()[4:8] == ["tools.search_*", "(line", "10)", "support"]
    assert "@support" in table["close_ticket"] and "high risk" in table["close_ticket"]
    for name in ("calculate", "create_ticket", "update_ticket"):
        assert " ".join(table[name].split()[4:10]) == "disabled: no rule in policy.yaml nobody"
    assert "3 of 6 tools are disabled" in out
    assert "calculate, create_ticket, update_ticket" in out
    assert "warning: " in out and "jira_*" in out


def test_tools_json_is_machine_readable(policy, capsys):
    assert main(["tools", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy"]["file"] == str(policy)
    by_name = {tool["name"]: tool for tool in report["tools"]}
    assert list(by_name) == [
        "calculate", "knowledge_lookup", "search_tickets",
        "create_ticket", "update_ticket", "close_ticket",
    ]  # fmt: skip
    assert by_name["create_ticket"]["disabled"] is True
    assert by_name["create_ticket"]["rule"] is None
    assert by_name["create_ticket"]["allow"] == []
    assert by_name["close_ticket"] | {"constraints": {}} == {
        "name": "close_ticket",
        "effect": "write",
        "source": "module tools.builtin.tickets",
        "rule": "tools.close_ticket",
        "line": 6,
        "disabled": False,
        "allow": ["support"],
        "approvers": ["support"],
        "self_approval": True,
        "high_risk": True,
        "constraints": {},
    }
    assert report["disabled"] == ["calculate", "create_ticket", "update_ticket"]
    assert len(report["warnings"]) == 1


def test_tools_without_a_policy_file_shows_the_built_in_defaults(cli_env, capsys):
    assert main(["tools"]) == 0
    out = capsys.readouterr().out
    assert "SWITCHBOARD_POLICY is unset" in out
    assert "disabled" not in out
    assert "built-in default" in rows(out)["create_ticket"]
    assert main(["tools", "check"]) == 0
    assert capsys.readouterr().out.startswith("ok: no policy file")


def test_check_passes_a_file_with_warnings_and_reports_them(policy, capsys):
    assert main(["tools", "check"]) == 0
    out = capsys.readouterr().out
    assert f"warning: {policy} line 12: tools.jira_*: the pattern matches no registered tool" in out
    assert "note: 3 of 6 tools are disabled" in out
    assert out.splitlines()[-1] == f"ok: {policy} grants 3 of 6 registered tools"

    assert main(["tools", "check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["errors"] == []
    assert report["disabled"] == ["calculate", "create_ticket", "update_ticket"]
    assert [w.split(": ", 1)[1] for w in report["warnings"]] == [
        "tools.jira_*: the pattern matches no registered tool, so it grants nothing; check it, "
        "or load the tools it is meant for"
    ]


def test_check_fails_with_every_problem_named_by_line(cli_env, monkeypatch, tmp_path, capsys):
    path = tmp_path / "policy.yaml"
    path.write_text("tools:\n  nope: {}\n  close_ticket:\n    allow: [ghosts]\n")
    monkeypatch.setenv("SWITCHBOARD_POLICY", str(path))
    assert main(["tools", "check"]) == 1
    failed = [line.split(": ", 1)[0] for line in capsys.readouterr().out.splitlines()]
    assert failed == [f"FAIL {path} line 2", f"FAIL {path} line 4"]

    assert main(["tools", "check", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert report["policy"] == {"file": str(path), "version": None}
    assert "unknown tool 'nope'" in report["errors"][0]
    assert "unknown role 'ghosts'" in report["errors"][1]

    # listing refuses the same file, as start-up does
    assert main(["tools"]) == 2
    assert "unknown tool 'nope'" in capsys.readouterr().err


def test_check_reports_a_tool_module_that_does_not_import(cli_env, monkeypatch, capsys):
    monkeypatch.setenv("SWITCHBOARD_TOOLS", "no_such_module_for_switchboard")
    assert main(["tools", "check"]) == 1
    assert "no_such_module_for_switchboard" in capsys.readouterr().out
    assert main(["tools"]) == 2
    assert "no_such_module_for_switchboard" in capsys.readouterr().err


def test_help_lists_the_tools_verb(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "tools" in capsys.readouterr().out


# -- MCP servers and the operator's own modules, through the real command ------------------------

ROOT = Path(__file__).resolve().parent.parent

RETAIL = '''\
"""An operator's tool set that has its own `calculate`, like a public agent benchmark's."""
from tools import tool


@tool(effect="read")
def calculate(expression: str) -> str:
    """Evaluate a price expression the retail way."""
    return expression


@tool(effect="write")
def cancel_order(order_id: str, reason: str) -> str:
    """Cancel a pending order."""
    return order_id
'''

MCP_POLICY = """\
roles:
  admins: [U0ADMIN]
tools:
  "notes_*":
    allow: [everyone]
    approvers: [admins]
  notes_list_notes:
    allow: [everyone]
  "time_*":
    allow: [everyone]
"""


def switchboard(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The installed command line in a child process, as an operator runs it."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SWITCHBOARD_", "SLACK_", "OPENAI_"))
    }
    clean.update(
        XDG_DATA_HOME=str(tmp_path), PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)])
    )
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args],
        env={**clean, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_operators_tool_named_like_a_built_in_loads_without_error(tmp_path):
    (tmp_path / "retail_tools.py").write_text(RETAIL)
    done = switchboard(tmp_path, "tools", "--json", SWITCHBOARD_TOOLS="retail_tools")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [(t["name"], t["source"]) for t in report["tools"]] == [
        ("calculate", "module retail_tools"),
        ("cancel_order", "module retail_tools"),
    ]  # the built-in samples are not loaded: nothing collides with them
    # the shipped task library demonstrates the samples: it is not used without them
    demos = switchboard(tmp_path, "demos", "check", SWITCHBOARD_TOOLS="retail_tools")
    assert demos.returncode == 0, demos.stdout + demos.stderr
    assert demos.stdout.startswith("ok: no task library file (SWITCHBOARD_DEMOS is unset, and")
    both = switchboard(tmp_path, "tools", "check", SWITCHBOARD_TOOLS="retail_tools,tools.builtin")
    assert both.returncode == 1
    assert both.stdout.startswith(
        "FAIL tool module 'tools.builtin' (from SWITCHBOARD_TOOLS): a tool named 'calculate' is "
        "already registered by module retail_tools; module tools.builtin.calculator declares "
        "one too."
    )


def test_tools_lists_mcp_tools_with_their_server_and_check_connects_to_every_server(
    tmp_path, notes_dir, notes_http
):
    mcp = tmp_path / "mcp.yaml"
    mcp.write_text(
        "servers:\n"
        "  time:\n    command: mcp-server-time\n"
        f"  notes:\n    url: {notes_http.url}\n    tools: [list_notes, add_note, delete_note]\n"
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(MCP_POLICY)
    env = {"SWITCHBOARD_MCP": str(mcp), "SWITCHBOARD_POLICY": str(policy)}
    done = switchboard(tmp_path, "tools", **env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == f"mcp: {mcp}: time (stdio, 2 tools), notes (streamable HTTP, 3 tools)"
    table = rows(done.stdout)
    assert table["time_get_current_time"].split()[:7] == [
        "time_get_current_time", "read", "MCP", "server", "time", "tools.time_*", "(line",
    ]  # fmt: skip
    assert table["notes_list_notes"].split()[5:8] == ["tools.notes_list_notes", "(line", "7)"]
    assert table["notes_add_note"].split()[1:6] == [
        "write",
        "MCP",
        "server",
        "notes",
        "tools.notes_*",
    ]
    assert "@admins" in table["notes_add_note"] and "high risk" not in table["notes_add_note"]
    assert table["notes_delete_note"].endswith("high risk")  # destructiveHint: true

    checked = switchboard(tmp_path, "tools", "check", **env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.splitlines() == [
        f"ok: MCP server 'time' ({mcp} line 2): connected over stdio, 2 tools (mcp-server-time)",
        f"ok: MCP server 'notes' ({mcp} line 4): connected over streamable HTTP, 3 tools "
        f"({notes_http.url})",
        f"ok: {policy} grants 5 of 5 registered tools",
    ]
    report = json.loads(switchboard(tmp_path, "tools", "check", "--json", **env).stdout)
    assert report["ok"] and [s["tools"] for s in report["mcp"]] == [
        ["time_get_current_time", "time_convert_time"],
        ["notes_list_notes", "notes_add_note", "notes_delete_note"],
    ]


def test_check_names_every_server_problem_on_its_own_line(tmp_path, notes_dir):
    mcp = tmp_path / "mcp.yaml"
    mcp.write_text(
        "servers:\n"
        "  time:\n    command: mcp-server-time\n    tools: [get_curent_time]\n"
        "  docs:\n    url: http://127.0.0.1:9/mcp\n    connect_timeout: 1\n"
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(MCP_POLICY)
    env = {"SWITCHBOARD_MCP": str(mcp), "SWITCHBOARD_POLICY": str(policy)}
    checked = switchboard(tmp_path, "tools", "check", **env)
    assert checked.returncode == 1
    assert checked.stdout.splitlines() == [
        f"FAIL MCP server 'docs' ({mcp} line 5): cannot connect to http://127.0.0.1:9/mcp: "
        "ConnectError: All connection attempts failed; check its url and headers, or remove the "
        "server",
        f"FAIL MCP server 'time' ({mcp} line 2): tools names 'get_curent_time', which the server "
        "does not have (did you mean 'get_current_time'?)",
        "note: the policy file was not checked: fix the tool sources first",
    ]
    listed = switchboard(tmp_path, "tools", **env)  # loads tools as start-up does: refused
    assert listed.returncode == 2
    assert listed.stderr.startswith(f"switchboard: MCP server 'docs' ({mcp} line 5): cannot")
