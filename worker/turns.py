"""One model turn as the runtime reads it, whole or streamed: `read_turn` turns a reply (its
JSON as sent, an SDK object, or what `worker.streaming` assembled from chunks) into a
`ModelTurn`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tools.execute import valid_unicode

MAX_ARGUMENTS_KEPT = 64 * 1024  # what we keep of a call's raw arguments for the transcript
MAX_CALLS = 128  # tool calls kept per turn (the API offers at most 128 tools)
MAX_CONTENT = 256 * 1024  # answer text kept; past it the reply counts as cut (length)


@dataclass(frozen=True)
class ProposedCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ModelTurn:
    finish_reason: str  # stop | tool_calls | length | content_filter (anything else is kept as is)
    content: str | None = None
    refusal: str | None = None
    calls: list[ProposedCall] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


def read_turn(choice: Any, usage: Any, seconds: float) -> ModelTurn:
    """A reply is read as the server sent it (its JSON, or the SDK's objects built from it
    without validation), so any field may be missing, null or of another type. Read each one
    defensively and canonically: a call without an id, or with one already used in the turn,
    gets one of ours (the transcript sends it back consistently); a call without a function
    is kept with an empty name, so the model reads "no such tool" instead of the run failing;
    model text is cleaned of lone surrogates, since it is stored and sent again."""
    message = get_field(choice, "message")
    calls: list[ProposedCall] = []
    for call in as_list(get_field(message, "tool_calls"))[:MAX_CALLS]:  # as a stream keeps
        if get_field(call, "type") not in ("function", None):
            continue  # another kind of tool (custom, ...) that we never offered
        function = get_field(call, "function")
        calls.append(
            ProposedCall(
                id=_unique_id(get_field(call, "id"), {c.id for c in calls}),
                name=_text(get_field(function, "name")),
                arguments=_text(get_field(function, "arguments"))[:MAX_ARGUMENTS_KEPT],
            )
        )
    raw = get_field(message, "content")
    content = _text(raw) if raw is not None else None
    refusal = get_field(message, "refusal")
    finish = get_field(choice, "finish_reason")
    if content is not None and len(content) > MAX_CONTENT:  # stored, and sent again: bounded
        content, finish = content[:MAX_CONTENT], "length"  # as a streamed reply past it
    return ModelTurn(
        finish_reason=finish if isinstance(finish, str) and finish else _implied(calls),
        content=content,
        refusal=_text(refusal) if refusal else None,
        calls=calls,
        prompt_tokens=_count(get_field(usage, "prompt_tokens")),
        completion_tokens=_count(get_field(usage, "completion_tokens")),
        seconds=seconds,
    )


def _unique_id(raw: object, taken: set[str]) -> str:
    call_id = _text(raw)
    if call_id and call_id not in taken:
        return call_id
    n = len(taken)
    while f"call_sb_{n}" in taken:
        n += 1
    return f"call_sb_{n}"


def _implied(calls: list[ProposedCall]) -> str:
    return "tool_calls" if calls else "stop"


def get_field(value: object, name: str) -> Any:
    """A field of a reply's part, whether the part is JSON as sent or an SDK object."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def as_list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _count(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def _text(value: object) -> str:
    """A field the server should have sent as a string. Some OpenAI-compatible proxies send a
    call's arguments as a JSON object, or null: keep what was meant, so decoding can judge it
    and the model reads a bounded error rather than the run failing."""
    if value is None:
        return ""
    if not isinstance(value, str):
        try:
            value = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            value = repr(value)
    return valid_unicode(value)
