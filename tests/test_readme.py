"""The README's examples run as written: its code blocks are taken from the file itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from switchboard.cli import build_parser
from tests.support.processes import ROOT

README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # where `pip install` put the `switchboard` command


def section(heading: str) -> str:
    """The README text under `heading` (e.g. "### Your own tools"), up to the next heading
    of the same or a higher level."""
    level = len(heading.split()[0])
    lines = README.read_text(encoding="utf-8").splitlines(keepends=True)
    start = lines.index(heading + "\n") + 1
    fenced = False
    for n in range(start, len(lines)):
        fenced ^= lines[n].startswith("```")
        marks = len(lines[n]) - len(lines[n].lstrip("#"))
        if not fenced and 0 < marks <= level and lines[n][marks : marks + 1] == " ":
            return "".join(lines[start:n])
    return "".join(lines[start:])


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def shell(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """A README shell block, run as a reader would: `switchboard` found on PATH."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "SLACK_"))}
    clean.update(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", XDG_DATA_HOME=str(cwd), **env)
    clean.pop("PYTHONPATH", None)  # as in a fresh terminal: nothing but the install
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_custom_tools_example_runs_as_written(tmp_path):
    text = section("### Your own tools")
    [module] = blocks(text, "python")
    [commands] = blocks(text, "bash")
    path = module.splitlines()[0].removeprefix("# ").strip()  # "# mycompany/switchboard_tools.py"
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(module)
    done = shell(commands, tmp_path)
    assert done.returncode == 0, done.stderr
    for name in ("lookup_course", "refund_order", "cancel_order"):
        assert name in done.stdout, done.stdout
    assert "mycompany.switchboard_tools" in done.stdout


def test_the_policy_defaults_example_is_a_valid_policy(tmp_path):
    [policy] = [b for b in blocks(section("### Permissions"), "yaml") if "defaults:" in b]
    (tmp_path / "policy.yaml").write_text(policy)
    done = shell("switchboard tools check", tmp_path, SWITCHBOARD_POLICY="policy.yaml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_command_in_the_command_line_section_exists():
    [listing] = blocks(section("## Command line"), "")
    parser = build_parser(every=True)
    verbs: dict[str, Any] = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr,assignment]
    seen = 0
    for line in listing.splitlines():
        words = line.split()
        if not words or words[0] != "switchboard" or words[1].startswith("-"):
            continue
        verb = verbs[words[1]]
        seen += 1
        if len(words) > 2 and re.fullmatch(r"[a-z|]+", words[2]) and verb._subparsers:
            actions = verb._subparsers._group_actions[0].choices
            for action in words[2].split("|"):
                if action in ("check",):  # `tools [check]` is an argument, not a sub-command
                    continue
                assert action in actions, line
    assert seen >= 10


def test_every_readme_section_the_code_points_to_exists():
    headings = {
        line.lstrip("#").strip()
        for line in README.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }
    cited = set()
    for package in ("switchboard", "bot", "worker", "tools"):
        for source in (ROOT / package).rglob("*.py"):
            cited |= set(re.findall(r"README\.md, '([^']+)'", source.read_text(encoding="utf-8")))
    assert cited, "no README sections cited"
    assert cited <= headings, cited - headings
