"""A peer of bench_latency.py: an agent framework running a burst of fee questions at once.

It is a file of its own so that the peer process imports only what a peer needs (its
framework, Switchboard's two tool functions, the standard library): the benchmark itself
imports Redis, RQ and the worker, which would be counted in the peer's RSS.

  agents     openai-agents: `Runner.run(agent, question)` x RUNS under asyncio.gather; an
             Agent with OpenAIChatCompletionsModel on an AsyncOpenAI client at MODEL_URL.
  langgraph  `langgraph.prebuilt.create_react_agent` on `langchain_openai.ChatOpenAI` at
             MODEL_URL, checkpointer AsyncSqliteSaver on FOLDER/langgraph.sqlite3, RUNS x
             `ainvoke` with distinct thread_ids under asyncio.gather.

FOLDER/peer.json (written by the benchmark) gives the question, Switchboard's instructions,
the expected answer and number of tool calls. Both peers get those instructions, and
knowledge_lookup and calculate (Switchboard's own functions) as their tools.

Protocol on stdin/stdout, one JSON line per answer: after one warm-up burst it prints
{"ready": true}; then each `go` line runs a burst and prints {"first": t0, "last": t1,
"bad": n, "sample": [...]} (time.time() before the first run and after the last answer;
`bad` counts answers without the expected text or with another number of tool results).
Ends when stdin closes.

    python bench/latency_peer.py agents|langgraph MODEL_URL RUNS FOLDER
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.builtin.calculator import calculate  # noqa: E402
from tools.builtin.knowledge import knowledge_lookup as _lookup  # noqa: E402
from tools.context import ToolContext  # noqa: E402


def knowledge_lookup(name: str) -> dict[str, Any]:
    """Look up a course or policy by its name: fee, currency, prerequisites, description.

    Args:
        name: The course or policy name, e.g. "Django Fundamentals" or "Refund policy".
    """
    # Switchboard's own tool takes the controller's ToolContext first (the shipped catalog
    # when its settings name no knowledge file); the peers' tools take only the model's
    # arguments, so they get it through this function, with the tool's own docstring.
    return _lookup(ToolContext(user_id="peer"), name)


Ask = Callable[[], Awaitable[tuple[str, int]]]  # one run: (final answer, tool results)


async def agents_peer(model_url: str, task: dict[str, Any], _folder: Path, _stack: Any) -> Ask:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.items import ToolCallOutputItem
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    agent = Agent(
        name="Switchboard",
        instructions=task["instructions"],
        model=OpenAIChatCompletionsModel(
            model="gpt-fake", openai_client=AsyncOpenAI(base_url=model_url, api_key="x")
        ),
        tools=[function_tool(knowledge_lookup), function_tool(calculate)],
    )

    async def ask() -> tuple[str, int]:
        result = await Runner.run(agent, task["question"])
        tools = sum(isinstance(item, ToolCallOutputItem) for item in result.new_items)
        return str(result.final_output), tools

    return ask


async def langgraph_peer(
    model_url: str, task: dict[str, Any], folder: Path, stack: contextlib.AsyncExitStack
) -> Ask:
    from langchain_core.messages import ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.prebuilt import create_react_agent

    saver = await stack.enter_async_context(
        AsyncSqliteSaver.from_conn_string(str(folder / "langgraph.sqlite3"))
    )
    with warnings.catch_warnings():  # create_react_agent: deprecated for langchain's agents
        warnings.simplefilter("ignore")
        graph = create_react_agent(
            ChatOpenAI(base_url=model_url, api_key="x", model="gpt-fake"),
            [tool(knowledge_lookup), tool(calculate)],
            prompt=task["instructions"],
            checkpointer=saver,
        )
    threads = itertools.count()

    async def ask() -> tuple[str, int]:
        config: RunnableConfig = {"configurable": {"thread_id": f"thread-{next(threads)}"}}
        state = await graph.ainvoke({"messages": [("user", task["question"])]}, config)
        messages = state["messages"]
        return str(messages[-1].content), sum(isinstance(m, ToolMessage) for m in messages)

    return ask


async def serve(kind: str, model_url: str, runs: int, folder: Path) -> None:
    build = {"agents": agents_peer, "langgraph": langgraph_peer}[kind]
    task = json.loads((folder / "peer.json").read_text())
    async with contextlib.AsyncExitStack() as stack:
        ask = await build(model_url, task, folder, stack)

        async def burst() -> dict[str, Any]:
            first = time.time()
            results = await asyncio.gather(*(ask() for _ in range(runs)))
            last = time.time()
            bad = [r for r in results if task["answer"] not in r[0] or r[1] != task["tools"]]
            return {"first": first, "last": last, "bad": len(bad), "sample": bad[:1]}

        warm = await burst()
        print(json.dumps({"ready": True} if not warm["bad"] else warm), flush=True)
        for line in sys.stdin:  # blocking between bursts: nothing else runs meanwhile
            if line.strip() == "go":
                print(json.dumps(await burst()), flush=True)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])))
