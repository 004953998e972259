"""Issue 21, item 1: slow or hostile clients cannot take the HTTP bot off Slack.

The attack that broke the old server: 70 connections that each send one header line every
few seconds held all 64 of its connection threads (its timeout was per `recv`, which a
trickle never hits), and correctly signed events got 503 or a refused connection. Over real
sockets to bot.transport.serve's server with the real Bolt app, FakeSlack and a real Redis
behind it.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.backoff import NoBackoff
from redis.retry import Retry
from structlog.testing import capture_logs

from bot.transport.http_server import Limits
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack, app_mention, event_callback, send_signed
from tests.support.processes import worker_env
from tests.support.runtime import wait_until
from tests.support.slack_bot import ALICE, BotEnv, bot_env

TRICKLERS = 70
TRICKLE_EVERY = 2.0  # seconds between two header lines of one slow connection
EVENTS = 5
SLACK_ACK = 3.0  # Slack's deadline for an answer


class Tricklers:
    """`count` connections that send a request line, then one header line every `every`
    seconds and never finish their headers (the slowloris attack)."""

    def __init__(self, port: int, count: int, every: float) -> None:
        self.port = port
        self.every = every
        self.sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
        for sock in self.sockets:
            sock.sendall(b"POST /slack/events HTTP/1.1\r\nHost: bot\r\n")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._trickle, daemon=True)
        self.rounds = 0  # header lines each connection has sent after its request line

    def _trickle(self) -> None:
        while not self.stop.wait(self.every):
            line = self.rounds + 1
            for sock in self.sockets:
                try:
                    sock.sendall(f"X-Trickle-{line}: {line}\r\n".encode())
                except OSError:  # the server closed it: it stays closed
                    continue
            self.rounds = line

    def __enter__(self) -> Tricklers:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        for sock in self.sockets:
            sock.close()

    def answered(self) -> list[bytes]:
        """What the server sent each connection that it answered or closed (b"" when closed
        without a word); connections still waiting are left out."""
        found = []
        for sock in self.sockets:
            try:
                data = sock.recv(200, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue  # open, nothing said: still trickling
            except OSError as exc:  # reset by the server
                found.append(errno.errorcode.get(exc.errno or 0, "reset").encode())
                continue
            found.append(data)
        return found

    def settled(self) -> bool:
        """Every connection was taken by the server (it holds an accepted socket for it) or
        was answered: the server has seen them all."""
        accepted = {
            c.raddr.port
            for c in psutil.Process().net_connections(kind="tcp")
            if c.laddr and c.laddr.port == self.port and c.raddr
        }
        mine = {s.getsockname()[1] for s in self.sockets}
        return len(mine & accepted) + len(self.answered()) >= len(self.sockets)


@pytest.fixture
def bot(redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path) -> Iterator[BotEnv]:
    with bot_env(redis_conn, model_server.url, tmp_path) as env:
        yield env


def timed_event(env: BotEnv, n: int) -> tuple[int, float]:
    body = json.dumps(event_callback(app_mention(f"<@UBOT> question {n}", user=ALICE)))
    started = time.monotonic()
    try:
        response = env.post(body, timeout=SLACK_ACK + 2)
    except OSError as exc:  # refused or reset: what Slack saw from the old server
        return -1 if exc.errno is None else -exc.errno, time.monotonic() - started
    return response.status, time.monotonic() - started


@pytest.mark.slow
def test_seventy_trickling_connections_leave_signed_events_answered_within_slacks_3s(
    bot: BotEnv,
) -> None:
    """Before: the 64 connection threads were all held by tricklers; the events got 503."""
    with Tricklers(bot.server.port, TRICKLERS, TRICKLE_EVERY) as slow:
        wait_until(slow.settled, what="the server to have seen every slow connection")
        wait_until(lambda: slow.rounds >= 1, what="a header line more from each")
        results = [timed_event(bot, n) for n in range(EVENTS)]
        still_open = TRICKLERS - len(slow.answered())
    assert [status for status, _ in results] == [200] * EVENTS, results
    assert max(elapsed for _, elapsed in results) < SLACK_ACK, results
    assert still_open == TRICKLERS  # the attack was on all along: nobody was cut off early
    bot.wait_for_runs(EVENTS)


def test_a_request_that_trickles_is_cut_at_the_whole_request_deadline(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    """Headers or a body that keep arriving, slowly, do not keep a connection: the deadline
    is for the whole request, not for each read (the old server's timeout was per read)."""
    with bot_env(redis_conn, model_server.url, tmp_path, request_seconds=1.0) as env:
        port = env.server.port
        clients = {  # what each sends first, then what it sends every TRICKLE seconds
            "headers": (b"POST /slack/events HTTP/1.1\r\nHost: bot\r\n", b"X-More: 1\r\n"),
            "body": (
                b"POST /slack/events HTTP/1.1\r\nHost: bot\r\nContent-Length: 100\r\n\r\n{",
                b"a",
            ),
            "silent": (b"", b""),  # connects and says nothing at all
        }
        sockets = {name: socket.create_connection(("127.0.0.1", port)) for name in clients}
        started = time.monotonic()
        for name, (first, _) in clients.items():
            sockets[name].sendall(first)
        cut: dict[str, bytes] = {}
        try:
            while len(cut) < len(clients) and time.monotonic() - started < 10:
                time.sleep(TRICKLE)  # the trickle itself: one line or byte at a time
                for name, (_, more) in clients.items():
                    if name not in cut:
                        cut.update(trickle(name, sockets[name], more))
            elapsed = time.monotonic() - started
        finally:
            for sock in sockets.values():
                sock.close()
    assert set(cut) == set(clients), cut
    assert elapsed < 5, elapsed  # the deadline (1 s) and a tick, not the 10 s this kept sending
    for name in clients:
        assert cut[name].startswith(b"HTTP/1.1 408"), cut


TRICKLE = 0.2


def trickle(name: str, sock: socket.socket, more: bytes) -> dict[str, bytes]:
    """{name: what the server said} once it answered or closed; else send `more`."""
    try:
        return {name: sock.recv(200, socket.MSG_DONTWAIT)}
    except BlockingIOError:
        pass
    except OSError as exc:
        return {name: f"error {exc}".encode()}
    try:
        sock.sendall(more)
    except OSError as exc:
        return {name: f"error {exc}".encode()}
    return {}


def test_livez_answers_without_asking_redis_and_healthz_asks_it(bot: BotEnv) -> None:
    def get(path: str) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", bot.server.port, timeout=5)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    assert get("/livez")[0] == 200
    assert get("/healthz")[0] == 200
    bot.rt.redis.connection_pool.disconnect()
    broken = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    healthy = bot.rt.redis
    bot.rt.redis = broken  # Redis is gone: not ready, but alive (no restart for Redis's sake)
    try:
        status, body = get("/healthz")
        assert status == 503 and b"redis" in body
        assert get("/livez")[0] == 200
    finally:
        bot.rt.redis = healthy
        broken.close()


@pytest.mark.slow
def test_the_http_bot_from_the_command_line_serves_both_secrets_and_stops_on_sigterm(
    redis_url: str, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    """`switchboard bot --http` as an operator runs it: uvicorn in the main thread, the
    signing secrets from the environment, SIGTERM answered by a clean stop (exit 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "data").mkdir()
    with FakeSlack(tokens={"xoxb-good"}) as slack:
        env = worker_env(
            redis_url,
            model_server.url,
            tmp_path,
            SLACK_BOT_TOKEN="xoxb-good",
            SLACK_SIGNING_SECRET="the-new-secret",
            SLACK_SIGNING_SECRET_PREVIOUS="the-old-secret",
            SLACK_API_URL=slack.url,
        )
        command = [sys.executable, "-m", "switchboard", "bot", "--http", "--port", str(port)]
        with subprocess.Popen(
            command, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True
        ) as bot:
            try:
                base = f"http://127.0.0.1:{port}"
                wait_until(lambda: alive(base), timeout=60, what="the bot to answer /livez")
                body = json.dumps(event_callback(app_mention("<@UBOT> hi", user=ALICE)))
                events = base + "/slack/events"
                old = send_signed(events, "the-old-secret", body)
                wrong = send_signed(events, "not-a-secret-of-ours", body)
                assert (old.status, wrong.status) == (200, 401)
                bot.send_signal(signal.SIGTERM)
                _, err = bot.communicate(timeout=30)
            finally:
                if bot.poll() is None:
                    bot.kill()
    assert bot.returncode == 0, err
    assert "bot_stopping" in err and "Traceback" not in err, err


def alive(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/livez", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def raw_request(port: int, data: bytes, *, then_close: bool = False) -> bytes:
    """Send `data` as it is and read the answer's status line (the server may close the
    connection before it has read everything: what it said is still there). `then_close`:
    say that nothing more comes (a body shorter than announced is then over)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
            if then_close:
                sock.shutdown(socket.SHUT_WR)
        answer = b""
        with contextlib.suppress(OSError):
            while b"\r\n" not in answer:
                chunk = sock.recv(200)
                if not chunk:
                    break
                answer += chunk
    return answer.split(b"\r\n", 1)[0]


def test_a_body_or_headers_past_their_limits_are_refused_before_bolt(bot: BotEnv) -> None:
    port = bot.server.port
    start = b"POST /slack/events HTTP/1.1\r\nHost: bot\r\nContent-Type: application/json\r\n"
    declared = raw_request(port, start + b"Content-Length: 1000001\r\n\r\n{}")
    chunk = b"%x\r\n%s\r\n" % (300_000, b"a" * 300_000)
    chunked = raw_request(port, start + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 4)
    headers = raw_request(port, start + b"X-Big: " + b"a" * 20_000 + b"\r\n\r\n")
    trickled = socket.create_connection(("127.0.0.1", port), timeout=10)
    grown = b""
    with trickled:  # headers that grow past the limit in pieces: h11 stops them
        trickled.sendall(start)
        for _ in range(20):
            with contextlib.suppress(OSError):
                trickled.sendall(b"X-Part: " + b"a" * 1000 + b"\r\n")
        with contextlib.suppress(OSError):
            grown = trickled.recv(200).split(b"\r\n", 1)[0]
    assert declared == b"HTTP/1.1 413 Request Entity Too Large"
    assert chunked == b"HTTP/1.1 413 Request Entity Too Large"
    assert headers == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert grown.startswith(b"HTTP/1.1 400")
    assert bot.runs() == []


def test_bodies_read_at_once_share_one_budget(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    """1,000 connections each sending a 1 MB body must not take 1 GB: past the budget for
    bodies being read, a request is turned away (503, Retry-After) instead of buffered."""
    limits = Limits(body_budget=1000, max_connections=50)
    with bot_env(redis_conn, model_server.url, tmp_path, limits=limits) as env:
        port = env.server.port
        start = b"POST /slack/events HTTP/1.1\r\nHost: bot\r\nContent-Length: 5000\r\n\r\n"
        holding = socket.create_connection(("127.0.0.1", port))
        with holding:  # 900 bytes of its body in, the rest never comes
            holding.sendall(start + b"a" * 900)
            wait_until(lambda: env.server.events.buffered == 900, what="900 bytes buffered")
            turned_away = raw_request(port, start + b"b" * 5000)
        wait_until(lambda: env.server.events.buffered == 0, what="the budget to be free again")
    assert turned_away == b"HTTP/1.1 503 Service Unavailable"


@pytest.fixture(scope="module")
def shared_bot(
    redis_url: str, fake_openai: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BotEnv]:
    conn = redis.Redis.from_url(redis_url)
    conn.flushdb()
    try:
        with bot_env(conn, fake_openai.url, tmp_path_factory.mktemp("framing")) as env:
            yield env
    finally:
        conn.flushdb()
        conn.close()


framing_values = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
    st.integers(min_value=-5, max_value=2_000_000).map(str),
    st.sampled_from(["", " 5", "5 ", "+5", "0x10", "1e3", "5, 5", "chunked", "gzip, chunked"]),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    length=st.none() | framing_values,
    encoding=st.none() | framing_values,
    body=st.binary(max_size=64),
)
def test_any_framing_of_an_unsigned_body_is_refused_cleanly(
    shared_bot: BotEnv, length: str | None, encoding: str | None, body: bytes
) -> None:
    """Whatever Content-Length and Transfer-Encoding say, an unsigned request ends in a
    4xx (or a closed connection), never a 5xx, an error in the log, or a run."""
    head = b"POST /slack/events HTTP/1.1\r\nHost: bot\r\nConnection: close\r\n"
    if length is not None:
        head += b"Content-Length: " + length.encode() + b"\r\n"
    if encoding is not None:
        head += b"Transfer-Encoding: " + encoding.encode() + b"\r\n"
    with capture_logs() as logs:
        status = raw_request(shared_bot.server.port, head + b"\r\n" + body, then_close=True)
    code = int(status.split()[1]) if status.startswith(b"HTTP/1.1 ") else None
    assert code is None or 400 <= code < 500, status
    assert [e for e in logs if e["log_level"] in ("error", "critical")] == []
    assert shared_bot.rt.queue.count == 0
