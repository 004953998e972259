"""The command line: help, configuration errors, and `switchboard dev` without Slack."""

from __future__ import annotations

import subprocess
import sys

import pytest

from switchboard.cli import main
from tests.support.processes import ROOT, worker_env
from tools.registry import registry


@pytest.fixture
def no_model(monkeypatch, redis_url, tmp_path):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env file here


def test_help_lists_every_verb(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for verb in ("dev", "bot", "worker", "chat", "runs", "approvals", "demos", "eval"):
        assert verb in text
    assert "OPENAI_BASE_URL" in text and "examples:" in text


@pytest.mark.parametrize("verb", ["chat", "worker", "dev"])
def test_without_a_model_the_error_says_how_to_configure_one(no_model, capsys, verb):
    assert main([verb]) == 2
    err = capsys.readouterr().err
    assert "OPENAI_API_KEY" in err and "OPENAI_BASE_URL" in err


def test_bot_without_tokens_names_what_is_missing(no_model, capsys):
    assert main(["bot"]) == 2
    assert "SLACK_BOT_TOKEN" in capsys.readouterr().err
    assert main(["bot", "--http"]) == 2
    assert "SLACK_SIGNING_SECRET" in capsys.readouterr().err


def test_invalid_configuration_is_reported_not_raised(no_model, monkeypatch, capsys):
    monkeypatch.setenv("SWITCHBOARD_MAX_STEPS", "0")
    assert main(["runs", "list"]) == 2
    assert "SWITCHBOARD_MAX_STEPS" in capsys.readouterr().err


def test_a_bad_policy_file_names_the_line(no_model, tmp_path, monkeypatch, capsys):
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "tools:\n  create_ticket:\n    allow: [everyone]\n  drop_database:\n    allow: [everyone]\n"
    )
    monkeypatch.setenv("SWITCHBOARD_POLICY", str(policy))
    assert main(["runs", "list"]) == 2
    err = capsys.readouterr().err
    assert "line 4" in err and "drop_database" in err


def test_unknown_run_is_a_clear_error(no_model, capsys):
    assert main(["runs", "show", "rnope"]) == 2
    assert "no run 'rnope'" in capsys.readouterr().err


@pytest.mark.slow
def test_dev_without_slack_offers_the_console_and_stops_cleanly(redis_url, model_server, tmp_path):
    model_server.route("hello", ["Hello! Ask me about courses or tickets."])
    env = worker_env(redis_url, model_server.url, tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "switchboard", "dev", "--workers", "1"],
        input="hello there\n\n",
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "SLACK_BOT_TOKEN" in done.stdout and "console" in done.stdout
    assert "Hello! Ask me about courses or tickets." in done.stdout
    assert done.stdout.rstrip().endswith("bye")


def test_version_names_the_installed_package(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"switchboard {version('switchboard')}\n"


def test_debug_and_verbose_work_anywhere_on_the_line(no_model, monkeypatch, capsys):
    monkeypatch.setenv("SWITCHBOARD_MAX_STEPS", "0")
    assert main(["runs", "list", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("switchboard: ")
    assert main(["--verbose", "runs", "list"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_tool_module_in_the_current_folder_is_found(no_model, tmp_path, monkeypatch, capsys):
    """As under `python -m switchboard`: the `switchboard` script's own folder is first on
    the module path, not the one it runs in."""
    (tmp_path / "local_tools_for_cli_test.py").write_text(
        "from tools import ToolContext, tool\n\n\n@tool(effect='read')\n"
        'def local_probe(ctx: ToolContext) -> str:\n    """Say hi."""\n    return \'hi\'\n'
    )
    monkeypatch.setenv("SWITCHBOARD_TOOLS", "local_tools_for_cli_test")
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".")])
    monkeypatch.delitem(__import__("sys").modules, "local_tools_for_cli_test", raising=False)
    try:
        assert main(["tools"]) == 0
        assert "local_probe" in capsys.readouterr().out
    finally:
        registry.unregister("local_probe")  # the registry is per process: leave it as found
