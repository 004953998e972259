"""The SQLite ticket tracker: effects, exactly-once writes and reconcile hooks."""

import json
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tools import ToolContext
from tools.builtin import tickets
from tools.builtin.tickets import IdempotencyConflict, TicketError, TicketStore
from tools.exceptions import ArgumentError
from tools.execute import Observation, execute
from tools.registry import Tool

TOOLS = {tool.name: tool for tool in tickets.TOOLS}


SETTINGS: dict[str, str] = {}  # what every ctx() carries: the db_path fixture's database


@pytest.fixture
def db_path(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "tickets.sqlite3"
    SETTINGS["tickets_db"] = str(path)  # as SWITCHBOARD_TICKETS_DB would set it
    yield path
    SETTINGS.clear()


@pytest.fixture
def store(db_path: Path) -> TicketStore:
    return TicketStore(db_path)


def ctx(key: str | None = None, user: str = "U0ALICE") -> ToolContext:
    return ToolContext(
        user_id=user, run_id="run1", call_id="call1", idempotency_key=key, settings=dict(SETTINGS)
    )


@dataclass(frozen=True)
class Ran:
    """A call's observation, and the JSON the model reads in its text."""

    observation: Observation

    @property
    def ok(self) -> bool:
        return self.observation.ok

    @property
    def text(self) -> str:
        return self.observation.text

    @property
    def value(self) -> Any:
        return json.loads(self.observation.text)


def run(name: str, args: dict[str, Any], context: ToolContext) -> Ran:
    tool: Tool = TOOLS[name]
    return Ran(execute(tool, context, tool.validate(args)))


def test_effects_and_the_default_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert tickets.db_path({"tickets_db": str(tmp_path / "t.db")}) == tmp_path / "t.db"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert tickets.default_db_path() == tmp_path / "xdg" / "switchboard" / "tickets.sqlite3"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert tickets.default_db_path() == (
        Path.home() / ".local" / "share" / "switchboard" / "tickets.sqlite3"
    )


def test_tool_declarations() -> None:
    assert {name: tool.effect for name, tool in TOOLS.items()} == {
        "search_tickets": "read",
        "create_ticket": "write",
        "update_ticket": "write",
        "close_ticket": "write",
    }
    for name in ("create_ticket", "update_ticket", "close_ticket"):
        assert TOOLS[name].reconcile is not None
    assert "created_by" not in TOOLS["create_ticket"].parameters["properties"]
    with pytest.raises(ArgumentError, match="unknown parameter 'created_by'"):
        TOOLS["create_ticket"].validate({"project": "IT", "title": "x", "created_by": "U0EVE"})


def test_create_search_update_close(store: TicketStore, db_path: Path) -> None:
    created = run("create_ticket", {"project": "IT", "title": " VPN is down "}, ctx("k1"))
    assert created.ok, created.text
    ticket = created.value
    assert ticket["id"] == 1
    assert ticket["title"] == "VPN is down"
    assert ticket["priority"] == "normal"
    assert ticket["status"] == "open"
    assert ticket["created_by"] == "U0ALICE"

    run("create_ticket", {"project": "HR", "title": "Payslip 100% wrong", "body": "May"}, ctx("k2"))
    found = run("search_tickets", {"query": "vpn"}, ctx())
    assert [t["id"] for t in found.value["tickets"]] == [1]
    assert run("search_tickets", {"query": "100%"}, ctx()).value["total"] == 1
    assert run("search_tickets", {"project": "hr"}, ctx()).value["total"] == 1
    assert run("search_tickets", {"limit": 1}, ctx()).value == {
        "tickets": [run("search_tickets", {}, ctx()).value["tickets"][0]],
        "count": 1,
        "total": 2,
    }

    updated = run("update_ticket", {"ticket_id": 1, "priority": "urgent"}, ctx("k3"))
    assert updated.value["priority"] == "urgent"
    assert updated.value["title"] == "VPN is down"

    closed = run("close_ticket", {"ticket_id": 1, "resolution": "Rebooted the gateway"}, ctx("k4"))
    assert closed.value["status"] == "closed"
    assert closed.value["resolution"] == "Rebooted the gateway"
    assert closed.value["closed_at"]
    assert run("search_tickets", {}, ctx()).value["total"] == 1
    assert run("search_tickets", {"status": "closed"}, ctx()).value["tickets"][0]["id"] == 1
    assert run("search_tickets", {"status": "any"}, ctx()).value["total"] == 2
    assert store.count_executions() == 4


def test_the_same_key_runs_the_effect_exactly_once(store: TicketStore) -> None:
    args = {"project": "IT", "title": "Laptop will not boot"}
    first = run("create_ticket", args, ctx("approval-1"))
    second = run("create_ticket", args, ctx("approval-1"))
    assert first.ok and second.ok
    assert second.value == first.value
    assert store.count_executions("create_ticket") == 1
    assert run("search_tickets", {}, ctx()).value["total"] == 1


def test_concurrent_retries_with_one_key_run_once(store: TicketStore) -> None:
    args = TOOLS["create_ticket"].validate({"project": "IT", "title": "Printer on fire"})
    barrier = threading.Barrier(8)
    results: list[Observation] = []
    lock = threading.Lock()

    def attempt() -> None:
        barrier.wait()
        observation = execute(TOOLS["create_ticket"], ctx("approval-race"), args)
        with lock:
            results.append(observation)

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result.ok for result in results), [r.text for r in results]
    assert len({result.text for result in results}) == 1
    assert store.count_executions("create_ticket") == 1


def test_a_reused_key_with_different_arguments_is_an_error(store: TicketStore) -> None:
    run("create_ticket", {"project": "IT", "title": "One"}, ctx("approval-2"))
    changed = run("create_ticket", {"project": "IT", "title": "Two"}, ctx("approval-2"))
    assert not changed.ok
    assert changed.text.startswith("Error: IdempotencyConflict: idempotency key 'approval-2'")
    other_user = run("create_ticket", {"project": "IT", "title": "One"}, ctx("approval-2", "U0BOB"))
    assert not other_user.ok
    other_tool = run("close_ticket", {"ticket_id": 1, "resolution": "x"}, ctx("approval-2"))
    assert not other_tool.ok
    assert store.count_executions() == 1


def test_writes_without_a_key_run_every_time(store: TicketStore) -> None:
    run("create_ticket", {"project": "IT", "title": "Same"}, ctx(None))
    run("create_ticket", {"project": "IT", "title": "Same"}, ctx(None))
    assert store.count_executions("create_ticket") == 2


def test_reconcile_returns_the_stored_result_for_the_key(store: TicketStore) -> None:
    tool = TOOLS["create_ticket"]
    args = tool.validate({"project": "HR", "title": "New starter laptop"})
    assert tool.reconcile is not None
    assert tool.reconcile(ctx("approval-3"), args) is None
    created = Ran(execute(tool, ctx("approval-3"), args))
    assert tool.reconcile(ctx("approval-3"), args) == created.value
    assert tool.reconcile(ctx("approval-4"), args) is None
    assert tool.reconcile(ctx(None), args) is None
    with pytest.raises(IdempotencyConflict):
        tool.reconcile(ctx("approval-3"), {**args, "title": "Changed"})

    close = TOOLS["close_ticket"]
    close_args = close.validate({"ticket_id": created.value["id"], "resolution": "Ordered"})
    assert close.reconcile is not None
    assert close.reconcile(ctx("approval-5"), close_args) is None
    closed = Ran(execute(close, ctx("approval-5"), close_args))
    assert close.reconcile(ctx("approval-5"), close_args) == closed.value

    update = TOOLS["update_ticket"]
    update_args = update.validate({"ticket_id": 1, "title": "Renamed"})
    assert update.reconcile is not None
    assert update.reconcile(ctx("approval-6"), update_args) is None


def test_failed_writes_leave_no_trace(store: TicketStore) -> None:
    missing = run("close_ticket", {"ticket_id": 99, "resolution": "x"}, ctx("approval-7"))
    assert missing.text == "Error: TicketError: ticket #99 does not exist"
    assert store.count_executions() == 0
    run("create_ticket", {"project": "IT", "title": "Exists"}, ctx("approval-8"))
    # the failed key was not consumed: a later attempt with it can still succeed
    done = run("close_ticket", {"ticket_id": 99, "resolution": "x"}, ctx("approval-7"))
    assert not done.ok
    assert run("close_ticket", {"ticket_id": 1, "resolution": "Fixed"}, ctx("approval-9")).ok
    again = run("close_ticket", {"ticket_id": 1, "resolution": "Fixed"}, ctx("approval-10"))
    assert again.text == "Error: TicketError: ticket #1 is already closed"
    closed_update = run("update_ticket", {"ticket_id": 1, "title": "x"}, ctx("approval-11"))
    assert closed_update.text == "Error: TicketError: ticket #1 is already closed"
    nothing = run("update_ticket", {"ticket_id": 1}, ctx("approval-12"))
    assert nothing.text.startswith("Error: TicketError: nothing to update")
    assert store.count_executions() == 2


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"project": "IT", "title": "x" * 201}, "'title'"),
        ({"project": "IT", "title": ""}, "'title'"),
        ({"project": "IT", "title": "t", "body": "b" * 10_001}, "'body'"),
        ({"project": "I T", "title": "t"}, "'project'"),
        ({"project": "IT", "title": "t", "priority": "critical"}, "'priority' must be one of"),
    ],
)
def test_bounds_are_enforced_by_the_schema(args: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ArgumentError, match=fragment):
        TOOLS["create_ticket"].validate(args)


def test_blank_titles_are_refused(store: TicketStore) -> None:
    blank = run("create_ticket", {"project": "IT", "title": "   "}, ctx("approval-13"))
    assert blank.text == "Error: TicketError: title must not be blank"


def test_store_can_be_used_directly(tmp_path: Path) -> None:
    store = TicketStore(tmp_path / "nested" / "dir" / "t.sqlite3")
    ticket = store.create(
        project="IT", title="Direct", body="", priority="low", created_by="U1", key="k"
    )
    assert store.get(ticket["id"]) == ticket
    assert store.get(12345) is None
    assert store.count_executions("create_ticket") == 1
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT COUNT(*) FROM idempotency_keys").fetchone()[0] == 1
    with pytest.raises(TicketError):
        store.close(12345, "x", closed_by="U1")


CHILD = """
import sys
from tools.builtin.tickets import TicketStore
store = TicketStore(sys.argv[1])
ticket = store.create(project="IT", title="From a process", body="", priority="normal",
                      created_by="U1", key="approval-multi")
print(ticket["id"])
"""


def test_processes_racing_on_a_new_file_with_one_key_run_once(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [child.communicate(timeout=60) for child in children]
    assert [child.returncode for child in children] == [0, 0, 0, 0], outputs
    assert {out.strip() for out, _ in outputs} == {"1"}
    assert TicketStore(path).count_executions("create_ticket") == 1
