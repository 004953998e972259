"""`switchboard chat` connects too: a per-user tool finds the person at the terminal not
connected, the console prints the provider's URL and waits on a one-shot listener on
127.0.0.1 (switchboard/local_callback.py). The browser is httpx following the redirects, as
tests/test_connections.py's `sign_in` does, against the real OAuth server; the run is the
real loop on an RQ SimpleWorker in this process."""

from __future__ import annotations

import io
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
import redis

from switchboard.console import CONNECT_SECONDS, Console
from tests import test_connections_runs
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.support.oauth_server import OAuthMcpServer
from tests.support.runtime import make_runtime, tool_messages, work
from tests.test_connections import subject_of, with_connections
from worker.runtime import Runtime
from worker.service import connections as service

people_tool = test_connections_runs.people_tool  # the fixture: a tool that calls `whoami`
USER = "UCON"
TEAM = ""  # the console's runs have no Slack team


class Transcript(io.StringIO):
    """The console's stdout, which the test waits on."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()

    def write(self, text: str) -> int:
        with self.changed:
            written = super().write(text)
            self.changed.notify_all()
        return written

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 15.0) -> re.Match[str]:
        """The `count`-th match of `pattern`, once the console has printed it."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(found := list(re.finditer(pattern, self.getvalue()))) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {pattern!r} in:\n{self.getvalue()}")
                self.changed.wait(left)
        return found[count - 1]


@dataclass
class Running:
    rt: Runtime
    out: Transcript
    url: str  # the authorization URL the console printed
    exit: list[int]
    thread: threading.Thread

    @property
    def callback(self) -> str:
        """The listener's redirect URI, from the authorization URL."""
        return parse_qs(urlsplit(self.url).query)["redirect_uri"][0]

    def end(self) -> int:
        self.thread.join(15)
        assert not self.thread.is_alive() and self.exit, self.out.getvalue()
        return self.exit[0]


@contextmanager
def console_asking(
    rt: Runtime, questions: str, connect_seconds: float = CONNECT_SECONDS
) -> Iterator[Running]:
    """The console in a thread, asked `questions` (lines); its first run worked until it
    ends, and the URL it printed."""
    out = Transcript()
    stdin = io.StringIO(questions)
    console = Console(rt, user_id=USER, stdin=stdin, stdout=out, connect_seconds=connect_seconds)
    exit: list[int] = []
    thread = threading.Thread(target=lambda: exit.append(console.loop()), daemon=True)
    thread.start()
    try:
        out.wait_for(r"run \S+ queued")
        work(rt)  # the tool finds no connection; the run goes on and ends
        url = out.wait_for(r"Open this link.*\n  (\S+)").group(1)
        yield Running(rt, out, url, exit, thread)
    finally:
        thread.join(15)


def sign_in(url: str, user: str, *, deny: bool = False) -> httpx2.Response:
    """A browser: the provider's sign-in, then wherever it sends us back (followed)."""
    with httpx2.Client(follow_redirects=True, timeout=10) as browser:
        login = browser.get(url)
        assert login.status_code == 200 and "Sign in" in login.text, login.text
        return browser.get(str(login.url) + ("&deny=1" if deny else f"&user={user}"))


def closed(url: str) -> bool:
    try:
        httpx2.get(url, timeout=5)
    except httpx2.ConnectError:
        return True
    return False


@pytest.fixture
def rt(
    redis_conn: redis.Redis, model_server: FakeOpenAI, provider_server: OAuthMcpServer
) -> Runtime:
    return with_connections(make_runtime(redis_conn, model_server.url), provider_server)


def test_the_console_connects_on_its_local_port_and_the_tool_then_acts_as_the_person(
    rt: Runtime, model_server: FakeOpenAI, provider_server: OAuthMcpServer, people_tool: str
) -> None:
    model_server.route("who am I at People", [Turn(tool_calls=[(people_tool, {})]), "Done."])
    questions = "who am I at People?\nwho am I at People, now?\n"
    with console_asking(rt, questions) as running:
        assert running.callback.startswith("http://127.0.0.1:")
        page = sign_in(running.url, "carol")
        assert str(page.url).startswith(running.callback + "?")
        assert page.status_code == 200 and "People account is connected" in page.text
        assert page.headers["cache-control"] == "no-store"
        assert page.headers["referrer-policy"] == "no-referrer"
        running.out.wait_for("Connected your People account")
        assert closed(running.callback)  # one-shot: the listener is gone
        token = service.token_for(rt, TEAM, USER, "mcp:people")
        assert subject_of(provider_server, token) == "carol"

        running.out.wait_for(r"run \S+ queued", count=2)  # the next question
        work(rt)
        assert running.end() == 0
    assert tool_messages(model_server.last_chat_request)[-1] == "acting as carol"
    assert token not in running.out.getvalue()


def test_a_wrong_state_is_refused_and_a_replay_finds_nothing(
    rt: Runtime, model_server: FakeOpenAI, people_tool: str
) -> None:
    model_server.route("who am I at People", [Turn(tool_calls=[(people_tool, {})]), "Done."])
    with console_asking(rt, "who am I at People?\n") as running:
        forged = httpx2.get(running.callback, params={"state": "forged", "code": "x"}, timeout=5)
        assert forged.status_code == 400 and "not the connection" in forged.text
        assert service.listing(rt, TEAM, USER) == []
        assert "Not connected" not in running.out.getvalue()  # still waiting for its own

        page = sign_in(running.url, "carol")
        assert page.status_code == 200
        running.out.wait_for("Connected your People account")
        assert running.end() == 0
    query = dict(parse_qs(urlsplit(str(page.url)).query))
    assert closed(str(page.url))  # the same callback again: nothing listens
    with pytest.raises(service.ConnectRefused, match="already used"):  # nor anywhere else
        service.complete(rt, query["state"][0], query["code"][0])
    assert [c.provider for c in service.listing(rt, TEAM, USER)] == ["mcp:people"]


def test_a_refusal_at_the_provider_is_printed_and_the_next_offer_can_connect(
    rt: Runtime, model_server: FakeOpenAI, people_tool: str
) -> None:
    model_server.route("who am I at People", [Turn(tool_calls=[(people_tool, {})]), "Done."])
    questions = "who am I at People?\nwho am I at People, then?\n"
    with console_asking(rt, questions) as running:
        page = sign_in(running.url, "", deny=True)
        assert page.status_code == 400 and "the person said no" in page.text
        running.out.wait_for(r"! Not connected: People did not connect your account")
        assert closed(running.callback) and service.listing(rt, TEAM, USER) == []

        running.out.wait_for(r"run \S+ queued", count=2)
        work(rt)  # still not connected: offered again, on the same port, so the People
        # server's registration of that redirect URI (dynamic registration) still holds
        again = running.out.wait_for(r"Open this link.*\n  (\S+)", count=2).group(1)
        assert parse_qs(urlsplit(again).query)["redirect_uri"][0] == running.callback
        assert sign_in(again, "carol").status_code == 200
        running.out.wait_for("Connected your People account")
        assert running.end() == 0
    assert [c.provider for c in service.listing(rt, TEAM, USER)] == ["mcp:people"]


def test_no_browser_within_the_time_is_printed_and_changes_nothing(
    rt: Runtime, model_server: FakeOpenAI, people_tool: str
) -> None:
    model_server.route("who am I at People", [Turn(tool_calls=[(people_tool, {})]), "Done."])
    with console_asking(rt, "who am I at People?\n", connect_seconds=0.3) as running:
        running.out.wait_for("the browser did not come back")
        assert running.end() == 0
    assert closed(running.callback) and service.listing(rt, TEAM, USER) == []


def test_ctrl_c_stops_waiting_and_the_console_goes_on(
    rt: Runtime, model_server: FakeOpenAI, people_tool: str
) -> None:
    """The console in this (the main) thread, where Ctrl-C lands; a helper thread works the
    run and presses Ctrl-C (a real SIGINT) once the link shows."""
    model_server.route("who am I at People", [Turn(tool_calls=[(people_tool, {})]), "Done."])
    out = Transcript()
    console = Console(rt, user_id=USER, stdin=io.StringIO("who am I at People?\n"), stdout=out)
    main = threading.main_thread().ident
    assert main == threading.get_ident()
    seen: list[str] = []

    def person() -> None:
        out.wait_for(r"run \S+ queued")
        work(rt)
        url = out.wait_for(r"Open this link.*\n  (\S+)").group(1)
        seen.append(parse_qs(urlsplit(url).query)["redirect_uri"][0])
        signal.pthread_kill(main, signal.SIGINT)

    helper = threading.Thread(target=person, daemon=True)
    helper.start()
    assert console.loop() == 0  # it went on to the end of the run, then the end of input
    helper.join(15)
    text = out.getvalue()
    assert "you stopped waiting" in text and "[completed;" in text, text
    assert seen and closed(seen[0]) and service.listing(rt, TEAM, USER) == []
