"""A run's tool calls carry typed outcomes (did the tool run and succeed), and promotion to a
demonstration reads them; runs saved before outcomes were recorded are read by the prefixes
of their observations."""

from __future__ import annotations

import json

import pytest

from tests.fakes.openai_server import Turn
from tests.support.runtime import ALICE, make_runtime, work
from worker import service
from worker.library import DemoError, candidate_from_run
from worker.run import Requester, Run, RunStatus


def completed(results: list[tuple[str, str]], outcomes: dict[str, bool] | None) -> Run:
    """A completed run with one turn calling knowledge_lookup once per (call id, result)."""
    calls = [
        {"id": cid, "type": "function", "function": {"name": "knowledge_lookup", "arguments": "{}"}}
        for cid, _ in results
    ]
    return Run(
        id="r1",
        status=RunStatus.COMPLETED,
        question="What does it cost?",
        requester=Requester(user_id="U1"),
        messages=[
            {"role": "user", "content": "What does it cost?"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            *({"role": "tool", "tool_call_id": cid, "content": text} for cid, text in results),
            {"role": "assistant", "content": "It costs 5."},
        ],
        answer="It costs 5.",
        outcomes=outcomes,
    )


def kept(run: Run) -> list[str]:
    return [call.result for step in candidate_from_run(run).steps for call in step]


def test_promotion_keeps_the_calls_whose_recorded_outcome_is_ok():
    run = completed(
        [("a", "Error: looks like an error, but the tool succeeded"), ("b", "no such course")],
        {"a": True, "b": False},
    )
    assert kept(run) == ["Error: looks like an error, but the tool succeeded"]


def test_a_call_with_no_recorded_outcome_never_reached_a_tool():
    run = completed([("a", "5"), ("b", "Error: you may not call it")], {"a": True})
    assert kept(run) == ["5"]
    with pytest.raises(DemoError, match="no successful tool call"):
        candidate_from_run(completed([("b", "5")], {}))


def test_runs_saved_before_outcomes_were_recorded_are_read_by_their_prefixes():
    new = completed(
        [("a", "5"), ("b", "Error: boom"), ("c", "Not run: rejected"), ("d", "Outcome unknown")],
        {"a": True},
    )
    saved = json.loads(new.to_json())
    del saved["outcomes"]  # as written before outcomes were recorded
    old = Run.from_json(json.dumps(saved))
    assert old.outcomes is None
    assert kept(old) == ["5"]
    old.record_outcome("e", True)  # a run begun the old way stays the old way
    assert old.outcomes is None
    assert Run.from_json(old.to_json()).outcomes is None
    assert Run.from_json(new.to_json()).outcomes == {"a": True}


def test_the_executor_records_whether_each_call_ran_and_succeeded(
    redis_conn, model_server, tickets_db
):
    question = "What does SQL Basics cost, and Cobol Basics?"
    model_server.route(
        question,
        [
            Turn(
                tool_calls=[
                    ("knowledge_lookup", {"name": "SQL Basics"}),
                    ("no_such_tool", {}),
                ]
            ),
            "SQL Basics costs INR 2499.",
        ],
    )
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, question, ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    [turn] = [m["tool_calls"] for m in run.messages if m.get("tool_calls")]
    looked_up, refused = (call["id"] for call in turn)
    assert run.outcomes == {looked_up: True}
    assert refused not in run.outcomes  # it never reached a tool
    results = {
        e.data["call_id"]: e.data["ok"] for e in rt.events.read(run.id) if e.kind == "tool_result"
    }
    assert results == run.outcomes
    assert [call.tool for step in candidate_from_run(run).steps for call in step] == [
        "knowledge_lookup"
    ]


@pytest.mark.parametrize("approve", [True, False])
def test_a_decided_write_records_an_outcome_only_when_it_ran(
    redis_conn, model_server, tickets_db, approve
):
    create = ("create_ticket", {"project": "IT", "title": "VPN is down", "body": "since 9am"})
    model_server.route("VPN", [Turn(tool_calls=[create]), "Done."])
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "file a ticket: VPN is down", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    [call] = run.turn
    service.decide(
        rt,
        run.pending_approvals[0],
        decider_id=ALICE.user_id,
        decider_roles=frozenset(ALICE.roles),
        approve=approve,
    )
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    assert run.outcomes == ({call.id: True} if approve else {})
