"""The controller loop end to end: real Redis, real RQ SimpleWorker, the real openai client
talking HTTP to a fake model that replays scripted turns."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.fakes.openai_server import Fault, Script, Turn
from tests.support.runtime import (
    ALICE,
    approve_first,
    event_kinds,
    make_runtime,
    tool_messages,
    work,
)
from worker import service
from worker.run import Budgets, EndReason, RunStatus

FEE_QUESTION = "What is the total fee for Django Fundamentals and its prerequisite course?"


def test_course_fee_two_lookups_and_a_calculation(redis_conn, model_server, tickets_db):
    model_server.route(
        "Django Fundamentals",
        Script(
            [
                Turn(tool_calls=[("knowledge_lookup", {"name": "Django Fundamentals"})]),
                Turn(tool_calls=[("knowledge_lookup", {"name": "Python Basics"})]),
                Turn(tool_calls=[("calculate", {"expression": "2999 + 1999"})]),
                Turn("Django Fundamentals (2999) plus Python Basics (1999) comes to *4998*."),
            ]
        ),
    )
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, FEE_QUESTION, ALICE)
    work(rt)

    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED, run.detail
    assert "4998" in (run.answer or "")
    results = [e.data for e in rt.events.read(run.id) if e.kind == "tool_result"]
    assert [r["tool"] for r in results] == ["knowledge_lookup", "knowledge_lookup", "calculate"]
    assert "2999" in results[0]["result"] and "Python Basics" in results[0]["result"]
    assert "1999" in results[1]["result"]
    assert results[2]["result"] == "4998"
    assert run.usage.steps == 4 and run.usage.tool_calls == 3
    assert run.usage.prompt_tokens > 0 and run.usage.completion_tokens > 0
    # the model saw each observation, in order, as native tool messages
    assert tool_messages(model_server.last_chat_request)[-1] == "4998"
    # tools offered: only what the user may call, as strict function specs
    offered = {t["function"]["name"] for t in model_server.chat_requests[0]["tools"]}
    assert {"knowledge_lookup", "calculate", "create_ticket"} <= offered


def test_parallel_reads_in_one_turn_all_reach_the_model(redis_conn, model_server, tickets_db):
    model_server.route(
        "both fees",
        [
            Turn(
                tool_calls=[
                    ("knowledge_lookup", {"name": "SQL Basics"}),
                    ("knowledge_lookup", {"name": "Python Basics"}),
                ]
            ),
            "SQL Basics is 2499 and Python Basics is 1999.",
        ],
    )
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "What are both fees: SQL Basics and Python Basics?", ALICE)
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    observed = tool_messages(model_server.last_chat_request)
    assert len(observed) == 2 and "2499" in observed[0] and "1999" in observed[1]


def test_the_reads_of_one_turn_run_at_the_same_time(redis_conn, model_server, tickets_db):
    """Each call waits at a barrier for the other: run one after the other, the first would
    wait out the barrier's timeout and fail."""
    from tools.declare import make_tool
    from tools.registry import registry

    barrier = threading.Barrier(2, timeout=5)

    def meet(who: str) -> str:
        """Wait for the other caller.

        Args:
            who: Who is waiting.
        """
        barrier.wait()
        return f"{who} met the other"

    registry.register(make_tool(meet, effect="read"))
    try:
        model_server.route(
            "meet twice",
            [
                Turn(tool_calls=[("meet", {"who": "first"}), ("meet", {"who": "second"})]),
                "Both met.",
            ],
        )
        rt = make_runtime(redis_conn, model_server.url)
        run = service.submit(rt, "meet twice", ALICE)
        work(rt)
    finally:
        registry.unregister("meet")
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    assert tool_messages(model_server.last_chat_request) == [
        "first met the other",
        "second met the other",
    ]


def test_reads_outside_their_runs_thread_are_bounded_per_process(
    redis_conn, model_server, tickets_db
):
    """A process runs at most max(8, 4 x concurrency) reads at once outside their runs'
    threads (plus each run's first): a turn asking for more waits for a place, and every
    read still runs."""
    from tools.declare import make_tool
    from tools.registry import registry

    lock = threading.Lock()
    running = [0, 0]  # now, most at once

    def slow_read(n: int) -> str:
        """Take a while.

        Args:
            n: Which call this is.
        """
        with lock:
            running[0] += 1
            running[1] = max(running)
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return f"read {n}"

    registry.register(make_tool(slow_read, effect="read"))
    try:
        calls = [("slow_read", {"n": n}) for n in range(12)]
        model_server.route("twelve reads", [Turn(tool_calls=calls), "Done."])
        rt = make_runtime(redis_conn, model_server.url, concurrency=1)  # 8 places
        run = service.submit(rt, "twelve reads", ALICE)
        work(rt)
    finally:
        registry.unregister("slow_read")
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    assert tool_messages(model_server.last_chat_request) == [f"read {n}" for n in range(12)]
    assert 8 <= running[1] <= 8 + 1  # the places were all taken, and never more


def test_a_tool_handler_runs_with_its_runs_log_context(redis_conn, model_server, tickets_db):
    """Handlers run in threads of their own: each is given the calling run's context, so
    what a handler logs names the run (both the first read, waited for in the run's
    thread, and the second, in a thread of its own)."""
    import structlog

    from tools.declare import make_tool
    from tools.registry import registry

    def bound_run(n: int) -> str:
        """The run id bound in the handler's log context.

        Args:
            n: Which call this is.
        """
        return f"{n}: {structlog.contextvars.get_contextvars().get('run_id')}"

    registry.register(make_tool(bound_run, effect="read"))
    try:
        model_server.route(
            "which run",
            [Turn(tool_calls=[("bound_run", {"n": 1}), ("bound_run", {"n": 2})]), "Done."],
        )
        rt = make_runtime(redis_conn, model_server.url)
        run = service.submit(rt, "which run", ALICE)
        work(rt)
    finally:
        registry.unregister("bound_run")
    assert tool_messages(model_server.last_chat_request) == [f"1: {run.id}", f"2: {run.id}"]


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("no_such_tool", "{}", "no tool named"),
        ("knowledge_lookup", '{"name": "Python Basics"', "JSON"),
        ("knowledge_lookup", '{"name": "Python Basics", "extra": 1}', "extra"),
        ("knowledge_lookup", '{"name": 42}', "name"),
        ("calculate", '{"expression": NaN}', "NaN"),
        ("knowledge_lookup", json.dumps({"name": "x" * 1_000_000}), "too large"),
        ("knowledge_lookup", '{"name": "a", "name": "b"}', "duplicate"),
    ],
    ids=["unknown-tool", "invalid-json", "extra-property", "wrong-type", "nan", "1mb", "dup-keys"],
)
def test_bad_calls_become_bounded_observations(
    redis_conn, model_server, tickets_db, name, arguments, expected
):
    model_server.route("bad call", [Turn(tool_calls=[(name, arguments)]), "Sorry, I could not."])
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "bad call please", ALICE)
    work(rt)

    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    [observation] = tool_messages(model_server.last_chat_request)
    assert observation.startswith("Error:")
    assert expected.lower() in observation.lower()
    assert len(observation) < 2500  # bounded, never an echo of the input
    assert {"tool_invalid", "tool_denied"} & set(event_kinds(rt, run))


def test_a_first_repeat_is_answered_with_the_earlier_result_and_a_second_ends_the_run(
    redis_conn, model_server, tickets_db
):
    call = ("knowledge_lookup", {"name": "SQL Basics"})
    turns = [Turn(tool_calls=[call]), Turn(tool_calls=[call]), Turn(tool_calls=[call]), "done"]
    model_server.route("repeat", turns)
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "repeat yourself", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert (run.status, run.reason) == (RunStatus.PARTIAL, EndReason.REPEATED_CALL)
    assert "same arguments" in run.detail and run.usage.steps == 3
    first, second = tool_messages(model_server.last_chat_request)
    assert "SQL Basics" in first and not first.startswith("Error")
    assert second.startswith("Error: you already called knowledge_lookup") and "step 1" in second
    assert first[:100] in second  # the earlier result, quoted
    assert event_kinds(rt, run).count("tool_result") == 1  # the read ran once


def test_reading_again_after_an_approved_write_is_not_a_repeat(
    redis_conn, model_server, tickets_db
):
    search = ("search_tickets", {"query": "printer"})
    create = ("create_ticket", {"project": "IT", "title": "printer"})
    turns = [Turn(tool_calls=[search]), Turn(tool_calls=[create]), Turn(tool_calls=[search]), "ok"]
    model_server.route("read write read", turns)
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "read write read", ALICE)
    work(rt)
    approve_first(rt, run.id)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED, run.detail
    results = tool_messages(model_server.last_chat_request)
    assert len(results) == 3 and not results[2].startswith("Error")
    assert "printer" in results[2]  # the new ticket is found on the second read


def test_a_tool_the_user_may_not_call_is_hidden_and_denied(
    redis_conn, model_server, tickets_db, tmp_path
):
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "roles:\n  support: [USUPPORT]\n"
        "tools:\n  close_ticket:\n    allow: [support]\n    approvers: [support]\n"
        "defaults:\n  read: {allow: [everyone]}\n"
    )
    model_server.route(
        "close it",
        [Turn(tool_calls=[("close_ticket", {"ticket_id": 1, "resolution": "done"})]), "I can't."],
    )
    rt = make_runtime(redis_conn, model_server.url, policy_file=policy)
    run = service.submit(rt, "close it now", ALICE)
    work(rt)

    offered = {t["function"]["name"] for t in model_server.chat_requests[0]["tools"]}
    assert "close_ticket" not in offered
    [observation] = tool_messages(model_server.last_chat_request)
    assert "may not call close_ticket" in observation
    denied = [e for e in rt.events.read(run.id) if e.kind == "tool_denied"]
    assert denied and denied[0].data["user"] == "UALICE"
    assert rt.approvals.pending() == []


@pytest.mark.parametrize(
    ("budgets", "turn", "reason"),
    [
        (
            Budgets(max_steps=2),
            Turn(tool_calls=[("calculate", {"expression": "1+1"})]),
            "max_steps",
        ),
        (
            Budgets(max_tokens=50),
            Turn(tool_calls=[("calculate", {"expression": "1+2"})], usage=(40, 20)),
            "tokens",
        ),
        (
            Budgets(max_cost=0.0001),
            Turn(tool_calls=[("calculate", {"expression": "1+3"})], usage=(10_000, 1000)),
            "cost",
        ),
        (
            Budgets(max_tool_calls=2),
            Turn(tool_calls=[("calculate", {"expression": f"{n}*2"}) for n in range(3)]),
            "tool_calls",
        ),
    ],
    ids=["steps", "tokens", "cost", "tool-calls"],
)
def test_budgets_end_the_run_partial_with_the_reason(
    redis_conn, model_server, tickets_db, budgets, turn, reason
):
    # each turn asks for a different calculation so the repeat check does not fire first
    turns = [
        Turn(tool_calls=[("calculate", {"expression": f"{i}+{i}"})], usage=turn.usage)
        for i in range(1, 4)
    ]
    if reason == "tool_calls":
        turns = [turn]
    model_server.route("budget", [*turns, "done"])
    rt = make_runtime(redis_conn, model_server.url, budgets=budgets, model="gpt-4o")
    run = service.submit(rt, "budget test", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert (run.status, run.reason) == (RunStatus.PARTIAL, EndReason(reason)), run.detail
    assert run.detail
    assert "run_partial" in event_kinds(rt, run)


def test_deadline_cuts_a_slow_model_call(redis_conn, model_server, tickets_db):
    model_server.route("slow", [Turn("late answer", delay=3.0)])
    rt = make_runtime(redis_conn, model_server.url, budgets=Budgets(deadline_seconds=1.0))
    run = service.submit(rt, "slow question", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert (run.status, run.reason) == (RunStatus.PARTIAL, EndReason.DEADLINE), run.detail


@pytest.mark.parametrize(
    ("turn", "reason"),
    [
        (Turn("cut off mid", finish_reason="length"), EndReason.LENGTH),
        (Turn(refusal="I can't help with that."), EndReason.REFUSED),
        (Turn("", finish_reason="content_filter"), EndReason.CONTENT_FILTER),
    ],
    ids=["length", "refusal", "content-filter"],
)
def test_model_endings_other_than_stop_are_partial(
    redis_conn, model_server, tickets_db, turn, reason
):
    model_server.route("ending", [turn])
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "ending test", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert (run.status, run.reason) == (RunStatus.PARTIAL, reason)


def test_a_429_is_retried_then_succeeds(redis_conn, model_server, tickets_db):
    model_server.route("rate", Script(["fine"], faults={0: [Fault.rate_limit(0.05)]}))
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "rate limited question", ALICE)
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    assert len(model_server.chat_requests) == 2


@pytest.mark.parametrize(
    "faults",
    [[Fault.server_error()] * 3, [Fault.dropped()] * 3],
    ids=["500-three-times", "dropped-connection"],
)
def test_model_server_failures_end_partial_and_the_worker_stays_healthy(
    redis_conn, model_server, tickets_db, faults
):
    model_server.route("flaky", Script(["never seen"], faults={0: faults}))
    model_server.route("healthy", ["all good"])
    rt = make_runtime(redis_conn, model_server.url)
    bad = service.submit(rt, "flaky question", ALICE)
    good = service.submit(rt, "healthy question", ALICE)
    work(rt)
    bad_run, good_run = rt.store.load(bad.id), rt.store.load(good.id)
    assert (bad_run.status, bad_run.reason) == (RunStatus.PARTIAL, EndReason.MODEL_ERROR)
    assert good_run.status == RunStatus.COMPLETED
    assert len([r for r in model_server.chat_requests if "flaky" in str(r)]) == 3  # 1 + 2 retries


def test_model_call_timeout_is_bounded(redis_conn, model_server, tickets_db):
    model_server.route("hang", Script(["too late"], faults={0: [Fault.slow(5)] * 3}))
    rt = make_runtime(redis_conn, model_server.url, model_timeout=0.5, model_retries=1)
    run = service.submit(rt, "hang please", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert (run.status, run.reason) == (RunStatus.PARTIAL, EndReason.MODEL_ERROR)
    assert "did not finish within" in run.detail


def test_unknown_schema_version_fails_fast(redis_conn, model_server):
    from worker.run import RunSchemaError

    rt = make_runtime(redis_conn, model_server.url)
    redis_conn.set(
        rt.store.keys.run("rfuture"), json.dumps({"schema_version": 99, "id": "rfuture"})
    )
    with pytest.raises(RunSchemaError, match="schema_version 99"):
        rt.store.load("rfuture")


def test_lone_surrogates_from_the_model_or_the_user_do_not_break_a_run(
    redis_conn, model_server, tickets_db
):
    model_server.route(
        "odd text",
        [
            Turn(tool_calls=[("knowledge_lookup", '{"name": "SQL \ud800Basics"}')]),
            "SQL Basics costs 2499 \udfff.",
        ],
    )
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "odd text \ud800 here", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED, run.detail
    assert run.answer == "SQL Basics costs 2499 ?."
    assert run.question == "odd text ? here"
