"""Profiles and SWITCHBOARD_INSTRUCTIONS from the command line: `tools --profile`, `tools
check` on the profiles' files, `eval --profile`, `runs show`, and start-up errors."""

from __future__ import annotations

import json

import pytest
import yaml

from switchboard.cli import main
from switchboard.render import trajectory
from worker.run import Requester, Run, RunProfile

POLICY = """\
defaults:
  read: {allow: [everyone]}
  write: {allow: [everyone], approvers: [requester], self_approval: true}
profiles:
  it-help:
    channels: [C0ITHELP]
    instructions: You are Acme's IT help desk.
    tools: [search_tickets, "create_*"]
    model: gpt-it
  dm: {}
"""


@pytest.fixture
def policy(cli_env, monkeypatch, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    monkeypatch.setenv("SWITCHBOARD_POLICY", str(path))
    return path


def tool_names(text: str) -> list[str]:
    lines = text.splitlines()
    header = next(n for n, line in enumerate(lines) if line.startswith("TOOL "))
    return [line.split()[0] for line in lines[header + 1 :] if line and line[0].islower()]


def test_tools_lists_the_profiles_and_tools_profile_only_the_tools_it_keeps(policy, capsys):
    assert main(["tools"]) == 0
    out = capsys.readouterr().out
    assert "profiles: it-help (C0ITHELP); dm (no channels)" in out
    assert {"calculate", "knowledge_lookup", "close_ticket"} <= set(tool_names(out))

    assert main(["tools", "--profile", "it-help"]) == 0
    out = capsys.readouterr().out
    assert f"profile: it-help ({policy} line 5); channels: C0ITHELP; model: gpt-it" in out
    assert tool_names(out) == ["search_tickets", "create_ticket"]

    assert main(["tools", "--profile", "it-help", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [t["name"] for t in listing["tools"]] == ["search_tickets", "create_ticket"]
    assert listing["profile"]["model"] == "gpt-it"
    assert listing["profile"]["channels"] == ["C0ITHELP"]


def test_an_unknown_profile_is_one_line_naming_the_ones_there_are(policy, capsys):
    assert main(["tools", "--profile", "finance"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"switchboard: there is no profile 'finance' in {policy} (its profiles: dm, it-help)"
    )


def test_tools_check_names_the_line_of_a_profile_whose_task_library_does_not_match_the_tools(
    cli_env, monkeypatch, tmp_path, capsys
):
    demos = {
        "demonstrations": [
            {
                "id": "bad",
                "task": "t",
                "question": "q",
                "steps": [[{"tool": "no_such_tool", "args": {}, "result": "r"}]],
                "answer": "a",
            }
        ]
    }
    (tmp_path / "it-demos.yaml").write_text(yaml.safe_dump(demos))
    path = tmp_path / "policy.yaml"
    path.write_text(
        POLICY.replace("    model: gpt-it\n", "    model: gpt-it\n    demos: it-demos.yaml\n")
    )
    monkeypatch.setenv("SWITCHBOARD_POLICY", str(path))
    assert main(["tools", "check"]) == 1
    out = capsys.readouterr().out
    assert (
        f"FAIL {path} line 10: profiles.it-help.demos: demonstration bad: step 1 calls "
        "'no_such_tool', which is not a registered tool"
    ) in out
    assert "ok:" not in out

    path.write_text(POLICY.replace("  dm: {}\n", "  dm:\n    channels: [C0ITHELP]\n"))
    assert main(["tools", "check"]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {path} line 11: profiles.dm: channel C0ITHELP is already named on line 6" in out


def test_a_missing_or_oversized_instructions_file_stops_start_up_with_one_line(
    cli_env, monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("SWITCHBOARD_INSTRUCTIONS", str(tmp_path / "nope.md"))
    cases = tmp_path / "cases.yaml"
    cases.write_text(yaml.safe_dump({"cases": []}))
    assert main(["eval", str(cases), "--no-demos"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"switchboard: {tmp_path / 'nope.md'}: instructions file not found "
        "(SWITCHBOARD_INSTRUCTIONS)"
    )
    big = tmp_path / "big.md"
    big.write_text("x" * 20_000)
    monkeypatch.setenv("SWITCHBOARD_INSTRUCTIONS", str(big))
    assert main(["eval", str(cases), "--no-demos"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"switchboard: {big} is longer than 16000 characters")
    assert len(err.splitlines()) == 1


CASES = {
    "policy": POLICY,
    "cases": [
        {
            "id": "sum",
            "category": "direct",
            "question": "What is 2 + 3?",
            "script": [
                {"calls": [{"tool": "calculate", "args": {"expression": "2 + 3"}}]},
                {"text": "I can't compute that here."},
            ],
            "expect": {"answer_contains": ["can't"]},
        }
    ],
}


def test_eval_runs_a_case_file_under_a_profile(cli_env, tmp_path, capsys):
    cases = tmp_path / "cases.yaml"
    cases.write_text(yaml.safe_dump(CASES))
    out = tmp_path / "r.json"
    assert main(["eval", str(cases), "--no-demos", "--json", str(out)]) == 0
    [plain] = json.loads(out.read_text())["no-demos"]["cases"]
    assert plain["blocked"] == 0  # without a profile, calculate is there

    assert main(["eval", str(cases), "--no-demos", "--profile", "it-help", "--json", str(out)]) == 0
    [profiled] = json.loads(out.read_text())["no-demos"]["cases"]
    assert profiled["blocked"] == 1  # the it-help profile does not offer calculate
    assert "profile: it-help" in capsys.readouterr().out

    assert main(["eval", str(cases), "--no-demos", "--profile", "nope"]) == 2
    assert "there is no profile 'nope'" in capsys.readouterr().err


def test_runs_show_names_the_profile():
    run = Run(
        id="r1",
        question="q",
        requester=Requester(user_id="U1", channel_id="C0ITHELP"),
        model="gpt-it",
        profile=RunProfile(name="it-help", tools=["search_tickets"], model="gpt-it"),
    )
    assert "Model: gpt-it   Profile: it-help   Demonstrations: none" in trajectory(run, [])
    run.profile = None
    assert "Profile: none" in trajectory(run, [])


def test_the_readme_profiles_example_is_a_valid_policy(cli_env, monkeypatch, tmp_path, capsys):
    from tests.test_readme import blocks, section

    [example] = blocks(section("### Instructions and profiles"), "yaml")
    (tmp_path / "policy.yaml").write_text(POLICY.split("profiles:")[0] + example)
    (tmp_path / "it-demos.yaml").write_text("demonstrations: []\n")
    (tmp_path / "dm-instructions.md").write_text("Answer in one sentence.\n")
    monkeypatch.setenv("SWITCHBOARD_POLICY", "policy.yaml")
    assert main(["tools", "check"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "warning: policy.yaml line 9: profiles.it-help.tools: the pattern 'git_*'" in out
