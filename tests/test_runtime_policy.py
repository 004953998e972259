"""Least privilege over the real loop: with a policy file that names only a read tool, the
write tools it does not name are not offered, not run, not asked about and not demonstrated;
`defaults:` grants them back. Real Redis, real RQ, the openai client against the fake."""

from __future__ import annotations

from pathlib import Path

import pytest

from approvals import ApprovalRequest
from tests.fakes.openai_server import Turn
from tests.support.runtime import ALICE, event_kinds, make_runtime, tool_messages, work
from tools.builtin.tickets import TicketStore
from tools.registry import Tool
from worker import service
from worker.library import Selector, TaskLibrary
from worker.run import Run, RunStatus
from worker.surface import SilentSurface

READ_ONLY = "tools:\n  knowledge_lookup:\n    allow: [everyone]\n"
GRANT_WRITES = "defaults:\n  write:\n    allow: [everyone]\n"

CREATE = Turn(
    tool_calls=[("create_ticket", {"project": "IT", "title": "Laptop won't charge", "body": ""})]
)
TICKET_QUESTION = "My laptop won't charge any more, can you open an IT ticket?"


class RecordingSurface(SilentSurface):
    """Records the approval cards the runtime asks a surface to show."""

    def __init__(self) -> None:
        self.cards: list[str] = []

    def approval_requested(self, run: Run, request: ApprovalRequest, tool: Tool) -> None:
        self.cards.append(tool.name)


def policy_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def offered(request: dict) -> set[str]:
    return {spec["function"]["name"] for spec in request.get("tools", [])}


def test_an_unnamed_write_tool_is_not_offered_and_a_call_to_it_is_denied(
    redis_conn, model_server, tickets_db, tmp_path
):
    model_server.route(TICKET_QUESTION, [CREATE, "I can't open tickets for you."])
    surface = RecordingSurface()
    rt = make_runtime(
        redis_conn,
        model_server.url,
        policy_file=policy_file(tmp_path, READ_ONLY),
        surfaces={"slack": surface},
    )
    run = service.submit(rt, TICKET_QUESTION, ALICE, origin={"surface": "slack"})
    work(rt)

    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED, run.detail
    assert offered(model_server.chat_requests[0]) == {"knowledge_lookup"}
    # the scripted call is a denial observation, like any other
    [observation] = tool_messages(model_server.last_chat_request)
    assert observation.lower().startswith("error: you may not call create_ticket")
    denied = [e.data for e in rt.events.read(run.id) if e.kind == "tool_denied"]
    assert [d["tool"] for d in denied] == ["create_ticket"]
    # no approval request, no card, no execution
    assert "approval_requested" not in event_kinds(rt, run)
    assert rt.approvals.pending() == [] and run.pending_approvals == []
    assert surface.cards == []
    assert TicketStore(tickets_db).count_executions("create_ticket") == 0
    assert not {"tool_result", "write_started"} & set(event_kinds(rt, run))


def test_the_denial_tells_the_model_why_and_what_to_ask_for(
    redis_conn, model_server, tickets_db, tmp_path
):
    model_server.route(TICKET_QUESTION, [CREATE, "I can't open tickets for you."])
    rt = make_runtime(redis_conn, model_server.url, policy_file=policy_file(tmp_path, READ_ONLY))
    service.submit(rt, TICKET_QUESTION, ALICE)
    work(rt)
    [observation] = tool_messages(model_server.last_chat_request)
    assert "the policy file grants no rule for create_ticket" in observation
    assert "under `tools:`" in observation


def test_defaults_grant_the_unnamed_write_tool_again(
    redis_conn, model_server, tickets_db, tmp_path
):
    model_server.route(TICKET_QUESTION, [CREATE, "Ticket filed."])
    surface = RecordingSurface()
    rt = make_runtime(
        redis_conn,
        model_server.url,
        policy_file=policy_file(tmp_path, READ_ONLY + GRANT_WRITES),
        surfaces={"slack": surface},
    )
    run = service.submit(rt, TICKET_QUESTION, ALICE, origin={"surface": "slack"})
    work(rt)

    run = rt.store.load(run.id)
    first = offered(model_server.chat_requests[0])
    assert first == {"knowledge_lookup", "create_ticket", "update_ticket", "close_ticket"}
    # offered and asked about like any write: the requester approves (the built-in fields)
    assert run.status == RunStatus.AWAITING_APPROVAL, run.detail
    assert surface.cards == ["create_ticket"]
    [request] = rt.approvals.pending()
    assert request.tool == "create_ticket"


@pytest.mark.parametrize(
    ("policy", "shows_open_ticket"),
    [(READ_ONLY, False), (READ_ONLY + GRANT_WRITES, True)],
    ids=["write-not-granted", "write-granted"],
)
def test_demonstrations_never_show_a_tool_the_policy_does_not_grant(
    redis_conn, model_server, tickets_db, tmp_path, policy, shows_open_ticket
):
    model_server.route(TICKET_QUESTION, ["Noted."])
    rt = make_runtime(redis_conn, model_server.url, policy_file=policy_file(tmp_path, policy))
    rt.demos = Selector(TaskLibrary(redis_conn), k=3)
    run = service.submit(rt, TICKET_QUESTION, ALICE)
    work(rt)

    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED, run.detail
    assert ("open-ticket" in run.demos) is shows_open_ticket
    messages = model_server.chat_requests[0]["messages"]
    demonstrated = {c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
    assert demonstrated <= offered(model_server.chat_requests[0])
    assert ("create_ticket" in demonstrated) is shows_open_ticket
