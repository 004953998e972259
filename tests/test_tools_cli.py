"""`switchboard tools [check] [--json]`: every registered tool with the rule that applies,
and a check of the policy file against the registered tools."""

from __future__ import annotations

import json

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
def cli_env(monkeypatch, tmp_path):
    """No Redis and no model: listing tools needs neither."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    for name in ("SWITCHBOARD_POLICY", "SWITCHBOARD_TOOLS", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no .env file here


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
    assert " ".join(table["TOOL"].split()) == "TOOL EFFECT SOURCE MAY CALL APPROVERS NOTES"
    assert table["knowledge_lookup"].split() == [
        "knowledge_lookup", "read", "tools.knowledge_lookup", "(line", "4)", "everyone", "-",
    ]  # fmt: skip
    assert table["search_tickets"].split()[2:6] == ["tools.search_*", "(line", "10)", "support"]
    assert "@support" in table["close_ticket"] and "high risk" in table["close_ticket"]
    for name in ("calculate", "create_ticket", "update_ticket"):
        assert " ".join(table[name].split()[2:8]) == "disabled: no rule in policy.yaml nobody"
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
    assert by_name["create_ticket"]["source"] is None
    assert by_name["create_ticket"]["allow"] == []
    assert by_name["close_ticket"] | {"constraints": {}} == {
        "name": "close_ticket",
        "effect": "write",
        "source": "tools.close_ticket",
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
