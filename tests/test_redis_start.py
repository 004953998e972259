"""The bot and the workers started while Redis does not answer yet (started beside them, or
restarting, or failing over): they wait a while for it (`SWITCHBOARD_REDIS_START_WAIT`)
and come up once it does, rather than exit and leave it to a supervisor's back-off (the
chaos soak: a bot restarted under a Redis restart exited "cannot reach Redis" and stayed
down). Other commands say so at once, and a refused password is never waited on."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from switchboard.redisconn import Client, connect, patient
from tests.fakes.slack_server import FakeSlack
from tests.support.cutting_proxy import CuttingProxy
from tests.support.processes import (
    ROOT,
    SwitchboardProcess,
    WorkerProcess,
    logged,
    marked,
    worker_env,
)
from tests.support.redis_server import RedisServer, free_port
from tests.support.runtime import wait_until

pytestmark = pytest.mark.slow

PASSWORD = "s3cret0f24hexchars"


def user_without(server: RedisServer, command: str, secret: str) -> str:
    """The URL of a user of `server` that may run every command but `command`."""
    admin = redis.Redis(unix_socket_path=server.socket, password=PASSWORD)
    user = f"no{command}"
    admin.acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{secret}"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", f"-{command}"],
    )
    admin.close()
    return f"redis://{user}:{secret}@127.0.0.1:{server.port}/0"


def switchboard(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_worker_and_a_bot_started_before_redis_come_up_once_it_answers(
    tmp_path: Path, model_server
):
    server = RedisServer(tmp_path / "redis", password=PASSWORD)  # its port known, not started
    env = worker_env(server.url, model_server.url, tmp_path, SWITCHBOARD_REDIS_START_WAIT="300")
    port = free_port()
    with FakeSlack() as slack:
        bot_env = {
            **env,
            "SLACK_BOT_TOKEN": "xoxb-good",
            "SLACK_SIGNING_SECRET": "a-secret",
            "SLACK_API_URL": slack.url,
        }
        worker = WorkerProcess(env, tmp_path / "worker.log")
        bot = SwitchboardProcess(
            bot_env, tmp_path / "bot.log", "bot", "--http", "--port", str(port)
        )
        try:
            for process in (worker, bot):
                waiting = process.log
                wait_until(lambda: logged(waiting, "redis_waiting"), timeout=60)  # noqa: B023
                assert process.proc.poll() is None  # still waiting, not gone
            server.start()
            wait_until(lambda: logged(worker.log, "worker_started"), timeout=60)
            wait_until(lambda: logged(bot.log, "bot_started"), timeout=60)
            with socket.create_connection(("127.0.0.1", port), 5):
                pass  # serving
        finally:
            bot.stop()
            worker.stop()
            server.stop()
    for log in ("worker.log", "bot.log"):
        assert PASSWORD not in (tmp_path / log).read_text()  # the URL said without it


def test_a_redis_gone_right_after_the_start_up_check_is_waited_for_too(
    tmp_path: Path, model_server
):
    """Redis answers the start-up check, then goes away (a failover or a restart just then):
    the task library's read that follows failed, and the worker or bot exited 75 (found by
    the chaos soak: a bot restarted during a failover stayed down until something restarted
    it). Start-up asks again, within the same wait, and comes up once Redis is back."""
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    try:
        with FakeSlack() as slack:
            for verb, started in (("worker", "worker_started"), ("bot", "bot_started")):
                # the check's connection passes; the next ones are cut for 3 s
                with CuttingProxy(("127.0.0.1", server.port), through=1, cut_seconds=3) as cut:
                    url = f"redis://:{PASSWORD}@127.0.0.1:{cut.port}/0"
                    env = worker_env(
                        url,
                        model_server.url,
                        tmp_path,
                        SLACK_BOT_TOKEN="xoxb-good",
                        SLACK_SIGNING_SECRET="a-secret",
                        SLACK_API_URL=slack.url,
                    )
                    log = tmp_path / f"{verb}.log"
                    args = ("--http", "--port", str(free_port())) if verb == "bot" else ()
                    process = SwitchboardProcess(env, log, verb, *args)
                    try:
                        wait_until(
                            lambda: logged(log, started) or process.proc.poll() is not None,  # noqa: B023
                            timeout=60,
                            what=started,
                        )
                        assert process.proc.poll() is None, log.read_text()[-2000:]  # not exited
                    finally:
                        process.stop()
                    assert cut.cut >= 1, cut.cut  # it was cut, and waited
                    waited = [
                        line for line in log.read_text().splitlines() if "redis_waiting" in line
                    ]
                    assert any('"command": "HGETALL"' in line for line in waited), waited
                    assert PASSWORD not in log.read_text()
    finally:
        server.stop()


def test_start_up_patience_asks_again_within_its_wait_and_not_after(tmp_path: Path):
    """`patient`, in one process: a command whose connection is cut is sent again until
    Redis is back; outside it (serving: a command lost mid-way may have run) it is not; a
    refused password is never asked again."""
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    try:
        with CuttingProxy(("127.0.0.1", server.port), through=1, cut_seconds=1.5) as cut:
            client = connect(f"redis://:{PASSWORD}@127.0.0.1:{cut.port}/0")  # the check passes
            with patient(client, 30):
                assert client.set("k", "v") and client.get("k") == b"v"
            assert cut.cut >= 1 and client.patient_for == 0.0
        with CuttingProxy(("127.0.0.1", server.port), through=1, cut_seconds=30) as cut:
            client = connect(f"redis://:{PASSWORD}@127.0.0.1:{cut.port}/0")
            started = time.monotonic()
            with patient(client, 30), pytest.raises(redis.ConnectionError):
                client.incr("n")  # sent twice, it might count twice: not sent again
            assert time.monotonic() - started < 5
        with CuttingProxy(("127.0.0.1", server.port), through=1, cut_seconds=30) as cut:
            client = connect(f"redis://:{PASSWORD}@127.0.0.1:{cut.port}/0")
            with pytest.raises(redis.ConnectionError):
                client.get("k")  # serving: said at once
            started = time.monotonic()
            with patient(client, 1.0), pytest.raises(redis.ConnectionError):
                client.get("k")  # the wait runs out
            assert 1.0 <= time.monotonic() - started < 10
        client = Client.from_url(f"redis://:wrong@127.0.0.1:{server.port}/0")
        started = time.monotonic()
        with patient(client, 30), pytest.raises(redis.AuthenticationError):
            client.get("k")
        assert time.monotonic() - started < 5  # not waited on
    finally:
        server.stop()


def test_a_password_refused_after_the_start_up_check_is_said_as_refused_at_once(
    tmp_path: Path, model_server
):
    """The password changes between the check and the commands after it: a refused
    password, said so with exit status 2 (a restart with the same URL cannot mend it), not
    "cannot reach Redis" with 75 (found by review)."""
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    admin = redis.Redis(unix_socket_path=server.socket, password=PASSWORD)

    def rotate(accepted: int) -> None:
        if accepted == 2:  # the check's connection was the first
            admin.config_set("requirepass", "rotated0f24hexchars")

    try:
        with CuttingProxy(("127.0.0.1", server.port), through=2, cut_seconds=0, before=rotate) as p:
            url = f"redis://:{PASSWORD}@127.0.0.1:{p.port}/0"
            env = worker_env(url, model_server.url, tmp_path)
            started = time.monotonic()
            done = switchboard(env, "worker", timeout=60)
        assert done.returncode == 2, done.stderr[-2000:]
        said = done.stderr.rstrip().splitlines()[-1]
        assert said.startswith("switchboard: Redis refused the connection"), said
        assert PASSWORD not in done.stderr
        assert time.monotonic() - started < 30  # not waited on
    finally:
        admin.close()
        server.stop()


def test_a_redis_that_never_answers_is_said_once_the_wait_is_over(tmp_path: Path, model_server):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    env = worker_env(url, model_server.url, tmp_path, SWITCHBOARD_REDIS_START_WAIT="1")
    started = time.monotonic()
    done = switchboard(env, "worker", timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 75, done.stderr  # EX_TEMPFAIL: a restart may mend it
    assert done.stderr.rstrip().splitlines()[-1].startswith("switchboard: cannot reach Redis")
    assert done.stderr.count('"event": "redis_waiting"') >= 2, done.stderr  # asked again
    assert took < 30, took  # the wait (1 s) and a start, not the default 30 s

    # a command other than the bot and the workers does not wait: said at once
    env = worker_env(url, model_server.url, tmp_path)
    done = switchboard(env, "runs", "list", timeout=60)
    assert done.returncode == 2 and "cannot reach Redis" in done.stderr  # not waited for
    assert "redis_waiting" not in done.stderr


def test_a_stopped_redis_is_said_once_the_wait_is_over_not_a_minute_later(
    tmp_path: Path, model_server
):
    """A server that takes connections and never answers (stopped: SIGSTOP, a frozen VM):
    each PING waited out the connection's 60 s read timeout, so the wait said nothing and
    ended a minute late (found by review). Each try waits no longer than the wait has
    left."""
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        env = worker_env(server.url, model_server.url, tmp_path, SWITCHBOARD_REDIS_START_WAIT="3")
        started = time.monotonic()
        done = switchboard(env, "worker", timeout=120)
        took = time.monotonic() - started
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
    assert done.returncode == 75, done.stderr  # EX_TEMPFAIL: a restart may mend it
    assert done.stderr.rstrip().splitlines()[-1].startswith("switchboard: cannot reach Redis")
    assert '"event": "redis_waiting"' in done.stderr  # asked more than once
    assert took < 30, took  # before: 61 s


def test_a_worker_restarted_while_redis_is_down_is_restarted_again_not_the_group_stopped(
    tmp_path: Path, model_server
):
    """`worker --processes N` restarts a child that exits, but stops them all after a
    configuration error (exit status 2), which no restart mends. A child restarted while
    Redis was down past its wait exited 2 as well, and took its healthy siblings down with
    it. It exits 75 (EX_TEMPFAIL): restarted again, with back-off, until Redis answers."""
    import psutil

    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    env = worker_env(server.url, model_server.url, tmp_path, SWITCHBOARD_REDIS_START_WAIT="1")
    log = tmp_path / "workers.log"

    def started() -> int:
        return log.read_text().count('"event": "worker_started"')

    workers = SwitchboardProcess(env, log, "worker", "--processes", "2")
    try:
        wait_until(lambda: started() == 2, timeout=60, what="both workers")
        child = psutil.Process(workers.pid).children()[0]
        server.stop()
        child.kill()  # it dies while Redis is down: its restart cannot reach Redis
        wait_until(lambda: '"code": 75' in log.read_text(), timeout=60, what="exit 75")
        assert workers.proc.poll() is None  # the group goes on
        server.start()
        wait_until(lambda: started() == 3, timeout=90, what="the child back")
        assert workers.proc.poll() is None
    finally:
        workers.stop()
        server.stop()


def test_workers_on_the_embedded_redis_stop_once_it_is_gone_not_restart_for_ever(
    tmp_path: Path, model_server
):
    """The embedded Redis runs in the parent, and nothing restarts it: a child that cannot
    reach it says so at once and stops the group (exit status 2), rather than wait, exit 75
    and be restarted every 30 s for good, told to unset a REDIS_URL nobody set (found by
    review)."""
    import psutil

    env = worker_env("", model_server.url, tmp_path)
    env.pop("REDIS_URL")
    log = tmp_path / "workers.log"
    workers = SwitchboardProcess(env, log, "worker", "--processes", "2")
    try:
        wait_until(
            lambda: log.read_text().count('"event": "worker_started"') == 2,
            timeout=60,
            what="both workers",
        )
        servers = [psutil.Process(pid) for pid in marked("", tmp_path / "data")]  # its folder
        assert servers
        for server in servers:
            server.kill()
        psutil.Process(workers.pid).children()[0].kill()
        assert workers.wait(60) == 2  # the group stopped, with the child's one-line error
    finally:
        workers.stop()
    text = log.read_text()
    assert "stopped with a configuration error" in text and '"code": 75' not in text


def test_a_refused_password_is_said_at_once_not_waited_on(tmp_path: Path, model_server):
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    try:
        env = worker_env(server.url.replace(PASSWORD, "wrong"), model_server.url, tmp_path)
        done = switchboard(env, "worker", timeout=60)
    finally:
        server.stop()
    assert done.returncode == 2 and "redis_waiting" not in done.stderr, done.stderr
    assert "wrong" not in done.stderr.rstrip().splitlines()[-1]


def test_a_user_the_acl_does_not_let_ping_is_said_at_once_not_waited_on(
    tmp_path: Path, model_server
):
    """An ACL user without PING: redis-py's NoPermissionError is a ResponseError, and it
    was printed as a traceback (found by review)."""
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    secret = "acl-user-secret-0123"
    try:
        url = user_without(server, "ping", secret)
        env = worker_env(url, model_server.url, tmp_path, SWITCHBOARD_REDIS_START_WAIT="60")
        done = switchboard(env, "worker", timeout=60)
    finally:
        server.stop()
    assert done.returncode == 2 and "redis_waiting" not in done.stderr, done.stderr
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith("switchboard: Redis refused a command to this user"), done.stderr
    assert "Traceback" not in done.stderr and secret not in done.stderr


def test_a_replica_that_lost_its_primary_is_waited_for_and_found_once_promoted(
    tmp_path: Path, model_server
):
    """A replica that serves no stale data answers MASTERDOWN until its primary is back or
    it is promoted: a failover in progress, waited for like one; it was printed as a
    traceback and never waited for (found by review)."""
    server = RedisServer(tmp_path / "redis").start()
    admin = redis.Redis(unix_socket_path=server.socket)
    try:
        admin.config_set("replica-serve-stale-data", "no")
        admin.replicaof("127.0.0.1", free_port())  # a primary that is down
        env = worker_env(server.url, model_server.url, tmp_path, SWITCHBOARD_REDIS_START_WAIT="1")
        done = switchboard(env, "worker", timeout=60)
        assert done.returncode == 75, done.stderr  # EX_TEMPFAIL: a restart may find it
        last = done.stderr.rstrip().splitlines()[-1]
        assert last.startswith("switchboard: Redis is a replica, not the primary"), last
        assert "MASTER is down" in last and "Traceback" not in done.stderr

        env["SWITCHBOARD_REDIS_START_WAIT"] = "300"
        worker = WorkerProcess(env, tmp_path / "worker.log")
        try:
            wait_until(lambda: logged(worker.log, "redis_waiting"), timeout=60)
            assert worker.proc.poll() is None  # still waiting, not gone
            admin.replicaof("NO", "ONE")  # promoted
            wait_until(lambda: logged(worker.log, "worker_started"), timeout=60)
        finally:
            worker.stop()
    finally:
        admin.close()
        server.stop()


def test_a_url_that_leads_to_a_replica_is_said_and_one_that_may_not_ask_role_is_not_refused(
    tmp_path: Path, model_server
):
    """A reader endpoint, or a failover's name not moved yet: a healthy replica answers
    PING and reads, and a worker started on it failed every write, slot after slot, never
    saying why (found by review). ROLE is asked at start: a replica is waited for as a
    failover is, then said. A user whose ACL refuses ROLE is not refused for that."""
    primary = RedisServer(tmp_path / "primary", password=PASSWORD).start()
    replica = RedisServer(tmp_path / "replica", password=PASSWORD).start()
    admin = redis.Redis(unix_socket_path=replica.socket, password=PASSWORD)
    secret = "role-less-secret-0123"
    try:
        admin.config_set("masterauth", PASSWORD)
        admin.replicaof("127.0.0.1", primary.port)
        wait_until(lambda: admin.info("replication")["master_link_status"] == "up", timeout=30)
        env = worker_env(replica.url, model_server.url, tmp_path, SWITCHBOARD_REDIS_START_WAIT="1")
        done = switchboard(env, "worker", timeout=60)
        assert done.returncode == 75, done.stderr  # waited for: the name may yet move
        last = done.stderr.rstrip().splitlines()[-1]
        assert last.startswith("switchboard: Redis is a replica, not the primary"), last
        assert PASSWORD not in done.stderr

        url = user_without(primary, "role", secret)
        done = switchboard(worker_env(url, model_server.url, tmp_path), "runs", "list", timeout=60)
        assert done.returncode == 0, done.stderr  # ROLE refused: not known, not a failure
    finally:
        admin.close()
        replica.stop()
        primary.stop()
