"""OpenAI-compatible servers that bend the protocol: the run goes on, bounded and correct."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.openai_server import ToolCall, Turn
from tests.support.runtime import ALICE, approve_first, make_runtime, tool_messages, work
from tools.builtin.tickets import TicketStore
from worker import service
from worker.run import EndReason, RunStatus


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


_texts = st.text(max_size=30)
_arguments = st.one_of(
    st.none(),
    st.just('{"expression": "1 + 1"}'),
    _texts,
    st.dictionaries(st.text(max_size=8), st.integers() | _texts, max_size=3),
    st.integers(),
    st.lists(st.integers(), max_size=2),
)
_function = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "name": st.one_of(st.none(), st.sampled_from(["calculate", "nope", ""]), _texts),
            "arguments": _arguments,
        }
    ),
)
_call = st.fixed_dictionaries(
    {
        "id": st.one_of(st.none(), st.sampled_from(["", "call_0"]), _texts),
        "type": st.one_of(st.none(), st.sampled_from(["function", "custom"])),
        "function": _function,
    }
)
_message = st.fixed_dictionaries(
    {
        "role": st.just("assistant"),
        "content": st.one_of(st.none(), _texts),
        "tool_calls": st.one_of(st.none(), st.lists(_call, max_size=3)),
    },
    optional={"refusal": st.one_of(st.none(), _texts)},
)
_reply = st.fixed_dictionaries(
    {
        "message": _message,
        "finish_reason": st.one_of(
            st.none(), st.sampled_from(["stop", "tool_calls", "length", "content_filter"]), _texts
        ),
    },
    optional={
        "usage": st.one_of(
            st.none(),
            st.just({}),
            st.fixed_dictionaries(
                {"prompt_tokens": st.integers(0, 10**6), "completion_tokens": st.integers(0, 10**6)}
            ),
        )
    },
)
_examples = itertools.count()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(reply=_reply)
def test_any_reply_the_client_lets_through_ends_in_an_answer_or_a_stated_reason(
    redis_conn, model_server, reply
):
    question = f"odd reply {next(_examples)}"
    model_server.route(question, [Turn(raw=reply), "Done after all."])
    rt = make_runtime(redis_conn, model_server.url, model_retries=0)
    run = service.submit(rt, question, ALICE)
    work(rt)
    run = rt.store.load(run.id)
    assert run.status in (RunStatus.COMPLETED, RunStatus.PARTIAL), (run.status, run.detail)
    assert run.reason != EndReason.INTERNAL_ERROR
    if run.status == RunStatus.PARTIAL:
        assert run.reason is not None and run.detail
    for message in run.messages:
        if message.get("role") == "tool":
            assert len(message["content"]) < 2500
