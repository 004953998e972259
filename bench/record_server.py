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

    llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf --jinja -t 1 -c 2048 --port 8089 &
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

# name -> (messages, tools, stream, max_tokens, tool_choice)
CASES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], bool, int, str]] = {
    "text_whole": (GREETING, [], False, 32, ""),
    "text_streamed": (GREETING, [], True, 32, ""),
    "tool_call_whole": (QUESTION, [LOOKUP], False, 96, "required"),
    "tool_call_streamed": (QUESTION, [LOOKUP], True, 96, "required"),
    "length_whole": (QUESTION, [], False, 6, ""),
    "length_streamed": (QUESTION, [], True, 6, ""),
}


def record(client: ModelClient, tap: Recording, name: str, server: str) -> dict[str, Any]:
    messages, tools, stream, max_tokens, tool_choice = CASES[name]
    client.sampling = Sampling(tokens_param="max_tokens", tool_choice=tool_choice)
    sink = KeptText() if stream else None  # streamed as the Slack surface has it
    started = time.monotonic()
    try:
        turn = client.complete(messages, tools, 600.0, sink, max_tokens=max_tokens)
        read: dict[str, Any] | None = dataclasses.asdict(turn)
        read.pop("seconds")  # type: ignore[union-attr]
    except ModelError as exc:
        read = {"error": exc.detail}
    raw = b"".join(tap.chunks)
    response: dict[str, Any] = {"status": tap.status, "content_type": tap.content_type}
    if stream:
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
            "messages": messages,
            "tools": [t["function"]["name"] for t in tools],
            "stream": stream,
            "max_tokens": max_tokens,
            "tool_choice": tool_choice or None,
            "body": client.request_body(messages, tools, max_tokens),
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
        print(f"{path}: HTTP {recording['response']['status']}, {recording['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
