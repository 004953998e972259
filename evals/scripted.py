"""A scripted model: replays fixed turns per question, for offline evaluation.

The turn is chosen like a stateless server would: the question is the last user message, and
the step is the number of assistant messages after it (demonstrations and earlier thread
history come before it, so they do not shift the script).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.model import ModelError, ModelTurn, ProposedCall


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

    def add(self, question: str, turns: list[ScriptedTurn]) -> None:
        self.scripts[question.strip()] = turns

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], timeout: float
    ) -> ModelTurn:
        last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        question = str(messages[last_user].get("content") or "").strip()
        step = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "assistant")
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
