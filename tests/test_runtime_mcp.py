"""MCP servers configured through SWITCHBOARD_MCP, in the real loop: a real Redis, RQ workers,
the real openai client against the fake model server, and real MCP servers (`mcp-server-time`
from PyPI; our notes server over stdio and streamable HTTP). Reads run at once; every other
tool waits for an approval card, runs exactly once when approved and never when rejected;
a worker killed with -9 in the middle of an MCP write reports it as unknown, not retried."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

import tools.mcp
from approvals import LedgerState
from bot.render.blocks import APPROVE
from switchboard.settings import Config
from switchboard.wiring import build_runtime
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import app_mention
from tests.support.mcp_servers import (
    NotesServer,
    installed,
    starts,
    stdio_notes,
    write_config,
)
from tests.support.processes import WorkerProcess, worker_env
from tests.support.runtime import (
    ALICE,
    approve_first,
    tool_messages,
    wait_for_run,
    wait_until,
    work,
)
from tests.support.slack_bot import ALICE as SLACK_ALICE
from tests.support.slack_bot import bot_env, buttons, has_button, texts
from worker import service
from worker.run import RunStatus
from worker.runtime import Runtime

Build = Callable[[Path], Runtime]


@pytest.fixture(params=["stdio", "http"])
def servers_file(request: pytest.FixtureRequest, notes_dir: Path, tmp_path: Path) -> Path:
    """mcp-server-time and our notes server (over the transport of the parameter), with the
    default tool name prefixes ("time_", "notes_")."""
    if request.param == "stdio":
        notes = stdio_notes(notes_dir)
    else:
        server = NotesServer(notes_dir)
        request.addfinalizer(server.stop)
        notes = {"url": server.url}
    return write_config(
        tmp_path / "mcp.yaml", {"time": {"command": installed("mcp-server-time")}, "notes": notes}
    )


@pytest.fixture
def build(redis_conn: redis.Redis, model_server: FakeOpenAI) -> Iterator[Build]:
    """The runtime every process builds from its configuration, SWITCHBOARD_MCP included."""
    files: list[Path] = []

    def build_from(mcp_file: Path) -> Runtime:
        files.append(mcp_file)
        config = Config(
            SWITCHBOARD_MCP=str(mcp_file),
            OPENAI_BASE_URL=model_server.url,
            OPENAI_API_KEY="test",
            SWITCHBOARD_MODEL="gpt-fake",
        )
        return build_runtime(config, redis_conn)

    yield build_from
    for path in files:
        tools.mcp.unload(tools.mcp.load(path))  # the loaded servers; their tools leave the registry


def test_read_only_tools_run_at_once_without_asking_anyone(
    build: Build, servers_file: Path, model_server: FakeOpenAI
) -> None:
    model_server.route(
        "time and notes",
        [
            Turn(
                tool_calls=[
                    ("time_get_current_time", {"timezone": "Asia/Tokyo"}),
                    ("notes_list_notes", {}),
                ]
            ),
            "It is morning in Tokyo and there are no notes.",
        ],
    )
    rt = build(servers_file)
    assert rt.registry.get("notes_add_note") is not None
    run = service.submit(rt, "time and notes?", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED, run.detail
    assert rt.approvals.pending() == []
    observed = tool_messages(model_server.last_chat_request)
    assert '"timezone": "Asia/Tokyo"' in observed[0] and observed[1] == "[]"


def test_writes_wait_for_approval_run_once_when_approved_and_never_when_rejected(
    build: Build, servers_file: Path, model_server: FakeOpenAI, notes_dir: Path
) -> None:
    model_server.route(
        "add a note", [Turn(tool_calls=[("notes_add_note", {"title": "Q3 plan"})]), "Added."]
    )
    model_server.route(
        "delete note 1",
        [Turn(tool_calls=[("notes_delete_note", {"note_id": 1})]), "It was not deleted."],
    )
    rt = build(servers_file)
    added = service.submit(rt, "add a note: Q3 plan", ALICE)
    deleted = service.submit(rt, "delete note 1", ALICE)
    work(rt)
    for run in (added, deleted):
        assert rt.store.load(run.id).status == RunStatus.AWAITING_APPROVAL
    [add_id] = rt.store.load(added.id).pending_approvals
    [delete_id] = rt.store.load(deleted.id).pending_approvals
    request = rt.approvals.get(add_id)
    assert request.tool == "notes_add_note"  # the approval shows what the server will use
    assert request.args == {
        "title": "Q3 plan", "body": "", "tags": None, "priority": "normal", "due": None,
        "owner": None,
    }  # fmt: skip
    assert rt.policy.rule("notes_delete_note").high_risk  # destructiveHint: a confirmation
    assert starts(notes_dir, "add_note") == [] and starts(notes_dir, "delete_note") == []

    approve_first(rt, added.id)
    outcome = service.decide(
        rt, delete_id, decider_id=ALICE.user_id, decider_roles=frozenset(ALICE.roles),
        approve=False, reason="keep it",
    )  # fmt: skip
    assert outcome.result == service.DecisionResult.DECIDED
    work(rt)
    assert rt.store.load(added.id).status == RunStatus.COMPLETED
    assert rt.store.load(deleted.id).status == RunStatus.COMPLETED
    assert starts(notes_dir, "add_note") == [add_id]  # once, with its idempotency key
    assert starts(notes_dir, "delete_note") == []  # rejected: never
    observed = [m for r in model_server.chat_requests for m in tool_messages(r)]
    assert "added note 1" in observed
    assert any("rejected this call: keep it" in text for text in observed)

    again = service.decide(
        rt, add_id, decider_id=ALICE.user_id, decider_roles=frozenset(ALICE.roles), approve=True
    )
    assert again.result != service.DecisionResult.DECIDED
    work(rt)
    assert starts(notes_dir, "add_note") == [add_id]


def test_mcp_writes_post_approval_cards_in_slack_and_destructive_ones_ask_to_confirm(
    redis_conn: redis.Redis,
    model_server: FakeOpenAI,
    notes_dir: Path,
    tmp_path: Path,
    build: Build,
) -> None:
    path = write_config(tmp_path / "mcp.yaml", {"notes": stdio_notes(notes_dir)})
    build(path)  # loads the servers into the registry, as the bot's start-up does
    model_server.route(
        "clean up",
        [
            Turn(
                tool_calls=[
                    ("notes_add_note", {"title": "Keep"}),
                    ("notes_delete_note", {"note_id": 7}),
                ]
            ),
            "Done.",
        ],
    )
    with bot_env(redis_conn, model_server.url, tmp_path) as env:
        env.event(app_mention("<@UBOT> clean up the notes", user=SLACK_ALICE))
        env.wait_for_runs(1)
        env.work()
        # the two writes of one turn share one card, a decision per item (bot.render.batch_card)
        [card] = env.slack.wait_for(lambda: _cards(env.slack.calls("chat.postMessage")))
        items = {
            env.rt.approvals.get(buttons([b])[APPROVE]).tool: b
            for b in card["blocks"]
            if b.get("block_id", "").startswith("sb_item_")
        }
    shown = texts(card["blocks"])
    assert '"title": "Keep"' in shown and '"note_id": 7' in shown
    assert "Delete a note for good." in shown  # the server's description
    add, delete = ({"blocks": [items[name]]} for name in ("notes_add_note", "notes_delete_note"))
    assert _approve_button(delete).get("confirm") and not _approve_button(add).get("confirm")
    assert starts(notes_dir, "add_note") == [] and starts(notes_dir, "delete_note") == []


def _cards(posted: list[dict]) -> list[dict]:
    return [c for c in posted if has_button(APPROVE)(c)]


def _approve_button(card: dict) -> dict:
    for block in card["blocks"]:
        for element in block.get("elements") or []:
            if element.get("action_id") == APPROVE:
                return element
    raise AssertionError("no approve button")


# -- kill -9 ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_kill_minus_nine_during_an_mcp_write_reports_it_unknown_and_never_retries_it(
    transport: str,
    build: Build,
    redis_url: str,
    model_server: FakeOpenAI,
    notes_dir: Path,
    tmp_path: Path,
) -> None:
    server = NotesServer(notes_dir) if transport == "http" else None
    entry = {"url": server.url} if server else stdio_notes(notes_dir)
    path = write_config(tmp_path / "mcp.yaml", {"notes": entry})
    env = worker_env(
        redis_url,
        model_server.url,
        tmp_path,
        SWITCHBOARD_MCP=str(path),
        NOTES_DIR=str(notes_dir),
        SWITCHBOARD_LEASE_SECONDS="0.6",
        SWITCHBOARD_SWEEP_SECONDS="0.1",
    )
    rt = build(path)  # this process decides; the worker processes run the calls
    first = WorkerProcess(env, tmp_path / "w1.log")
    second = None
    try:
        model_server.route(
            "slow note",
            [Turn(tool_calls=[("notes_slow_note", {"title": "k1"})]), "Something happened."],
        )
        run = service.submit(rt, "slow note please", ALICE)
        wait_until(lambda: rt.store.load(run.id).status == RunStatus.AWAITING_APPROVAL, 30)
        [approval_id] = rt.store.load(run.id).pending_approvals
        approve_first(rt, run.id)
        wait_until(lambda: (notes_dir / "started-k1").exists(), 30, "the write to start")
        first.kill9()  # the worker, and a stdio server with it (its process group)
        killed = time.time()
        second = WorkerProcess(env, tmp_path / "w2.log")
        (notes_dir / "release").touch()
        ended = wait_for_run(rt, run.id, timeout=30)
        assert ended.ended_at is not None and ended.ended_at - killed < 15
        kinds = [e.kind for e in rt.events.read(run.id)]
        assert "write_unknown" in kinds
        assert "its outcome is unknown and it was not retried" in (ended.answer or "")
        assert starts(notes_dir, "slow_note") == [approval_id]  # sent once, never again
        assert rt.ledger.get(approval_id).state == LedgerState.FINISHED
    finally:
        (notes_dir / "release").touch()
        first.stop()
        if second is not None:
            second.stop()
        if server is not None:
            server.stop()
