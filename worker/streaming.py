"""Streamed model replies: chunks in, the same `ModelTurn` out, answer text passed on as it comes.

A streamed turn is read into the shape of a whole reply (content, refusal, tool calls, usage)
and then through `worker.turns.read_turn`, so a streamed turn and the same reply sent whole make the
same `ModelTurn` (tests/test_streaming.py checks this for arbitrary chunkings). Every field is
read defensively, as `read_turn` does: a chunk may lack `choices`, a delta any field; tool-call
arguments arrive in pieces (sometimes as JSON objects, from some proxies); call ids are sent
once or repeated on every piece; usage comes in a last chunk without choices, or not at all.

The text of the reply goes to a `TextSink` (the surface) while it arrives, as long as the turn
can still be an answer: the first tool-call or refusal delta, or a retry of a stream that broke
off, `reset`s the sink, and nothing more is passed on. The run itself is unaffected: it is saved
after the step, as before; what was shown while streaming is a presentation detail of the step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Protocol

import structlog

from worker.turns import (
    MAX_ARGUMENTS_KEPT,
    MAX_CALLS,
    MAX_CONTENT,
    ModelTurn,
    as_list,
    get_field,
    read_turn,
)

log = structlog.get_logger(__name__)

MAX_ARGUMENTS = MAX_ARGUMENTS_KEPT + 1  # accumulated per call; read_turn keeps the rest


class TextSink(Protocol):
    """Where answer text goes while the model writes it (a surface's streamed message)."""

    def text(self, delta: str) -> None:
        """More of the answer, in order."""

    def reset(self) -> None:
        """What was passed on so far is not the answer (a tool-call turn, or a retry)."""


@dataclass
class _CallParts:
    id: str = ""
    type: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    size: int = 0

    def add_arguments(self, piece: object) -> None:
        if piece is None or self.size >= MAX_ARGUMENTS:
            return
        if not isinstance(piece, str):  # an object from a non-conforming proxy: keep its JSON
            try:
                piece = json.dumps(piece, ensure_ascii=False)
            except (TypeError, ValueError):
                piece = repr(piece)
        piece = piece[: MAX_ARGUMENTS - self.size]
        self.arguments.append(piece)
        self.size += len(piece)


class TurnAccumulator:
    """Feed it the chunks of one streamed completion (SDK objects or plain dicts); `turn()`
    is what `read_turn` makes of the equivalent whole reply."""

    def __init__(self, sink: TextSink | None = None) -> None:
        self.sink = sink
        self.content: list[str] = []
        self.content_size = 0
        self.saw_content = False
        self.refusal: list[str] = []
        self.calls: dict[int, _CallParts] = {}
        self.finish_reason: object = None
        self.usage: object = None
        self.cut = False
        self.saw_choice = False
        self._passing = sink is not None  # still passing text on: nothing says "not an answer"
        self._passed = False

    def add(self, chunk: object) -> None:
        usage = get_field(chunk, "usage")
        if usage is not None:
            self.usage = usage
        for choice in as_list(get_field(chunk, "choices")):
            self.saw_choice = True
            index = get_field(choice, "index")
            if isinstance(index, int) and index != 0:
                continue  # we ask for one choice; ignore any other
            finish = get_field(choice, "finish_reason")
            if isinstance(finish, str) and finish:
                self.finish_reason = finish
            delta = get_field(choice, "delta")
            if delta is None:
                continue
            self._add_content(get_field(delta, "content"))
            refusal = get_field(delta, "refusal")
            if refusal:
                self.refusal.append(refusal if isinstance(refusal, str) else str(refusal))
                self._stop_passing()
            calls = as_list(get_field(delta, "tool_calls"))
            if calls:
                self._stop_passing()
            for position, call in enumerate(calls):
                self._add_call(call, position)

    def _add_content(self, piece: object) -> None:
        if piece is None:
            return
        self.saw_content = True
        if not isinstance(piece, str):
            piece = str(piece)
        if not piece:
            return
        if self.content_size + len(piece) > MAX_CONTENT:
            piece = piece[: MAX_CONTENT - self.content_size]
            self.cut = True
        self.content.append(piece)
        self.content_size += len(piece)
        if self._passing and piece and self.sink is not None:
            self.sink.text(piece)
            self._passed = True

    def _stop_passing(self) -> None:
        if self._passing and self._passed and self.sink is not None:
            self.sink.reset()
        self._passing = False

    def _add_call(self, delta: object, position: int) -> None:
        call_id = get_field(delta, "id")
        index = get_field(delta, "index")
        if not isinstance(index, int) or index < 0:
            # no index (some servers): a new id opens a call, anything else continues the last
            if not self.calls:
                index = position
            else:
                last = max(self.calls)
                known = self.calls[last].id
                opens = isinstance(call_id, str) and call_id and known and known != call_id
                index = last + 1 if opens else last
        parts = self.calls.get(index)
        if parts is None:
            if len(self.calls) >= MAX_CALLS:
                return
            parts = self.calls[index] = _CallParts()
        if isinstance(call_id, str) and call_id and not parts.id:
            parts.id = call_id
        kind = get_field(delta, "type")
        if isinstance(kind, str) and kind:
            parts.type = kind
        function = get_field(delta, "function")
        name = get_field(function, "name")
        if isinstance(name, str) and name and name != parts.name:
            parts.name = name if not parts.name else parts.name + name  # some stream the name
        parts.add_arguments(get_field(function, "arguments"))

    def written_chars(self) -> int:
        """Characters the model has written so far: text, refusal, call names and arguments
        (what an attempt abandoned midway is estimated by)."""
        calls = sum(len(parts.name) + parts.size for parts in list(self.calls.values()))
        return self.content_size + sum(len(piece) for piece in self.refusal) + calls

    def turn(self, seconds: float) -> ModelTurn:
        calls = [
            SimpleNamespace(
                id=parts.id or None,
                type=parts.type,
                function=SimpleNamespace(name=parts.name, arguments="".join(parts.arguments)),
            )
            for _, parts in sorted(self.calls.items())
        ]
        content: str | None = "".join(self.content)
        if not content:  # as sent whole: null beside calls or a refusal, "" for an empty answer
            content = None if calls or self.refusal or not self.saw_content else ""
        finish = "length" if self.cut else self.finish_reason
        message = SimpleNamespace(
            content=content,
            refusal="".join(self.refusal) or None,
            tool_calls=calls or None,
        )
        usage = SimpleNamespace(
            prompt_tokens=get_field(self.usage, "prompt_tokens"),
            completion_tokens=get_field(self.usage, "completion_tokens"),
        )
        return read_turn(SimpleNamespace(message=message, finish_reason=finish), usage, seconds)


def accumulate(chunks: Iterable[object], sink: TextSink | None = None) -> ModelTurn:
    """The turn a whole stream of chunks makes (for tests and simple callers)."""
    acc = TurnAccumulator(sink)
    for chunk in chunks:
        acc.add(chunk)
    return acc.turn(0.0)
