"""A scripted model: replays fixed turns per question, for offline evaluation.

The turn is chosen like a stateless server would: the question is the last user message, and
the step is the number of assistant messages after it (demonstrations and earlier thread
history come before it, so they do not shift the script). The tests' fake OpenAI server
(tests/fakes/openai_server.py) chooses its turns with the same functions.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.model_base import ModelError, Watch
from worker.streaming import TextSink
from worker.turns import ModelTurn, ProposedCall


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text: its content, or the text parts of a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def last_user_index(messages: Sequence[Any]) -> int:
    """Where the last user message is; -1 when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], Mapping) and messages[i].get("role") == "user":
            return i
    return -1


def question_of(messages: Sequence[Any]) -> str:
    """The LAST user message's text: what scripts are keyed on. Earlier user messages are
    demonstrations or an earlier question in the same thread."""
    index = last_user_index(messages)
    return message_text(messages[index]) if index >= 0 else ""


def step_of(messages: Sequence[Any]) -> int:
    """Assistant messages since the last user message: the step of this question."""
    return sum(
        1
        for message in messages[last_user_index(messages) + 1 :]
        if isinstance(message, Mapping) and message.get("role") == "assistant"
    )


@dataclass(frozen=True)
class ScriptedTurn:
    text: str | None = None
    calls: tuple[tuple[str, Mapping[str, Any] | str], ...] = ()  # (tool, args or raw JSON)
    finish_reason: str | None = None
    refusal: str | None = None

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ScriptedTurn:
        calls = tuple(
            (str(c["tool"]), c.get("args", {}) if "raw" not in c else str(c["raw"]))
            for c in data.get("calls") or ()
        )
        return cls(
            text=data.get("text"),
            calls=calls,
            finish_reason=data.get("finish_reason"),
            refusal=data.get("refusal"),
        )


@dataclass
class ScriptedModel:
    scripts: dict[str, list[ScriptedTurn]] = field(default_factory=dict)
    model: str = "scripted"
    attempts: int = 1  # a script is not retried

    def add(self, question: str, turns: list[ScriptedTurn]) -> None:
        self.scripts[question.strip()] = turns

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        timeout: float,
        sink: TextSink | None = None,
        *,
        max_tokens: int | None = None,  # a script writes what it says, bounded or not
        watch: Watch | None = None,  # nothing to wait for, nor to retry
    ) -> ModelTurn:
        question, step = question_of(messages).strip(), step_of(messages)
        script = self.scripts.get(question)
        if script is None:
            raise ModelError(f"no script for the question {question[:80]!r}")
        if step >= len(script):
            raise ModelError(f"the script for {question[:80]!r} has no step {step + 1}")
        turn = script[step]
        calls = [
            ProposedCall(
                id=f"call_{secrets.token_hex(6)}",
                name=name,
                arguments=args if isinstance(args, str) else json.dumps(args),
            )
            for name, args in turn.calls
        ]
        if sink is not None and turn.text and not calls and not turn.refusal:
            sink.text(turn.text)  # the whole answer at once: a script has nothing to wait for
        prompt = len(json.dumps(messages)) + len(json.dumps(tools))
        completion = len(turn.text or "") + sum(len(c.arguments) + len(c.name) for c in calls)
        return ModelTurn(
            finish_reason=turn.finish_reason or ("tool_calls" if calls else "stop"),
            content=turn.text,
            refusal=turn.refusal,
            calls=calls,
            prompt_tokens=prompt // 4,
            completion_tokens=max(1, completion // 4),
        )
