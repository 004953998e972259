"""The task library: validated against the tools, selected per question, curated by people."""

from __future__ import annotations

import contextlib

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import tools.builtin
from switchboard.cli import main
from tests.fakes.openai_server import Turn
from tests.support.runtime import ALICE, make_runtime, work
from tools.registry import ToolRegistry, registry
from worker import service
from worker.grounding import untraceable
from worker.library import (
    DEFAULT_LIBRARY,
    DemoError,
    Selector,
    TaskLibrary,
    check,
    load_file,
    parse,
)
from worker.run import RunStatus

FEE_QUESTION = "What is the total fee for Django Fundamentals and its prerequisite course?"
FEE_SCRIPT = [
    Turn(tool_calls=[("knowledge_lookup", {"name": "Django Fundamentals"})]),
    Turn(tool_calls=[("knowledge_lookup", {"name": "Python Basics"})]),
    Turn(tool_calls=[("calculate", {"expression": "2999 + 1999"})]),
    "Together they cost INR 4998.",
]


@pytest.fixture
def cli_env(cli_env, monkeypatch, model_server):
    """conftest's, with the fake model server as the configured one."""
    monkeypatch.setenv("OPENAI_BASE_URL", model_server.url)


def test_shipped_library_matches_the_tools():
    """The shipped library is written for the built-in samples: checked against them
    alone, whatever else a test run has registered globally."""
    samples = ToolRegistry()
    tools.builtin.load(samples)
    assert check(load_file(DEFAULT_LIBRARY), samples) == []


def test_demos_check_names_a_demonstration_that_calls_a_removed_tool(
    cli_env, tmp_path, monkeypatch, capsys
):
    demos = yaml.safe_load(DEFAULT_LIBRARY.read_text())
    demos["demonstrations"].append(
        {
            "id": "purge-old-tickets",
            "task": "Delete stale tickets",
            "question": "Delete every ticket older than a year",
            "steps": [[{"tool": "purge_tickets", "args": {"days": 365}, "result": "ok"}]],
            "answer": "Done.",
        }
    )
    demos["demonstrations"].append(
        {
            "id": "bad-arguments",
            "task": "Look up a course",
            "question": "What is SQL Basics?",
            "steps": [[{"tool": "knowledge_lookup", "args": {"title": "SQL"}, "result": "x"}]],
            "answer": "A course.",
        }
    )
    path = tmp_path / "demos.yaml"
    path.write_text(yaml.safe_dump(demos))
    monkeypatch.setenv("SWITCHBOARD_DEMOS", str(path))
    assert main(["demos", "check"]) == 1
    out = capsys.readouterr().out
    assert "purge-old-tickets" in out and "purge_tickets" in out
    assert "bad-arguments" in out and "title" in out
    # and start-up refuses the same library, naming it
    assert main(["runs", "list"]) == 2
    assert "purge-old-tickets" in capsys.readouterr().err


def test_fee_question_selects_fee_and_prerequisite_demonstrations(
    redis_conn, model_server, tickets_db
):
    model_server.route(FEE_QUESTION, FEE_SCRIPT)
    rt = make_runtime(redis_conn, model_server.url)
    rt.demos = Selector(TaskLibrary(redis_conn), k=2)
    run = service.submit(rt, FEE_QUESTION, ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    assert set(run.demos) == {"course-fee-total", "course-prerequisite-chain"}
    assert any(e.kind == "demos_selected" for e in rt.events.read(run.id))
    # shown to the model as native tool-call messages before the question
    first = model_server.chat_requests[0]["messages"]
    demo_ids = [c["id"] for m in first if m.get("tool_calls") for c in m["tool_calls"]]
    assert demo_ids and all(i.startswith("demo_") for i in demo_ids)
    assert first[-1] == {"role": "user", "content": FEE_QUESTION}
    # and not on later steps of the same run: the same demonstrations, not a new selection
    later = model_server.chat_requests[-1]["messages"]
    assert [m for m in later if m.get("role") == "user"][:-1] == [
        m for m in first if m.get("role") == "user"
    ][:-1]


def test_demonstrations_with_tools_the_user_may_not_call_are_never_selected(redis_conn):
    selector = Selector(TaskLibrary(redis_conn), k=3)
    allowed = set(registry.names()) - {"create_ticket"}
    chosen = selector.select("Please open an IT ticket, my laptop is broken", allowed)
    assert "open-ticket" not in [d.id for d in chosen]
    assert all(d.tools <= allowed for d in chosen)
    assert selector.select("hello there", set(registry.names())) == []


def test_a_promoted_run_is_selected_only_after_review(
    redis_conn, model_server, tickets_db, cli_env, capsys
):
    question = "How long is the Django REST APIs course in weeks?"
    model_server.route(
        question,
        [Turn(tool_calls=[("knowledge_lookup", {"name": "Django REST APIs"})]), "Six weeks."],
    )
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, question, ALICE)
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED

    assert main(["demos", "add", "--from-run", run.id]) == 0
    demo_id = f"run-{run.id}"
    library = TaskLibrary(redis_conn)
    selector = Selector(library, k=3)
    similar = "How many weeks does the Django REST APIs course take?"
    assert demo_id in [d.id for d in library.candidates()]
    assert demo_id not in [d.id for d in selector.select(similar, set(registry.names()))]
    assert main(["demos", "list", "--candidates"]) == 0
    assert demo_id in capsys.readouterr().out

    assert main(["demos", "review", "--accept", demo_id]) == 0
    assert f"accepted {demo_id}" in capsys.readouterr().out
    assert demo_id in [d.id for d in selector.select(similar, set(registry.names()))]
    assert main(["demos", "list"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if demo_id in line]
    assert listed and "accepted" in listed[0] and "used     1" in listed[0]


def test_only_completed_runs_with_calls_can_be_promoted(redis_conn, model_server, tickets_db):
    model_server.route("just chat", ["Hello!"])
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "just chat", ALICE)
    work(rt)
    from worker.library import candidate_from_run

    with pytest.raises(DemoError, match="no successful tool call"):
        candidate_from_run(rt.store.load(run.id))


def test_an_answer_with_an_untraceable_number_is_flagged(redis_conn, model_server, tickets_db):
    model_server.route(
        "SQL fee",
        [
            Turn(tool_calls=[("knowledge_lookup", {"name": "SQL Basics"})]),
            "SQL Basics costs INR 2499, or about 5000 with the exam.",
        ],
    )
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "What is the SQL fee?", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    assert run.ungrounded == ["5000"]
    assert run.grounding is not None and run.grounding.verdict == "ungrounded"
    flagged = [e for e in rt.events.read(run.id) if e.kind == "ungrounded_facts"]
    assert flagged and flagged[0].data["numbers"] == ["5000"]


def test_grounding_accepts_numbers_from_results_in_other_formats():
    assert untraceable("Total: INR 4,998.00 (2999 + 1999)", ['{"fee": 2999}', "1999", "4998"]) == []
    assert untraceable("It is 12.5% of 80", ["80", "12.50"]) == []
    assert untraceable("Step 2 of 3, then 7 more", []) == []  # 0..10 are not checked
    assert untraceable("a refund of -42", ["42"]) == []
    assert untraceable("about 5000 or 4,999", ["4998"]) == ["5000", "4,999"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.lists(st.text(max_size=100), max_size=5))
def test_grounding_never_raises(answer, sources):
    flagged = untraceable(answer, sources)
    assert all(isinstance(n, str) and n in answer for n in flagged)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["id", "task", "question", "answer", "steps", "tags"]),
        st.one_of(
            st.text(max_size=20),
            st.lists(st.text(max_size=5), max_size=3),
            st.integers(),
            st.none(),
        ),
    )
)
def test_demonstration_parser_only_raises_demo_errors(data):
    with contextlib.suppress(DemoError):
        demo = parse(data, "fuzz")
        assert demo.id and demo.steps


def test_embedding_selection_through_the_endpoint_is_cached_in_redis(redis_conn, model_server):
    import openai

    from worker.library import CachedEmbeddings

    client = openai.OpenAI(base_url=model_server.url, api_key="test")
    embed = CachedEmbeddings(client, "text-embedding-3-small", redis_conn)
    selector = Selector(TaskLibrary(redis_conn), k=2, embed=embed)
    chosen = selector.select(FEE_QUESTION, set(registry.names()))
    assert len(chosen) == 2 and "course-fee-total" in [d.id for d in chosen]
    calls = len(model_server.embedding_requests)
    selector.select(FEE_QUESTION, set(registry.names()))
    assert len(model_server.embedding_requests) == calls  # demos and question both cached


def test_demonstrations_can_go_into_the_instructions_as_text(redis_conn):
    from worker.prompt import build_messages
    from worker.run import Requester, Run

    demos = Selector(TaskLibrary(redis_conn), k=2).select(FEE_QUESTION, set(registry.names()))
    run = Run(
        id="r1",
        question=FEE_QUESTION,
        requester=Requester(user_id="U1"),
        messages=[{"role": "user", "content": FEE_QUESTION}],
    )
    as_text = build_messages(run, demos, demos_as_text=True)
    assert len(as_text) == 2 and "call knowledge_lookup(" in as_text[0]["content"]
    as_messages = build_messages(run, demos)
    assert len(as_messages) > 2 and not any(
        "call knowledge_lookup(" in str(m.get("content")) for m in as_messages
    )
