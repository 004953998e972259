"""The grounding check: facts an answer states that no tool returned (figures, prices, ids,
quoted text, names) are flagged on the run, as an event, and under the answer in Slack and in
the terminal; facts that a tool result, the question or the operator's text has are not."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from switchboard.render import grounding_note, trajectory
from tests.fakes.openai_server import Turn
from tests.fakes.slack_server import app_mention
from tests.support.runtime import ALICE, make_runtime, work
from tests.support.slack_bot import ALICE as SLACK_ALICE
from tests.support.slack_bot import CHANNEL, BotEnv, texts
from tools.declare import make_tool
from worker import service
from worker.grounding import KEPT_SOURCES, _Facts, _json_strings, _standing, check
from worker.loop import _readable
from worker.model_base import ToolSpecs
from worker.run import RunStatus

TICKET = json.dumps({"id": 41, "project": "IT", "title": "Laptop will not charge"})
COURSE = json.dumps({"name": "Django Fundamentals", "fee": 2999, "currency": "INR"})


def test_invented_figures_prices_ids_and_names_are_each_flagged():
    found = check(
        "There are 101 open tickets. Django Fundamentals is $39.99 on Amazon Web Services; "
        "I opened IT-4521 and order ORD-2024-0042, write to help@acme.example.",
        ["How much is Django Fundamentals?"],
    )
    assert found.numbers == ["101", "39.99"]
    assert found.identifiers == ["IT-4521", "ORD-2024-0042", "help@acme.example"]
    assert found.names == ["Amazon Web Services"]
    assert found.verdict == "ungrounded" and found.invented == found.numbers + found.identifiers


def test_facts_a_tool_returned_or_the_question_has_are_not_flagged():
    sources = [TICKET, COURSE, "What does Django Fundamentals cost, and is my laptop ticket open?"]
    answer = (
        'I opened IT ticket *#41* "Laptop will not charge" (IT-41). Django Fundamentals costs '
        "INR 2,999.00 — step 2 of 3, reply in 24h, from the 3rd."
    )
    assert check(answer, sources).facts == []
    # a small price is a price, a small count is not
    assert check("It costs $5, in 2 steps", []).numbers == ["5"]
    # a name capitalised only because the sentence starts there
    assert check("Closed HR ticket #41. Two HR tickets are open.", [TICKET, "HR"]).facts == []


def test_names_joined_by_and_are_found_one_by_one():
    sources = ['{"name":"Python Basics"}', '{"name":"Data Analysis with Pandas"}']
    assert check("Data Analysis with Pandas and Python Basics", sources).names == []


def test_unicode_escaped_json_results_count_as_their_text():
    source = json.dumps({"title": "Café “Lumière” déménagement"})  # \u escapes
    assert check('It is the "Café “Lumière” déménagement" ticket', [source]).names == []


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.lists(st.text(max_size=200), max_size=4))
def test_the_check_never_raises_and_flags_only_what_the_answer_says(answer, sources):
    found = check(answer, sources)
    assert all(isinstance(f, str) and f and f in answer for f in found.facts)


fact_text = st.lists(
    st.sampled_from(["Python Basics", "IT-41", "2999", "$39.99", '{"fee": 1999}', "x", " "]),
    max_size=6,
).map(" ".join)


@settings(max_examples=100, deadline=None)
@given(fact_text, st.lists(fact_text, max_size=3), st.lists(fact_text, max_size=3))
def test_standing_sources_count_as_sources_and_only_they_are_kept(answer, sources, standing):
    # The instructions and tool descriptions are read once and kept (issue 28); a tool
    # result is not kept, however often it is checked.
    assert check(answer, sources, standing) == check(answer, [*sources, *standing])
    before = _standing.cache_info().currsize
    check(answer, [f"{answer} {n}" for n in range(KEPT_SOURCES + 2)])
    assert _standing.cache_info().currsize == before <= KEPT_SOURCES


words = st.sampled_from(
    ["Python Basics", "IT-41", "#41", "2999", "$39.99", "ORD-2024-0042", '"Laptop fix"', "a@b.io"]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(words, min_size=1, max_size=6), st.text(max_size=60))
def test_facts_copied_from_a_source_are_never_flagged(facts, filler):
    source = " ".join(facts)
    answer = filler.replace("\n", " ") + " " + ", ".join(facts) + "."
    assert not set(check(answer, [source]).facts) & set(facts)


def test_a_completed_run_with_invented_facts_records_the_verdict_and_shows_it(
    redis_conn, model_server, tickets_db
):
    model_server.route(
        "laptop",
        [
            Turn(tool_calls=[("search_tickets", {"query": "laptop"})]),
            "Your laptop ticket is IT-4521, handled by Acme Repairs Ltd.",
        ],
    )
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "Is there a ticket about my laptop?", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED
    assert run.grounding is not None and run.grounding.verdict == "ungrounded"
    assert run.grounding.identifiers == ["IT-4521"]
    assert run.grounding.names == ["Acme Repairs Ltd"]
    [event] = [e for e in rt.events.read(run.id) if e.kind == "ungrounded_facts"]
    assert event.data["identifiers"] == ["IT-4521"] and event.data["verdict"] == "ungrounded"
    # the terminal: under the answer (`switchboard chat`) and in `switchboard runs show`
    note = grounding_note(run)
    assert "IT-4521" in note and "Acme Repairs Ltd" in note
    assert note in trajectory(run, rt.events.read(run.id))


def test_a_grounded_answer_is_recorded_as_such_and_shows_no_note(
    redis_conn, model_server, tickets_db
):
    model_server.route(
        "Django fee",
        [Turn(tool_calls=[("knowledge_lookup", {"name": "Django Fundamentals"})]), "INR 2999."],
    )
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "What is the Django fee?", ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert run.grounding is not None and run.grounding.verdict == "grounded"
    assert not [e for e in rt.events.read(run.id) if e.kind == "ungrounded_facts"]
    assert grounding_note(run) == ""


def test_the_slack_answer_carries_a_context_line_naming_the_invented_facts(
    env: BotEnv, model_server
):
    model_server.route("order", ["Your order ORD-2024-0042 ships on Monday via DHL Express."])
    mention = app_mention("<@UBOT> Where is my order?", user=SLACK_ALICE)
    env.event(mention)
    env.wait_for_runs(1)
    env.settle()
    env.work()
    [run] = env.runs()
    assert run.status == RunStatus.COMPLETED and run.ungrounded == [
        "ORD-2024-0042",
        "DHL Express",
    ]
    thread = [m for m in env.slack.thread(CHANNEL, mention["ts"]) if m["ts"] != mention["ts"]]
    contexts = [
        texts([b]) for m in thread for b in m.get("blocks") or [] if b.get("type") == "context"
    ]
    assert any("Check these facts: ORD-2024-0042, DHL Express" in c for c in contexts)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=4))
def test_the_offered_tools_are_read_as_their_entries_encoded_whatever_their_text(described):
    """The check reads the offered tools from the request's own text of them (ToolSpecs),
    decoded once per set of tools: the same text as the entries encoded at every run's end,
    whatever a description holds (quotes, accents, line breaks, what JSON escapes)."""
    tools = [
        make_tool(lambda: "x", effect="read", name=f"t{n}", description=f"d {text}")
        for n, text in enumerate(described)
    ]
    specs = ToolSpecs(tools)
    assert _readable(specs.text) == json.dumps(list(specs), ensure_ascii=False)


plain_text = st.one_of(
    st.sampled_from(["IT-41", "$39.99", "a@b.io", "Python Basics", "2,999", "-5", " x  y "]),
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters='"\\'),
        max_size=30,
    ),
)
plain_json = st.recursive(
    plain_text | st.integers() | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(plain_text, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(plain_text, plain_json, max_size=5) | st.lists(plain_json, max_size=5))
def test_a_json_text_without_escapes_holds_each_of_its_strings_facts(value):
    """Why a tool result without a backslash is read once, not once more per string: each
    string's tokens, figures, addresses and normalised text are the whole text's already."""
    for text in (json.dumps(value, ensure_ascii=False), json.dumps(value, separators=(",", ":"))):
        if "\\" in text:
            continue
        whole = _Facts(text)
        for string in _json_strings(text):
            own = _Facts(string)
            assert own.tokens <= whole.tokens and own.emails <= whole.emails, string
            assert own.numbers <= whole.numbers, string
            assert own.normal in whole.normal, string
