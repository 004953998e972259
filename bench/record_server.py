"""Record what a real OpenAI-compatible server sends, for the suite to replay (issue 23).

Each case is one request made the way Switchboard makes it (worker.model.ModelClient: its
request body, the real openai client), and the server's HTTP reply is captured raw, below the
SDK: a whole JSON body as its bytes, a stream as the chunks that arrived. One file per case:

    {"server": ..., "model": ..., "request": {what was asked, in short},
     "response": {"status", "content_type", "body" | "chunks"},
     "read": what worker.model made of it live (ModelTurn as JSON)}

tests/test_recordings.py replays every file through tests/fakes' FakeOpenAI (`Recorded`)
into the same adapter and checks it reads what the bytes say. Every recorded byte comes from
the server named; nothing here edits a reply.

    llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf --jinja -t 1 -c 2048 --port 8089 \\
        --chat-template-file models/templates/Qwen-Qwen2.5-7B-Instruct.jinja &
    python bench/record_server.py --base-url http://127.0.0.1:8089/v1 \\
        --model smollm2 --out tests/recordings/llama_cpp
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the project root on sys.path)
import httpx2

from tests.support.recording import Recording
from tests.support.runtime import KeptText
from worker.model import ModelClient, ModelError, Sampling
from worker.turns import ModelTurn

LOOKUP = {
    "type": "function",
    "function": {
        "name": "knowledge_lookup",
        "description": "Return a course's fee and prerequisites.",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string", "description": "The course title."}},
            "required": ["name"],
            "additionalProperties": False,
        },
    },
}
QUESTION = [{"role": "user", "content": "What does the course Django Fundamentals cost?"}]
GREETING = [{"role": "user", "content": "Say hello in five words."}]
# The tool-call cases ask in a thread that already holds two answered lookups, as Switchboard
# sends a thread's transcript: each an earlier call, the tool's result, the answer. (With one,
# SmolLM2 answered in text in 30 tries of 30; with two, it called on the 4th and 9th.)


def answered(call_id: str, course: str, fee: int) -> list[dict[str, Any]]:
    arguments = json.dumps({"name": course})
    return [
        {"role": "user", "content": f"What does the course {course} cost?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "knowledge_lookup", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"fee": fee})},
        {"role": "assistant", "content": f"{course} costs ${fee}."},
    ]


ANSWERED = answered("call_1", "SQL Basics", 49) + answered("call_2", "Intro to Python", 59)


@dataclasses.dataclass(frozen=True)
class Case:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    stream: bool
    max_tokens: int
    tool_choice: str = ""
    temperature: float | None = None
    # Asked again (up to this many times) until the reply is what the case is for. A tiny
    # model under llama.cpp's `required` grammar may write text first (the grammar allows
    # content before the call) and run out of tokens; the file says which try was kept.
    tries: int = 1


CASES: dict[str, Case] = {
    "text_whole": Case(GREETING, [], False, 32),
    "text_streamed": Case(GREETING, [], True, 32),
    "tool_call_whole": Case(ANSWERED + QUESTION, [LOOKUP], False, 80, "required", 1.0, 60),
    "tool_call_streamed": Case(ANSWERED + QUESTION, [LOOKUP], True, 80, "required", 1.0, 60),
    "length_whole": Case(QUESTION, [], False, 6),
    "length_streamed": Case(QUESTION, [], True, 6),
}


def shows_its_case(name: str, turn: ModelTurn) -> bool:
    """Whether a reply is what its case was made to record."""
    if name.startswith("tool_call"):
        return turn.finish_reason == "tool_calls" and bool(turn.calls)
    return True


def record(client: ModelClient, tap: Recording, name: str, server: str) -> dict[str, Any]:
    case = CASES[name]
    client.sampling = Sampling(
        tokens_param="max_tokens", tool_choice=case.tool_choice, temperature=case.temperature
    )
    started = time.monotonic()
    tried = 0
    while tried < case.tries:
        tried += 1
        sink = KeptText() if case.stream else None  # streamed as the Slack surface has it
        try:
            turn = client.complete(
                case.messages, case.tools, 600.0, sink, max_tokens=case.max_tokens
            )
        except ModelError as exc:
            read: dict[str, Any] = {"error": exc.detail}
            break
        read = dataclasses.asdict(turn)
        read.pop("seconds")
        if shows_its_case(name, turn):
            break
    else:
        raise SystemExit(f"{name}: no reply showed the case in {tried} tries; none kept")
    raw = b"".join(tap.chunks)
    response: dict[str, Any] = {"status": tap.status, "content_type": tap.content_type}
    if case.stream:
        response["chunks"] = [chunk.decode("utf-8") for chunk in tap.chunks]
    else:
        response["body"] = raw.decode("utf-8")
    return {
        "server": server,
        "model": client.model,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.monotonic() - started, 2),
        "request": {
            "case": name,
            "messages": case.messages,
            "tools": [t["function"]["name"] for t in case.tools],
            "stream": case.stream,
            "max_tokens": case.max_tokens,
            "tool_choice": case.tool_choice or None,
            "temperature": case.temperature,
            "try": tried,
            "tries": case.tries,
            "body": client.request_body(case.messages, case.tools, case.max_tokens),
        },
        "response": response,
        "read": read,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url", required=True, help="the server, e.g. http://127.0.0.1:8089/v1"
    )
    parser.add_argument("--model", default="local", help="the model name to ask for")
    parser.add_argument("--server", default="llama.cpp llama-server", help="recorded as is")
    parser.add_argument("--out", type=Path, required=True, help="folder for the .json files")
    parser.add_argument("cases", nargs="*", default=list(CASES), help="default: all")
    args = parser.parse_args(argv)
    tap = Recording()
    client = ModelClient(model=args.model, api_key=None, base_url=args.base_url, max_retries=0)
    client.client = client.client.with_options(http_client=httpx2.Client(transport=tap))
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.cases:
        recording = record(client, tap, name, args.server)
        path = args.out / f"{name}.json"
        path.write_text(json.dumps(recording, indent=1, ensure_ascii=False) + "\n")
        status, tried = recording["response"]["status"], recording["request"]["try"]
        print(f"{path}: HTTP {status}, {recording['seconds']} s, kept try {tried}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
