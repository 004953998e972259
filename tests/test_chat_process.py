"""`switchboard chat` as a person meets it: a real process in a pseudo-terminal, on the
embedded Redis of an empty data directory, against the fake model. Ctrl-C, a closed
terminal and kill -9 leave every run recoverable and no process behind."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from tests.fakes.openai_server import Fault, Script, Turn
from tests.support.processes import MARK, ROOT, embedded_socket, kill_marked, marked, worker_env
from tests.support.runtime import wait_until
from tests.support.terminal import Terminal
from tools.builtin.tickets import TicketStore

pytestmark = pytest.mark.slow

TICKET = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Mouse broken"})])


class Chats:
    """Starts `switchboard chat` terminals sharing one data directory; cleans up after."""

    def __init__(self, env: dict[str, str], tmp: Path, mark: str) -> None:
        self.env, self.tmp, self.mark = env, tmp, mark
        self.open: list[Terminal] = []

    def start(self, *args: str, until: str = "you> ", verb: str = "chat") -> Terminal:
        terminal = Terminal([verb, *args], self.env, ROOT)
        self.open.append(terminal)
        terminal.expect(until, timeout=60)
        return terminal

    def redis(self) -> redis.Redis:
        """A connection to the embedded Redis (close it before the last chat ends: the
        server stops with its last client)."""
        socket = embedded_socket(self.tmp / "data")
        assert socket is not None, "no embedded Redis: the chat says where once it is up"
        return redis.Redis(unix_socket_path=socket)

    def run_status(self, run_id: str) -> str:
        conn = self.redis()
        try:
            raw = conn.get(f"sb:run:{run_id}")
            return str(json_field(raw, "status")) if raw else ""
        finally:
            conn.close()

    def workers(self, terminal: Terminal) -> list[int]:
        return [p.pid for p in psutil.Process(terminal.proc.pid).children(recursive=True)]

    def close(self) -> None:
        for terminal in self.open:
            terminal.close()
        kill_marked(self.mark, self.tmp)

    def leftovers(self) -> list[int]:
        """Processes still running that a chat started: workers, the embedded Redis."""
        return marked(self.mark, self.tmp)


def json_field(raw: bytes, name: str) -> object:
    import json

    return json.loads(raw)[name]


@pytest.fixture
def chats(model_server, tmp_path) -> Iterator[Chats]:
    mark = uuid.uuid4().hex
    env = worker_env("", model_server.url, tmp_path, **{MARK: mark})
    del env["REDIS_URL"]  # the embedded Redis, as on a fresh clone
    env["SWITCHBOARD_LOG_FORMAT"] = "console"
    helper = Chats(env, tmp_path, mark)
    yield helper
    helper.close()


def run_id_of(text: str) -> str:
    found = re.search(r"run (r[0-9a-f]+) queued", text)
    assert found, text
    return found.group(1)


def test_ctrl_c_says_it_stops_within_seconds_and_the_next_chat_finishes_the_run(
    chats, model_server
):
    model_server.route("slow", Script(["The slow answer."], faults={0: [Fault.slow(30)]}))
    model_server.route("next", ["Next answer."])
    first = chats.start()
    assert "no worker was running; started one" in first.output
    first.send("a slow question")
    run_id = run_id_of(first.expect("queued"))
    wait_until(lambda: model_server.chat_requests, what="the model to be asked")
    pressed = time.monotonic()
    first.interrupt()
    first.expect(f"Run {run_id} goes on without the console")
    first.expect("Stopping the worker; runs in flight go back to the queue")
    assert first.wait(15) == 130
    # well before the 30 s model call ends: it does not hold the exit up (loose: CI is loaded)
    assert time.monotonic() - pressed < 20
    assert "Traceback" not in first.output
    wait_until(lambda: not marked_workers(chats), timeout=10, what="its worker to stop")

    second = chats.start()
    second.send("next question")
    second.expect("Next answer.")
    wait_until(lambda: chats.run_status(run_id) == "completed", timeout=30, what="the run")
    second.send("")
    assert second.wait(15) == 0
    wait_until(lambda: not chats.leftovers(), timeout=10, what="no process left")


def marked_workers(chats: Chats) -> list[int]:
    return [
        pid
        for pid in marked(chats.mark)
        if "worker" in " ".join(psutil.Process(pid).cmdline())  # not redis-server
    ]


def test_chat_and_its_worker_killed_mid_run_the_next_chat_answers_and_the_run_completes(
    chats, model_server
):
    model_server.route("slow", Script(["The slow answer."], faults={0: [Fault.slow(30)]}))
    model_server.route("after", ["Still here after the crash."])
    first = chats.start()
    first.send("a slow question")
    run_id = run_id_of(first.expect("queued"))
    wait_until(lambda: model_server.chat_requests, what="the run to be mid-call")
    [worker] = chats.workers(first)
    os.kill(worker, signal.SIGKILL)
    first.kill9()
    # The killed worker is still registered with RQ; the next chat must not trust that.
    conn = chats.redis()
    assert conn.scard("rq:workers:switchboard") > 0
    conn.close()

    second = chats.start()
    assert "no worker was running; started one" in second.output
    second.send("after the crash, are you there?")
    second.expect("Still here after the crash.")
    wait_until(lambda: chats.run_status(run_id) == "completed", timeout=30, what="the run")
    second.send("")
    assert second.wait(15) == 0
    wait_until(lambda: not chats.leftovers(), timeout=10, what="no process left")


def test_when_its_worker_dies_the_console_starts_another_and_answers(chats, model_server):
    model_server.route("still", ["Still answering."])
    chat = chats.start()
    [worker] = chats.workers(chat)
    os.kill(worker, signal.SIGKILL)
    chat.send("still there?")
    chat.expect("(the worker stopped, exit -9; started it again")
    chat.expect("Still answering.")
    chat.send("")
    assert chat.wait(15) == 0


def test_a_closed_terminal_stops_the_chat_and_its_worker(chats):
    chat = chats.start()
    [worker] = chats.workers(chat)
    chat.hang_up()
    chat.wait(15)
    wait_until(lambda: not psutil.pid_exists(worker), timeout=15, what="the worker to stop")
    wait_until(lambda: not chats.leftovers(), timeout=10, what="no redis-server left")


def test_a_chat_killed_outright_takes_its_worker_with_it(chats):
    chat = chats.start()
    [worker] = chats.workers(chat)
    chat.kill9()
    wait_until(lambda: not psutil.pid_exists(worker), timeout=15, what="the orphaned worker")


def test_an_approval_left_at_ctrl_c_is_offered_again_by_the_next_chat(
    chats, model_server, tmp_path
):
    model_server.route("Mouse", [TICKET, "Filed ticket #1."])
    first = chats.start()
    first.send("Mouse broken, file it")
    first.expect("approve? [y]es / [e]dit / [n]o [reason] / [i]nstruct: ")
    first.interrupt()
    text = first.expect("or `switchboard chat`.")
    assert "Leaving run" in text and "switchboard approvals approve ap_" in text
    assert first.wait(15) == 130

    second = chats.start(until="[s]kip: ")
    assert "1 approval(s) wait for you." in second.output
    assert '"title": "Mouse broken"' in second.output
    second.send("y")
    second.expect("Filed ticket #1.")
    second.expect("you> ")
    second.send("")
    assert second.wait(15) == 0
    assert TicketStore(tmp_path / "tickets.sqlite3").count_executions("create_ticket") == 1


def test_the_console_shows_the_conversation_not_log_lines(chats, model_server):
    model_server.route("hello", ["Hello <@console:root>, *welcome*."])
    chat = chats.start()
    chat.send("hello")
    chat.expect("Hello @console:root, welcome.")  # plain text, not Slack markup
    chat.send("")
    assert chat.wait(15) == 0
    for noise in ("[info", "[warning", "worker_started", "embedded_redis", "child_started"):
        assert noise not in chat.output, chat.output
    logs = chats.tmp / "data" / "switchboard" / "logs" / "worker.log"
    assert "worker_started" in logs.read_text()


def test_verbose_shows_the_log_lines(chats, model_server):
    chat = chats.start("--verbose")
    chat.expect("worker_started")
    chat.send("")
    assert chat.wait(15) == 0


def test_dev_stops_at_a_second_ctrl_c_without_a_traceback(chats, model_server):
    """The console of `dev` (no Slack tokens) with two workers, a run mid-call."""
    model_server.route("slow", Script(["The slow answer."], faults={0: [Fault.slow(30)]}))
    dev = chats.start("--workers", "2", verb="dev")
    dev.send("a slow question")
    dev.expect("queued")
    wait_until(lambda: model_server.chat_requests, what="the model to be asked")
    dev.interrupt()
    dev.expect("Stopping the workers")
    pressed = time.monotonic()
    dev.interrupt()
    dev.expect("Stopping now.")
    assert dev.wait(10) == 130
    assert time.monotonic() - pressed < 20  # a second or two on an idle machine; 30 s call
    assert "Traceback" not in dev.output
    wait_until(lambda: not marked_workers(chats), timeout=10, what="the workers to stop")


def test_worker_processes_stop_at_ctrl_c_without_a_traceback(chats):
    workers = Terminal(["worker", "--processes", "2"], chats.env, ROOT)
    chats.open.append(workers)
    wait_until(lambda: len(marked_workers(chats)) == 3, timeout=30, what="two worker processes")
    workers.interrupt()
    workers.interrupt()
    assert workers.wait(15) == 0
    assert "Traceback" not in workers.output
    wait_until(lambda: not marked_workers(chats), timeout=10, what="the workers to stop")
