"""What real OpenAI-compatible servers send, in the default suite (issue 23): replies that
bench/record_server.py captured raw from a real server (tests/recordings/SERVER/CASE.json) are
served again byte for byte by FakeOpenAI (`Recorded`) into worker.model, and what the adapter
reads is checked against the bytes, read here independently of it.

`pytest -m llama_server` (with OPENAI_BASE_URL naming a running llama-server) sends the same
requests to that server instead, and checks what each case is for.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.fakes.openai_server import FakeOpenAI, Recorded, Turn, load_recording
from tests.support.recording import Recording
from tests.support.runtime import KeptText
from worker.model import ModelClient, Sampling
from worker.turns import ModelTurn

RECORDINGS = sorted((Path(__file__).parent / "recordings").glob("*/*.json"))


@dataclasses.dataclass
class Said:
    """What a raw reply says, read without the adapter."""

    content: str | None = None
    calls: list[tuple[str | None, str, str]] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


def said_whole(body: bytes) -> Said:
    reply = json.loads(body)
    choice = reply["choices"][0]
    message = choice["message"]
    usage = reply.get("usage") or {}
    return Said(
        content=message.get("content"),
        calls=[
            (c.get("id"), c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls") or []
        ],
        finish_reason=choice["finish_reason"],
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
    )


def said_streamed(raw: bytes) -> Said:
    said, content = Said(), []
    calls: dict[int, list[Any]] = {}
    for event in raw.decode("utf-8").split("\n\n"):
        data = "\n".join(
            line[len("data:") :].strip() for line in event.splitlines() if line.startswith("data:")
        )
        if not data or data == "[DONE]":
            continue
        chunk = json.loads(data)
        if chunk.get("usage"):
            said.prompt_tokens = chunk["usage"]["prompt_tokens"]
            said.completion_tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices") or []:
            said.finish_reason = choice.get("finish_reason") or said.finish_reason
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                parts = calls.setdefault(call["index"], [None, "", ""])
                parts[0] = parts[0] or call.get("id")
                parts[1] += (call.get("function") or {}).get("name") or ""
                parts[2] += (call.get("function") or {}).get("arguments") or ""
    said.content = "".join(content) or None
    said.calls = [(p[0], p[1], p[2]) for _, p in sorted(calls.items())]
    return said


def said_by(recorded: Recorded) -> Said:
    if recorded.chunks is not None:
        return said_streamed(b"".join(recorded.chunks))
    assert recorded.body is not None
    return said_whole(recorded.body)


def ask(client: ModelClient, request: dict[str, Any], sink: KeptText | None) -> ModelTurn:
    client.sampling = Sampling(
        tool_choice=request.get("tool_choice") or "", temperature=request.get("temperature")
    )
    tools = request["body"].get("tools") or []
    return client.complete(
        request["messages"], tools, 120.0, sink, max_tokens=request["max_tokens"]
    )


def shows_its_case(case: str, turn: ModelTurn) -> None:
    """What each recorded case was made to show is in the reply."""
    if case.startswith("tool_call"):
        assert turn.finish_reason == "tool_calls" and turn.calls, turn
        for call in turn.calls:
            assert call.name == "knowledge_lookup" and isinstance(json.loads(call.arguments), dict)
    if case.startswith("length"):
        assert turn.finish_reason == "length", turn
    if case.startswith("text"):
        assert turn.finish_reason in ("stop", "length") and turn.content, turn
    if case.endswith("streamed"):  # stream_options.include_usage: usage in the last chunk
        assert turn.prompt_tokens > 0 and turn.completion_tokens > 0, turn


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_recorded_reply_of_a_real_server_passes_through_the_adapter_unchanged(
    path: Path, model_server: FakeOpenAI
) -> None:
    request, recorded = load_recording(path)
    model_server.route(lambda body: recorded)
    client = ModelClient(model="replayed", api_key="k", base_url=model_server.url, max_retries=0)
    sink = KeptText() if request["stream"] else None
    turn = ask(client, request, sink)
    said = said_by(recorded)
    assert (turn.content or None) == (said.content or None)
    assert [(c.name, c.arguments) for c in turn.calls] == [(n, a) for _, n, a in said.calls]
    assert [c.id for c in turn.calls] == [i for i, _, _ in said.calls if i]  # ids kept
    assert turn.finish_reason == said.finish_reason
    assert (turn.prompt_tokens, turn.completion_tokens) == (
        said.prompt_tokens,
        said.completion_tokens,
    )
    if sink is not None and not turn.calls:  # the surface was shown the answer as written
        assert "".join(sink.parts) == (turn.content or "")
    # and the same as the adapter read from the live server when it was recorded
    live = json.loads(path.read_text(encoding="utf-8"))["read"]
    assert {k: v for k, v in dataclasses.asdict(turn).items() if k != "seconds"} == live
    shows_its_case(request["case"], turn)
    sent = model_server.last_chat_request
    assert (
        sent["max_tokens"] == request["max_tokens"]
        and bool(sent.get("stream")) == request["stream"]
        and sent.get("temperature") == request.get("temperature")
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_fake_replays_a_recorded_reply_byte_for_byte(
    model_server: FakeOpenAI, stream: bool
) -> None:
    """The replay itself, on a reply the fake wrote (no real server's recording claimed):
    what comes back on the wire is what was recorded, chunk for chunk, and reads the same."""
    tap = Recording()
    client = ModelClient(model="gpt-fake", api_key="k", base_url=model_server.url, max_retries=0)
    client.client = client.client.with_options(http_client=httpx2.Client(transport=tap))
    model_server.route(
        lambda body: Turn("It is 5.", tool_calls=[("calculate", {"expression": "2+3"})])
    )
    question = [{"role": "user", "content": "2 + 3?"}]
    first = client.complete(question, [], 10.0, KeptText() if stream else None, max_tokens=50)
    chunks = list(tap.chunks)
    recorded = Recorded(
        content_type=tap.content_type,
        body=None if stream else b"".join(chunks),
        chunks=tuple(chunks) if stream else None,
    )
    model_server.reset()
    model_server.route(lambda body: recorded)
    again = client.complete(question, [], 10.0, KeptText() if stream else None, max_tokens=50)
    assert b"".join(tap.chunks) == b"".join(chunks)
    if stream:  # each recorded chunk one HTTP chunk: the client reads them as they were
        assert len(tap.chunks) == len(chunks)
    assert dataclasses.replace(again, seconds=0) == dataclasses.replace(first, seconds=0)


@pytest.mark.llama_server
@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_running_llama_server_answers_each_recorded_request_as_the_case_expects(
    path: Path,
) -> None:
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        pytest.fail("set OPENAI_BASE_URL to a running llama-server (see bench/README.md)")
    request, _ = load_recording(path)
    client = ModelClient(model="local", api_key=None, base_url=base_url, max_retries=0)
    # A tiny model may need several tries for a tool call (bench/record_server.py `tries`).
    for _ in range(request.get("tries", 1)):
        turn = ask(client, request, KeptText() if request["stream"] else None)
        if turn.calls or not request["case"].startswith("tool_call"):
            break
    shows_its_case(request["case"], turn)
