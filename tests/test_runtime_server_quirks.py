"""OpenAI-compatible servers that bend the protocol: the run goes on, bounded and correct."""

from __future__ import annotations

from tests.fakes.openai_server import ToolCall, Turn
from tests.runtime_helpers import ALICE, approve_first, make_runtime, tool_messages, work
from tools.builtin.tickets import TicketStore
from worker import service
from worker.run import RunStatus


def _ticket(title: str) -> Turn:
    return Turn(tool_calls=[ToolCall("create_ticket", {"project": "IT", "title": title}, "call_0")])


def test_call_ids_numbered_per_turn_get_an_approval_each(redis_conn, model_server, tickets_db):
    model_server.route("per-turn ids", [_ticket("first"), _ticket("second"), "Filed both."])
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "per-turn ids: file two tickets", ALICE)
    work(rt)
    first = rt.store.load(run.id).pending_approvals
    approve_first(rt, run.id)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.AWAITING_APPROVAL  # a new card for the second proposal
    second = run.pending_approvals
    assert second and second != first
    request = rt.approvals.get(second[0])
    assert request.args["title"] == "second" and request.status == "pending"
    approve_first(rt, run.id)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED and run.answer == "Filed both."
    assert TicketStore(tickets_db).count_executions("create_ticket") == 2


def test_arguments_sent_as_an_object_are_read_not_fatal(redis_conn, model_server):
    as_object = ToolCall("calculate", {"expression": "6 * 7"}, as_object=True)
    model_server.route("object args", [Turn(tool_calls=[as_object]), "It is 42."])
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "object args: what is 6 * 7?", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED, run.detail
    assert tool_messages(model_server.last_chat_request) == ["42"]
