"""Streamed model replies (worker/streaming.py): any chunking of a reply accumulates to the turn
the same reply makes when sent whole; answer text reaches the sink only while the turn can
still be an answer. The adapter is checked against FakeOpenAI over HTTP with the real client."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.outbound.answers import settled, streamable
from tests.fakes.openai_server import FakeOpenAI, Fault, Script, Turn
from worker.model import ModelClient, read_turn
from worker.streaming import accumulate


class Recorder:
    """A TextSink that keeps what a reader would see: the text since the last reset."""

    def __init__(self) -> None:
        self.shown = ""
        self.resets = 0

    def text(self, delta: str) -> None:
        self.shown += delta

    def reset(self) -> None:
        self.shown = ""
        self.resets += 1


def objects(value: Any) -> Any:
    """JSON as the SDK hands it over: attributes, not validated (it builds replies that way)."""
    if isinstance(value, dict):
        return SimpleNamespace(**{key: objects(item) for key, item in value.items()})
    if isinstance(value, list):
        return [objects(item) for item in value]
    return value


def whole(reply: dict[str, Any]) -> Any:
    choice = objects({"index": 0, "message": reply["message"], "finish_reason": reply["finish"]})
    return read_turn(choice, objects(reply["usage"]), 0.0)


def pieces(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=6)))
    bounds = [0, *[c for c in cuts if c < len(text)], len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a] or [text]


@st.composite
def replies(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A reply as sent whole, and one way a server might stream it."""
    content = draw(st.one_of(st.none(), st.text(max_size=40)))
    calls: list[dict[str, Any]] = [
        {
            "id": f"call_{n}",
            "type": "function",
            "function": {
                "name": draw(st.from_regex(r"[a-z_]{1,12}", fullmatch=True)),
                "arguments": json.dumps(
                    draw(st.dictionaries(st.text(max_size=5), st.text(max_size=8), max_size=3))
                ),
            },
        }
        for n in range(draw(st.integers(0, 3)))
    ]
    refusal = draw(st.one_of(st.none(), st.text(min_size=1, max_size=10)))
    if calls or refusal:
        content = content or None  # null beside calls or a refusal, as the API sends it
    finish = draw(st.sampled_from(["stop", "tool_calls", "length", "content_filter", "odd", None]))
    usage = draw(
        st.one_of(
            st.none(),
            st.tuples(st.integers(0, 5000), st.integers(0, 500)).map(
                lambda u: {"prompt_tokens": u[0], "completion_tokens": u[1], "total_tokens": sum(u)}
            ),
        )
    )
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
    if calls:
        message["tool_calls"] = calls
    repeat_ids = draw(st.booleans())

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    chunks = [chunk({"role": "assistant", "content": "" if content is not None else None})]
    for piece in pieces(draw, content or ""):
        if piece:
            chunks.append(chunk({"content": piece}))
    if refusal:
        chunks += [chunk({"refusal": piece}) for piece in pieces(draw, refusal)]
    for n, call in enumerate(calls):
        name = call["function"]["name"]
        for k, piece in enumerate(pieces(draw, call["function"]["arguments"])):
            delta: dict[str, Any] = {"index": n, "function": {"arguments": piece}}
            if k == 0 or repeat_ids:
                delta.update(id=call["id"], type="function")
                delta["function"]["name"] = name
            chunks.append(chunk({"tool_calls": [delta]}))
        if draw(st.booleans()):
            chunks.append(chunk({"content": None}))  # an empty delta between pieces
    where = draw(st.sampled_from(["own chunk", "with finish", "absent"]))
    last = chunk({}, finish)
    if usage is not None and where == "with finish":
        last["usage"] = usage
    chunks.append(last)
    if usage is not None and where == "own chunk":
        chunks.append({"choices": [], "usage": usage})
    sent_usage = usage if where != "absent" else None
    return {"message": message, "finish": finish, "usage": sent_usage}, chunks


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replies())
def test_any_chunking_of_a_reply_accumulates_to_the_turn_sent_whole(
    case: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    reply, chunks = case
    sink = Recorder()

    assert accumulate(chunks, sink) == whole(reply)
    message = reply["message"]
    if message.get("tool_calls") or message.get("refusal"):
        assert sink.shown == ""  # whatever was shown of a non-answer was taken back
    else:
        assert sink.shown == (message["content"] or "")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replies())
def test_a_reply_read_as_its_json_is_the_turn_read_from_the_sdks_objects(
    case: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    reply, _ = case
    choice = {"index": 0, "message": reply["message"], "finish_reason": reply["finish"]}

    assert read_turn(choice, reply["usage"], 0.0) == whole(reply)


REPLY_FIELDS = ["message", "tool_calls", "function", "name", "arguments", "content", "id"]
REPLY_FIELDS += ["type", "refusal", "finish_reason", "prompt_tokens", "completion_tokens"]
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(REPLY_FIELDS) | st.text(max_size=3), inner, max_size=5)
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(ANY_JSON, ANY_JSON)
def test_any_json_a_server_sends_is_read_as_a_turn_not_an_error(choice: Any, usage: Any) -> None:
    turn = read_turn(choice, usage, 0.0)

    assert isinstance(turn.finish_reason, str) and turn.finish_reason
    assert turn.content is None or isinstance(turn.content, str)
    assert all(isinstance(c.name, str) and isinstance(c.arguments, str) for c in turn.calls)
    assert len({c.id for c in turn.calls}) == len(turn.calls)
    assert turn.prompt_tokens >= 0 and turn.completion_tokens >= 0


def test_malformed_chunks_become_a_turn_not_an_error() -> None:
    chunks: list[Any] = [
        {},
        {"choices": None},
        {"choices": [None, {"index": 1, "delta": {"content": "other choice"}}]},
        {"choices": [{"delta": {"content": 7}}]},
        {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": {"a": 1}}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"id": "x", "function": None}]}}]},
        {"choices": [{"delta": None, "finish_reason": "strange"}], "usage": {"prompt_tokens": -1}},
    ]

    turn = accumulate(chunks)

    assert turn.finish_reason == "strange"
    assert turn.content == "7"  # a number where text belongs: kept, as text
    # pieces without an index continue the call before them; arguments sent as an object are
    # kept as JSON; a call without a name reaches the model as "no such tool", not a crash
    assert [(c.id, c.name, c.arguments) for c in turn.calls] == [("x", "", '{"a": 1}')]
    assert (turn.prompt_tokens, turn.completion_tokens) == (0, 0)


def test_the_client_streams_answer_text_and_records_the_same_usage(
    model_server: FakeOpenAI,
) -> None:
    model_server.script = [Turn("The course costs 2999 INR.", usage=(120, 9))]
    client = ModelClient(model="gpt-fake", api_key="test", base_url=model_server.url)
    messages = [{"role": "user", "content": "fee?"}]
    sink = Recorder()

    streamed = client.complete(messages, [], 10.0, sink)
    sent_whole = client.complete(messages, [], 10.0)

    assert sink.shown == "The course costs 2999 INR."
    assert model_server.chat_requests[0]["stream"] is True
    assert model_server.chat_requests[0]["stream_options"] == {"include_usage": True}
    assert "stream" not in model_server.chat_requests[1]
    assert (streamed.content, streamed.prompt_tokens, streamed.completion_tokens) == (
        sent_whole.content,
        120,
        9,
    )
    assert streamed.finish_reason == sent_whole.finish_reason == "stop"


def test_a_tool_call_turn_streamed_with_a_preamble_takes_the_preamble_back(
    model_server: FakeOpenAI,
) -> None:
    model_server.script = [
        Turn("Let me look that up.", tool_calls=[("knowledge_lookup", {"name": "SQL Basics"})])
    ]
    client = ModelClient(model="gpt-fake", api_key="test", base_url=model_server.url)
    sink = Recorder()

    turn = client.complete([{"role": "user", "content": "q"}], [], 10.0, sink)

    assert sink.shown == "" and sink.resets == 1
    assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == [
        ("knowledge_lookup", {"name": "SQL Basics"})
    ]


def test_a_stream_that_breaks_off_midway_is_asked_for_again_and_the_sink_starts_over(
    model_server: FakeOpenAI,
) -> None:
    text = "Python Basics comes first; Django Fundamentals builds on it."
    model_server.script = Script([Turn(text, usage=(50, 15))], faults={0: Fault(cut_after=6)})
    client = ModelClient(model="gpt-fake", api_key="test", base_url=model_server.url)
    sink = Recorder()

    turn = client.complete([{"role": "user", "content": "q"}], [], 10.0, sink)

    assert len(model_server.chat_requests) == 2
    assert sink.resets == 1 and sink.shown == text
    assert (turn.content, turn.prompt_tokens, turn.completion_tokens) == (text, 50, 15)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["[", "]", "(", ")", "https://", "a.example", "/x", "label", " ", "\n", "&", "<b>"]
        ),
        max_size=30,
    ),
    st.data(),
)
def test_streamed_slack_text_in_any_chunking_equals_the_whole_text_rendered_at_once(
    tokens: list[str], data: st.DataObject
) -> None:
    """Links are held back until complete, so no chunking shows a link the whole text would
    have defused (bot/outbound/answers.py `settled`)."""
    whole = "".join(tokens)
    ends = [*sorted(data.draw(st.sets(st.integers(0, len(whole)), max_size=8))), len(whole)]
    sent, shown = 0, ""
    for end in ends:
        ready = settled(whole[:end], sent)
        assert ready >= sent
        shown += streamable(whole[sent:ready])
        sent = ready
    assert shown + streamable(whole[sent:]) == streamable(whole)
