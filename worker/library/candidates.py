"""A completed run as a candidate demonstration: its successful calls, turn by turn, and its
answer."""

from __future__ import annotations

import json

from worker.library.library import Call, DemoError, Demonstration
from worker.run import Run, RunStatus


def candidate_from_run(run: Run) -> Demonstration:
    """A completed run as a candidate: its successful calls, turn by turn, and its answer."""
    if run.status != RunStatus.COMPLETED or not run.answer:
        raise DemoError(f"run {run.id} is {run.status.value}; only completed runs can be promoted")
    results = {
        m["tool_call_id"]: str(m.get("content") or "")
        for m in run.messages
        if m.get("role") == "tool"
    }
    steps: list[tuple[Call, ...]] = []
    for message in run.messages:
        calls = []
        for tc in message.get("tool_calls") or []:
            result = results.get(tc["id"], "")
            if result.startswith(("Error:", "Not run:", "Outcome unknown")):
                continue
            try:
                args = json.loads(tc["function"]["arguments"] or "{}")
            except json.JSONDecodeError:
                continue
            calls.append(Call(tc["function"]["name"], args, result))
        if calls:
            steps.append(tuple(calls))
    if not steps:
        raise DemoError(f"run {run.id} made no successful tool call; nothing to demonstrate")
    return Demonstration(
        id=f"run-{run.id}",
        task=run.question[:200],
        question=run.question,
        steps=tuple(steps),
        answer=run.answer.split("\n\n_Note:")[0],
        status="candidate",
        source_run=run.id,
    )
