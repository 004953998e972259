"""A completed run as a candidate demonstration: its successful calls, turn by turn, and its
answer. Whether a call succeeded is the outcome the executor recorded on the run; runs saved
before outcomes were recorded are read by the prefixes of their observations."""

from __future__ import annotations

import json

from worker.library.library import Call, DemoError, Demonstration
from worker.run import Run, RunStatus

# How observations of calls that did not succeed began, before outcomes were recorded
# (worker/loop.py and worker/executor.py still write them so; only old runs are read by them).
LEGACY_FAILURE_PREFIXES = ("Error:", "Not run:", "Outcome unknown")


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
            if not succeeded(run, tc["id"], result):
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


def succeeded(run: Run, call_id: str, result: str) -> bool:
    """The call ran and its tool succeeded. A call with no recorded outcome never reached a
    tool (refused, invalid, repeated)."""
    if run.outcomes is None:
        return legacy_succeeded(result)
    return run.outcomes.get(call_id, False)


def legacy_succeeded(result: str) -> bool:
    """For runs saved before outcomes were recorded (`Run.outcomes` is None): what the call's
    observation begins with."""
    return not result.startswith(LEGACY_FAILURE_PREFIXES)
