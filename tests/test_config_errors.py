"""Every configuration mistake is one line, `switchboard: <what> (<where>); <fix>`, exit
status 2, no traceback (unless --debug). Run as the real command, as an operator would."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.slack_server import FakeSlack
from tests.support.processes import MARK, ROOT, kill_marked, marked, worker_env
from tests.support.runtime import wait_until

pytestmark = pytest.mark.slow

GOOD_BOT, GOOD_APP = "xoxb-good", "xapp-good"


@pytest.fixture
def base_env(redis_url, model_server, tmp_path) -> Iterator[dict[str, str]]:
    mark = uuid.uuid4().hex
    (tmp_path / "data").mkdir()
    yield worker_env(redis_url, model_server.url, tmp_path, **{MARK: mark})
    kill_marked(mark)


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack(tokens={GOOD_BOT, GOOD_APP}) as fake:
        yield fake


def switchboard(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args],
        env=env,
        cwd=env.get("XDG_DATA_HOME", ROOT),  # no .env file there
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line(done: subprocess.CompletedProcess, *, service: bool = False) -> str:
    """The whole error output: exit 2, a single `switchboard: ...; ...` line. A service
    (the bot) may log its start first: then the error is its last line."""
    err = done.stderr.strip()
    assert done.returncode == 2, (done.returncode, done.stdout, err)
    assert "Traceback" not in err, err
    if service:
        err = err.splitlines()[-1]
    assert "\n" not in err, err
    assert err.startswith("switchboard: ") and "; " in err, err
    return err


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ({"REDIS_URL": "http://localhost:6379"}, ["REDIS_URL=http://localhost:6379", "redis://"]),
        ({"REDIS_URL": "redis://:hunter2@localhost:6379/x"}, ["REDIS_URL=redis://:***@", "'x'"]),
        ({"REDIS_URL": "redis://127.0.0.1:1/0"}, ["cannot reach Redis", "REDIS_URL="]),
        ({"SWITCHBOARD_PRICES": '{"gpt-4.1": [1, 2'}, ["SWITCHBOARD_PRICES=", "not JSON"]),
        ({"SWITCHBOARD_PRICES": '{"gpt-4.1": 3}'}, ["'gpt-4.1' needs [input, output]"]),
        ({"SWITCHBOARD_MAX_STEPS": "0"}, ["SWITCHBOARD_MAX_STEPS=0", "default (8)"]),
        ({"SWITCHBOARD_LEASE_SECONDS": "soon"}, ["SWITCHBOARD_LEASE_SECONDS=soon", "number"]),
        ({"SWITCHBOARD_LOG_FORMAT": "xml"}, ["SWITCHBOARD_LOG_FORMAT=xml", "console or json"]),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable(base_env, setting, expected):
    err = one_line(switchboard({**base_env, **setting}, "runs", "list"))
    for part in expected:
        assert part in err, err
    assert "hunter2" not in err


def test_a_redis_database_that_does_not_exist_is_one_line(base_env, redis_url):
    err = one_line(switchboard({**base_env, "REDIS_URL": f"{redis_url}?db=99"}, "runs", "list"))
    assert "no such database" in err and "0 to 15" in err


def test_debug_shows_the_traceback(base_env):
    done = switchboard(
        {**base_env, "REDIS_URL": "redis://127.0.0.1:1/0"}, "--debug", "runs", "list"
    )
    assert done.returncode == 2 and "Traceback" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith("switchboard: cannot reach Redis")


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        ({"SLACK_BOT_TOKEN": "xoxb-revoked"}, "Slack rejected SLACK_BOT_TOKEN: invalid_auth"),
        ({"SLACK_APP_TOKEN": "xapp-revoked"}, "Slack rejected SLACK_APP_TOKEN: invalid_auth"),
        ({"SLACK_APP_TOKEN": GOOD_BOT}, "SLACK_APP_TOKEN does not look like a xapp- token"),
        ({"SLACK_BOT_TOKEN": GOOD_APP}, "SLACK_BOT_TOKEN does not look like a xoxb- token"),
        ({"SLACK_APP_TOKEN": "xapp-…"}, "SLACK_APP_TOKEN is still the example placeholder"),
    ],
)
def test_a_bad_slack_token_is_named(base_env, slack, tokens, expected):
    env = {
        **base_env,
        "SLACK_API_URL": slack.url,
        "SLACK_BOT_TOKEN": GOOD_BOT,
        "SLACK_APP_TOKEN": GOOD_APP,
        **tokens,
    }
    err = one_line(switchboard(env, "bot"), service=True)
    assert expected in err, err
    assert "README.md, 'In Slack'" in err


def test_an_unedited_env_example_names_the_placeholders_it_still_holds(base_env, slack):
    """`cp .env.example .env` and nothing more: the tokens are still `xoxb-...` and
    `xapp-...`. Slack is not asked (it would answer invalid_auth, or nothing at all)."""
    folder = Path(base_env["XDG_DATA_HOME"])  # the command's working directory
    (folder / ".env").write_text((ROOT / ".env.example").read_text())
    err = one_line(switchboard({**base_env, "SLACK_API_URL": slack.url}, "bot"), service=True)
    assert "SLACK_BOT_TOKEN and SLACK_APP_TOKEN are still the example placeholder" in err, err
    assert f"(.env in {folder})" in err
    assert slack.calls("auth.test") == []


def test_dev_with_a_rejected_bot_token_stops_before_starting_anything(base_env, slack):
    env = {
        **base_env,
        "SLACK_API_URL": slack.url,
        "SLACK_BOT_TOKEN": "xoxb-revoked",
        "SLACK_APP_TOKEN": GOOD_APP,
    }
    done = switchboard(env, "dev")
    assert "Slack rejected SLACK_BOT_TOKEN" in one_line(done)
    assert "Starting Switchboard" not in done.stdout


def test_dev_stops_with_the_error_of_a_child_that_cannot_start(base_env, slack):
    """The bot token passes dev's own check; the app token fails in the bot child, which
    no restart would fix: dev stops everything at once with the child's error."""
    env = {
        **base_env,
        "SLACK_API_URL": slack.url,
        "SLACK_BOT_TOKEN": GOOD_BOT,
        "SLACK_APP_TOKEN": "xapp-revoked",
    }
    started = time.monotonic()
    done = switchboard(env, "dev", "--workers", "1")
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 30
    assert "Slack rejected SLACK_APP_TOKEN: invalid_auth" in done.stderr
    assert "bot stopped with a configuration error" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(slack.calls("apps.connections.open")) == 1  # not restarted forever
    wait_until(lambda: not marked(env[MARK]), timeout=10, what="the workers to stop")
