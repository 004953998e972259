"""FakeOpenAI: an OpenAI-compatible HTTP server for tests, driven by the real `openai` client.

    with FakeOpenAI(Script([Turn(tool_calls=[("calculate", {"expression": "2+2"})]),
                            Turn("It is 4.")])) as fake:
        client = OpenAI(base_url=fake.url, api_key="test")
        ...
        assert fake.chat_requests[1]["messages"][-1]["role"] == "tool"

Replies are chosen without server state: the turn index is the number of assistant
messages already in the request, so concurrent conversations and crash-retries replay the
same turn. Faults (429, 5xx, dropped connections, slow answers) are attached to a turn
index and consumed once each per conversation (keyed by the last user message).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import math
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

from evals.scripted import question_of, step_of
from tests.fakes._base import FakeServer, QuietHandler

__all__ = [
    "FakeOpenAI",
    "Fault",
    "Recorded",
    "Request",
    "Script",
    "ToolCall",
    "Turn",
    "conversation_key",
    "embed",
    "load_recording",
]

EMBEDDING_DIMENSIONS = 64
MAX_TOOLS = 128
MAX_COMPLETION_TOKENS = 16_384  # the default estimate never exceeds a model's output limit
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


# ---------------------------------------------------------------------------------------
# What a scripted reply looks like
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One function call the fake model makes. A dict of arguments is JSON-encoded; a
    string is sent as is, so a test can send invalid or truncated JSON. `id` replaces the
    generated call id (some servers number calls per turn: `call_0` every time);
    `as_object` sends the arguments as a JSON object, as some proxies wrongly do."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None
    as_object: bool = False

    def encoded_arguments(self) -> Any:
        if isinstance(self.arguments, str):
            return self.arguments
        if self.as_object:
            return dict(self.arguments)
        return json.dumps(dict(self.arguments))


ToolCallLike = ToolCall | tuple[str, Mapping[str, Any] | str]


@dataclass(frozen=True)
class Turn:
    """A successful assistant reply.

    text: assistant content. tool_calls: ToolCall or (name, arguments) pairs.
    finish_reason: defaults to "tool_calls" when there are calls, else "stop"; set
    "length" or "content_filter" to simulate those. refusal: the refusal text (content
    is then null unless text is also given). usage: (prompt_tokens, completion_tokens);
    default is estimated from the request and reply sizes (about 4 characters a token,
    completion capped at 16,384). delay: seconds to wait before
    answering (every time this turn is served). pace: tokens a second when streamed.
    """

    text: str | None = None
    tool_calls: Sequence[ToolCallLike] = ()
    finish_reason: str | None = None
    refusal: str | None = None
    usage: tuple[int, int] | None = None
    delay: float = 0.0
    # Written at this many tokens a second (None: the server's default): streamed, text and
    # arguments come in 4-character pieces, each after 1/pace s; sent whole, the reply comes
    # after as long as the stream would have taken.
    pace: float | None = None
    # Streamed: after this many events the server goes quiet for `stall` seconds, the
    # connection open (a model that stalls mid-stream), then sends the rest.
    stall_after: int | None = None
    stall: float = 0.0
    # Replaces the built choice as it is (keys "message", "finish_reason", and "usage" for the
    # whole completion when present): a test can send what a non-conforming server sends.
    raw: Mapping[str, Any] | None = None

    def calls(self) -> list[ToolCall]:
        return [call if isinstance(call, ToolCall) else ToolCall(*call) for call in self.tool_calls]


@dataclass(frozen=True)
class Fault:
    """A failed (or slowed) answer.

    After waiting `delay` seconds: `drop` closes the socket without answering; `status`
    answers with an OpenAI-shaped error body (429 carries `retry-after` and
    `retry-after-ms`); with neither, the scripted turn is then served normally (a slow
    answer, e.g. to trip a client timeout once). `cut_after`: a streamed turn is served, but
    the connection closes after that many events (a stream that breaks off midway).
    """

    status: int | None = None
    retry_after: float | None = None
    message: str | None = None
    drop: bool = False
    delay: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)
    cut_after: int | None = None

    @classmethod
    def rate_limit(cls, retry_after: float = 0.05) -> Fault:
        return cls(status=429, retry_after=retry_after)

    @classmethod
    def server_error(cls, status: int = 500, retry_after: float | None = None) -> Fault:
        return cls(status=status, retry_after=retry_after)

    @classmethod
    def dropped(cls) -> Fault:
        return cls(drop=True)

    @classmethod
    def slow(cls, seconds: float) -> Fault:
        return cls(delay=seconds)


@dataclass(frozen=True)
class Recorded:
    """A real server's reply, served byte for byte (replay mode): `body` whole, or `chunks`
    one HTTP chunk each (a stream, as the server sent it). Made by `load_recording` from a
    file bench/record_server.py wrote (tests/recordings/); its headers are not replayed, but
    the content type is, and a whole body's `headers` when given (a cookie set, a body
    compressed though nobody asked, as a proxy may)."""

    status: int = 200
    content_type: str = "application/json"
    body: bytes | None = None
    chunks: tuple[bytes, ...] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def load_recording(path: Any) -> tuple[dict[str, Any], Recorded]:
    """(the recording's request summary, its reply) from a file of bench/record_server.py."""
    with open(path, encoding="utf-8") as file:
        data = json.load(file)
    response = data["response"]
    chunks = response.get("chunks")
    return data["request"], Recorded(
        status=int(response["status"]),
        content_type=str(response["content_type"]),
        body=response["body"].encode("utf-8") if response.get("body") is not None else None,
        chunks=tuple(c.encode("utf-8") for c in chunks) if chunks is not None else None,
    )


Reply = Turn | Fault | Recorded
TurnLike = str | Turn | Fault | Recorded


def _as_reply(item: TurnLike) -> Reply:
    return Turn(text=item) if isinstance(item, str) else item


class Script:
    """Turns indexed by the number of assistant messages already in the request.

    A plain string is a text turn; a Fault in `turns` fails that index every time.
    `faults={index: [Fault, ...]}` are served first, once each, per conversation key and
    index, e.g. `{0: [Fault.rate_limit()]}` is "429, then the scripted turn 0".
    """

    def __init__(
        self,
        turns: Iterable[TurnLike],
        faults: Mapping[int, Fault | Sequence[Fault]] | None = None,
    ) -> None:
        self.turns: list[Reply] = [_as_reply(item) for item in turns]
        self.faults: dict[int, list[Fault]] = {
            index: [value] if isinstance(value, Fault) else list(value)
            for index, value in (faults or {}).items()
        }
        self._served: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Script({len(self.turns)} turns, faults at {sorted(self.faults)})"

    def take_fault(self, key: str, index: int) -> Fault | None:
        pending = self.faults.get(index)
        if not pending:
            return None
        with self._lock:
            served = self._served.get((key, index), 0)
            if served >= len(pending):
                return None
            self._served[(key, index)] = served + 1
            return pending[served]

    def turn(self, index: int) -> Reply | None:
        return self.turns[index] if index < len(self.turns) else None


ScriptLike = Script | Sequence[TurnLike]
Responder = Callable[[dict[str, Any]], "ScriptLike | TurnLike | None"]


def _as_script(value: ScriptLike) -> Script:
    return value if isinstance(value, Script) else Script(value)


# ---------------------------------------------------------------------------------------
# Request inspection helpers
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def conversation_key(body: Mapping[str, Any]) -> str:
    """The LAST user message's text: what faults and routes are keyed on (the scripted
    model's choice, evals/scripted.py)."""
    return question_of(list(body.get("messages") or []))


def turn_index(body: Mapping[str, Any]) -> int:
    """Assistant messages since the last user message: the step of this question."""
    return step_of(list(body.get("messages") or []))


def check_chat_request(body: Any) -> tuple[str, str | None] | None:
    """The checks the real API makes that our code could plausibly fail: (message, param)."""
    if not isinstance(body, dict):
        return "We could not parse the JSON body of your request.", None
    if not body.get("model"):
        return "you must provide a model parameter", None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "[] is too short - 'messages'", "messages"
    problem = _check_messages(messages)
    if problem is not None:
        return problem
    return _check_tools(body.get("tools"))


def _check_messages(messages: list[Any]) -> tuple[str, str | None] | None:
    open_ids: set[str] | None = None  # ids of the latest assistant tool_calls block
    unanswered: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            role = message.get("role") if isinstance(message, dict) else message
            return (
                f"Invalid value: {role!r}. Supported values are: 'system', 'assistant', "
                "'user', 'tool', and 'function'.",
                f"messages[{i}].role",
            )
        role = message["role"]
        if role == "tool":
            call_id = message.get("tool_call_id")
            if open_ids is None or call_id not in open_ids:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            if call_id in unanswered:
                unanswered.remove(call_id)
            continue
        if unanswered:
            return _unanswered(unanswered, i)
        open_ids = None
        if role == "assistant" and message.get("tool_calls"):
            ids: list[str] = []
            for n, call in enumerate(message["tool_calls"]):
                function = call.get("function") if isinstance(call, dict) else None
                if (
                    not isinstance(function, dict)
                    or not call.get("id")
                    or not isinstance(function.get("name"), str)
                    or not isinstance(function.get("arguments"), str)
                ):
                    return "Missing required parameter.", f"messages.[{i}].tool_calls.[{n}]"
                ids.append(str(call["id"]))
            open_ids = set(ids)
            unanswered = ids
    if unanswered:
        return _unanswered(unanswered, len(messages))
    return None


def _unanswered(ids: list[str], index: int) -> tuple[str, str]:
    return (
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        + ", ".join(ids),
        f"messages.[{index}].role",
    )


def _check_tools(tools: Any) -> tuple[str, str | None] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        return "Invalid type for 'tools': expected an array.", "tools"
    if len(tools) > MAX_TOOLS:
        return (
            f"Invalid 'tools': array too long. Expected an array with maximum length "
            f"{MAX_TOOLS}, but got an array with length {len(tools)} instead.",
            "tools",
        )
    for i, spec in enumerate(tools):
        function = spec.get("function") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or spec.get("type") != "function" or not function:
            return "Missing required parameter: 'tools[0].function'.", f"tools[{i}]"
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            return (
                f"Invalid 'tools[{i}].function.name': string does not match pattern. "
                "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                f"tools[{i}].function.name",
            )
        if function.get("strict"):
            problem = _strict_schema_problem(function.get("parameters") or {}, ())
            if problem:
                return (
                    f"Invalid schema for function '{name}': {problem}",
                    f"tools[{i}].function.parameters",
                )
    return None


def _strict_schema_problem(schema: Any, context: tuple[str, ...]) -> str | None:
    if not isinstance(schema, dict):
        return None
    where = f"In context={context!r}, "
    if schema.get("type") == "object" or "properties" in schema:
        if schema.get("additionalProperties") is not False:
            return where + "'additionalProperties' is required to be supplied and to be false."
        properties = schema.get("properties") or {}
        missing = [key for key in properties if key not in (schema.get("required") or [])]
        if missing:
            return (
                where + "'required' is required to be supplied and to be an array including "
                f"every key in properties. Missing '{missing[0]}'."
            )
        for key, sub in properties.items():
            problem = _strict_schema_problem(sub, (*context, "properties", key))
            if problem:
                return problem
    if "items" in schema:
        return _strict_schema_problem(schema["items"], (*context, "items"))
    for keyword in ("anyOf", "allOf", "oneOf"):
        for n, sub in enumerate(schema.get(keyword) or []):
            problem = _strict_schema_problem(sub, (*context, keyword, str(n)))
            if problem:
                return problem
    return None


# ---------------------------------------------------------------------------------------
# Building responses
# ---------------------------------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def build_completion(
    body: Mapping[str, Any], turn: Turn, *, key: str, index: int, completion_id: str
) -> dict[str, Any]:
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:8]
    tool_calls = [
        {
            "id": call.id if call.id is not None else f"call_{index}_{n}_{digest}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.encoded_arguments()},
        }
        for n, call in enumerate(turn.calls())
    ]
    content = turn.text
    if content is None and turn.refusal is None and not tool_calls:
        content = ""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": turn.refusal,
        "annotations": [],
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    if turn.usage is not None:
        prompt_tokens, completion_tokens = turn.usage
    else:
        prompt_tokens = estimate_tokens(
            json.dumps(body.get("messages")) + json.dumps(body.get("tools") or [])
        )
        reply_text = (content or "") + (turn.refusal or "") + json.dumps(tool_calls)
        completion_tokens = min(estimate_tokens(reply_text), MAX_COMPLETION_TOKENS)
    completion = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "system_fingerprint": "fp_fake",
        "service_tier": "default",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": turn.finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        },
    }
    if turn.raw is not None:
        choice = completion["choices"][0]
        choice["message"] = turn.raw.get("message")
        choice["finish_reason"] = turn.raw.get("finish_reason")
        if "usage" in turn.raw:
            completion["usage"] = turn.raw["usage"]
    return completion


def build_stream(completion: Mapping[str, Any], include_usage: bool) -> bytes:
    """The same completion as server-sent `chat.completion.chunk` events."""
    return b"".join(stream_events(completion, include_usage))


def stream_events(
    completion: Mapping[str, Any], include_usage: bool, token_chars: int | None = None
) -> list[bytes]:
    """The completion as server-sent events, one `data:` line each. Text and arguments come in
    three pieces, or in pieces of `token_chars` characters (a paced stream: one per token)."""
    choice = completion["choices"][0]
    message = choice["message"] or {}
    head = {key: completion[key] for key in ("id", "created", "model", "system_fingerprint")}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        event: dict[str, Any] = {
            **head,
            "object": "chat.completion.chunk",
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if include_usage:
            event["usage"] = None
        return event

    def pieces(text: str) -> list[str]:
        step = token_chars or max(1, math.ceil(len(text) / 3))
        return [text[i : i + step] for i in range(0, len(text), step)]

    events = [chunk({"role": "assistant", "content": "", "refusal": None})]
    text = message.get("content") or ""
    events += [chunk({"content": piece}) for piece in pieces(text)]
    if message.get("refusal"):
        events.append(chunk({"refusal": message["refusal"]}))
    for n, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        opening = {"name": function["name"], "arguments": ""}
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {"index": n, "id": call["id"], "type": "function", "function": opening}
                    ]
                }
            )
        )
        arguments = function["arguments"]
        for piece in pieces(arguments) if isinstance(arguments, str) else [arguments]:
            events.append(chunk({"tool_calls": [{"index": n, "function": {"arguments": piece}}]}))
    events.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        events.append(
            {**head, "object": "chat.completion.chunk", "choices": [], "usage": completion["usage"]}
        )
    lines = [f"data: {json.dumps(event)}\n\n" for event in events] + ["data: [DONE]\n\n"]
    return [line.encode("utf-8") for line in lines]


def error_body(
    message: str, kind: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def fault_body(fault: Fault, model: str) -> dict[str, Any]:
    status = fault.status or 500
    if status == 429:
        wait_ms = round((fault.retry_after or 0) * 1000)
        default = (
            f"Rate limit reached for {model} in organization org-fake on requests per min "
            f"(RPM): Limit 3, Used 3, Requested 1. Please try again in {wait_ms}ms."
        )
        return error_body(fault.message or default, "requests", "rate_limit_exceeded")
    if status == 503:
        default = "The engine is currently overloaded, please try again later."
        return error_body(fault.message or default, "server_error")
    if status >= 500:
        default = "The server had an error while processing your request. Sorry about that!"
        return error_body(fault.message or default, "server_error")
    if status == 401:
        return error_body(
            fault.message or "Incorrect API key provided.",
            "invalid_request_error",
            "invalid_api_key",
        )
    return error_body(fault.message or f"Fake error {status}.", "invalid_request_error")


# ---------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


def _stem(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def embed(text: str, dimensions: int = EMBEDDING_DIMENSIONS) -> list[float]:
    """Deterministic signed hashed bag-of-words, L2-normalized: texts sharing words point
    the same way, so cosine similarity behaves like a (crude) real embedding."""
    vector = [0.0] * dimensions
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(_stem(word).encode("utf-8"), digest_size=8).digest()
        number = int.from_bytes(digest, "big")
        vector[number % dimensions] += 1.0 if (number >> 40) & 1 else -1.0
    norm = math.sqrt(sum(value * value for value in vector))
    if norm == 0:
        vector[0] = 1.0
        return vector
    return [value / norm for value in vector]


def _embedding_inputs(raw: Any) -> list[str] | None:
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw:
        if all(isinstance(item, str) for item in raw):
            return list(raw)
        if all(isinstance(item, int) for item in raw):
            return [" ".join(map(str, raw))]
        if all(isinstance(item, list) for item in raw):
            return [" ".join(map(str, item)) for item in raw]
    return None


# ---------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------


class FakeOpenAI(FakeServer[Request]):
    """An OpenAI-compatible server on 127.0.0.1.

    script: the default Script (or list of turns) for conversations no route claims.
    api_key: when set, the only accepted key (any
    non-empty bearer token is accepted otherwise). validate: reject requests the real
    API would reject (unanswered tool calls, orphan tool messages, bad tool names, non-strict
    schemas marked strict) with a 400, as the real API does. pace: stream replies at this
    many tokens a second (None: all at once).
    """

    def __init__(
        self,
        script: ScriptLike | None = None,
        *,
        api_key: str | None = None,
        validate: bool = True,
        pace: float | None = None,
    ) -> None:
        super().__init__()
        self.pace = pace  # tokens a second for streamed replies (a Turn's own pace wins)
        self.api_key = api_key
        self.validate = validate
        self._script: Script | None = _as_script(script) if script is not None else None
        self._routes: list[Responder] = []
        self._script_errors: list[str] = []
        self._ids = itertools.count(1)
        self.models = ["gpt-fake"]  # what GET /v1/models lists
        self._chats_open = self._chats_peak = 0  # chat requests being answered now, and most

    def take_peak_chats(self) -> int:
        """The most chat requests answered at once since the last call: how many runs were
        really waiting on the model together, whatever their clients hold."""
        with self._cond:
            peak, self._chats_peak = self._chats_peak, self._chats_open
            return peak

    @property
    def chats_open(self) -> int:
        """Chat requests being answered now (a reply's last byte may reach its client before
        the request is counted closed here)."""
        with self._cond:
            return self._chats_open

    @contextlib.contextmanager
    def _chat_open(self) -> Iterator[None]:
        with self._cond:
            self._chats_open += 1
            self._chats_peak = max(self._chats_peak, self._chats_open)
        try:
            yield
        finally:
            with self._cond:
                self._chats_open -= 1

    @property
    def url(self) -> str:
        """The base_url for `OpenAI(base_url=...)`."""
        return f"http://127.0.0.1:{self.port}/v1"

    # scripting -------------------------------------------------------------------------

    @property
    def script(self) -> Script | None:
        with self._cond:
            return self._script

    @script.setter
    def script(self, value: ScriptLike | None) -> None:
        with self._cond:
            self._script = _as_script(value) if value is not None else None

    def route(
        self,
        match: str | Mapping[str, ScriptLike] | Responder,
        script: ScriptLike | None = None,
    ) -> None:
        """Choose the script per conversation; routes are tried in the order added, before
        the default script.

        route("refund", Script([...])): the last user message contains "refund".
        route({"refund": Script([...]), "fees": [...]}): several substrings at once.
        route(lambda body: ... ): a function of the request JSON returning a Script (or a
        list of turns), a single Turn/Fault/str, or None to pass.
        """
        if isinstance(match, str):
            if script is None:
                raise TypeError("route(substring, script): the script is missing")
            self._add_route(_substring_route(match, _as_script(script)))
        elif isinstance(match, Mapping):
            for substring, value in match.items():
                self._add_route(_substring_route(substring, _as_script(value)))
        else:
            self._add_route(match)

    def _add_route(self, responder: Responder) -> None:
        with self._cond:
            self._routes.append(responder)

    def reset(self) -> None:
        """Forget routes, the default script, recorded requests, script errors and the listed
        models."""
        with self._cond:
            self._routes.clear()
            self._script = None
            self._script_errors.clear()
            self._records.clear()
            self.models = ["gpt-fake"]

    def decide(self, body: dict[str, Any]) -> tuple[Fault | None, Reply | str]:
        """(one-shot fault to serve first, the scripted reply or an error message)."""
        key, index = conversation_key(body), turn_index(body)
        with self._cond:
            routes, default = list(self._routes), self._script
        chosen: ScriptLike | TurnLike | None = None
        for responder in routes:
            chosen = responder(body)
            if chosen is not None:
                break
        if chosen is None:
            chosen = default
        if chosen is None:
            return None, self._script_error(f"no script or route for conversation {key!r}")
        if isinstance(chosen, (str, Turn, Fault, Recorded)):
            return None, _as_reply(chosen)
        if not isinstance(chosen, Script):
            chosen = Script(chosen)
        fault = chosen.take_fault(key, index)
        reply = chosen.turn(index)
        if reply is None:
            return fault, self._script_error(
                f"script exhausted: turn {index} requested, {len(chosen.turns)} scripted "
                f"(conversation {key!r})"
            )
        return fault, reply

    def _script_error(self, message: str) -> str:
        with self._cond:
            self._script_errors.append(message)
        return "FakeOpenAI: " + message

    def next_id(self) -> str:
        return f"chatcmpl-fake{next(self._ids):06d}"

    # inspection ------------------------------------------------------------------------

    @property
    def requests(self) -> list[Request]:
        return self.records()

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """Parsed bodies of every POST /v1/chat/completions, in arrival order."""
        return self._bodies("/v1/chat/completions")

    @property
    def embedding_requests(self) -> list[dict[str, Any]]:
        return self._bodies("/v1/embeddings")

    @property
    def last_chat_request(self) -> dict[str, Any]:
        bodies = self.chat_requests
        if not bodies:
            raise AssertionError("FakeOpenAI received no chat completion request")
        return bodies[-1]

    @property
    def script_errors(self) -> list[str]:
        """Requests no script could answer (they got a 500 with x-should-retry: false)."""
        with self._cond:
            return list(self._script_errors)

    def _bodies(self, path: str) -> list[dict[str, Any]]:
        return [
            request.body
            for request in self.records()
            if request.path == path and isinstance(request.body, dict)
        ]

    def describe_records(self) -> str:
        paths = [f"{request.method} {request.path}" for request in self._records]
        return f"{len(paths)} request(s): {paths[-10:]}; script errors: {self._script_errors}"


def _substring_route(substring: str, script: Script) -> Responder:
    def responder(body: dict[str, Any]) -> Script | None:
        return script if substring in conversation_key(body) else None

    return responder


class _OpenAIHandler(QuietHandler):
    @property
    def fake(self) -> FakeOpenAI:
        return cast(FakeOpenAI, self.server.owner)

    def serve(self, method: str) -> None:
        raw = self.read_body()
        path = urlsplit(self.path).path.rstrip("/")
        body: Any = None
        parse_failed = False
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                parse_failed = True
        self.fake.record(Request(method, path, self.header_dict(), body))
        if not self._authorized():
            return
        if parse_failed:
            self._error(
                400,
                error_body(
                    "We could not parse the JSON body of your request.", "invalid_request_error"
                ),
            )
        elif method == "POST" and path == "/v1/chat/completions":
            with self.fake._chat_open():
                self._chat(body)
        elif method == "POST" and path == "/v1/embeddings":
            self._embeddings(body)
        elif method == "GET" and path == "/v1/models":
            listed = [
                {"id": m, "object": "model", "created": 0, "owned_by": "fake"}
                for m in self.fake.models
            ]
            self.send_json(200, {"object": "list", "data": listed})
        else:
            message = f"Invalid URL ({method} {path})"
            self._error(404, error_body(message, "invalid_request_error"))

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization") or ""
        key = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        if not key:
            message = (
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
            )
            self._error(401, error_body(message, "invalid_request_error"))
            return False
        if self.fake.api_key is not None and key != self.fake.api_key:
            message = f"Incorrect API key provided: {key[:3]}***{key[-4:]}."
            self._error(401, error_body(message, "invalid_request_error", "invalid_api_key"))
            return False
        return True

    def _error(
        self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        self.send_json(status, payload, {"x-request-id": self._request_id(), **(headers or {})})

    def _request_id(self) -> str:
        return "req_" + hashlib.sha256(f"{time.monotonic_ns()}".encode()).hexdigest()[:24]

    def _chat(self, body: Any) -> None:
        fake = self.fake
        problem = check_chat_request(body) if fake.validate else None
        if problem is not None:
            message, param = problem
            self._error(400, error_body(message, "invalid_request_error", None, param))
            return
        fault, reply = fake.decide(body)
        if fault is not None and self._serve_fault(fault, body):
            return
        cut_after = fault.cut_after if fault is not None else None
        if isinstance(reply, str):
            self._error(500, error_body(reply, "fake_script_error"), {"x-should-retry": "false"})
            return
        if isinstance(reply, Recorded):
            self._replay(reply)
            return
        if isinstance(reply, Fault):
            if not self._serve_fault(reply, body):
                self._error(
                    500,
                    error_body(
                        "FakeOpenAI: a Fault in `turns` needs status or drop", "fake_script_error"
                    ),
                )
            return
        if not fake.pause(reply.delay):
            self.drop()
            return
        key, index = conversation_key(body), turn_index(body)
        completion = build_completion(
            body, reply, key=key, index=index, completion_id=fake.next_id()
        )
        pace = reply.pace if reply.pace is not None else fake.pace
        if pace and not body.get("stream"):  # a model writes as fast sent whole: answer when done
            tokens = len(stream_events(completion, False, 4)) - 1
            if not fake.pause(tokens / pace):
                self.drop()
                return
        if body.get("stream"):
            options = body.get("stream_options") or {}
            if pace or cut_after is not None or reply.stall_after is not None:
                events = stream_events(completion, bool(options.get("include_usage")), 4)
                stall = (reply.stall_after, reply.stall) if reply.stall_after is not None else None
                self._send_paced(events, 1.0 / pace if pace else 0.0, cut_after, stall)
                return
            stream = build_stream(completion, bool(options.get("include_usage")))
            self.send_bytes(
                200,
                stream,
                "text/event-stream; charset=utf-8",
                {"x-request-id": self._request_id()},
            )
        else:
            self.send_json(200, completion, {"x-request-id": self._request_id()})

    def _replay(self, reply: Recorded) -> None:
        """A recorded reply as the real server sent it: the body whole, or each recorded
        chunk as one HTTP chunk, in order."""
        if reply.chunks is None:
            headers = dict(reply.headers)
            self.send_bytes(reply.status, reply.body or b"", reply.content_type, headers)
        else:
            self._send_paced(list(reply.chunks), 0.0, None, None, reply.status, reply.content_type)

    def _send_paced(
        self,
        events: list[bytes],
        interval: float,
        cut_after: int | None,
        stall: tuple[int, float] | None = None,
        status: int = 200,
        content_type: str = "text/event-stream; charset=utf-8",
    ) -> None:
        """Each event in its own HTTP chunk, `interval` s apart, as a model writing tokens;
        the connection closes after `cut_after` events, if given; `stall` (after, seconds):
        nothing is sent for that long after that many events."""
        self.responded = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-request-id", self._request_id())
        self.end_headers()
        try:
            for n, event in enumerate(events):
                if n == cut_after:
                    self.drop()
                    return
                if n and not self.fake.pause(interval):
                    self.drop()
                    return
                if stall is not None and n == stall[0] and not self.fake.pause(stall[1]):
                    self.drop()
                    return
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _serve_fault(self, fault: Fault, body: dict[str, Any]) -> bool:
        """Serve a fault; False when it was only a delay and the turn should follow."""
        if not self.fake.pause(fault.delay) or fault.drop:
            self.drop()
            return True
        if fault.status is None:
            return False
        headers = dict(fault.headers)
        if fault.retry_after is not None:
            headers.setdefault("retry-after", f"{fault.retry_after:g}")
            headers.setdefault("retry-after-ms", str(round(fault.retry_after * 1000)))
        self._error(fault.status, fault_body(fault, str(body.get("model", ""))), headers)
        return True

    def _embeddings(self, body: Any) -> None:
        if not isinstance(body, dict) or not body.get("model"):
            self._error(
                400, error_body("you must provide a model parameter", "invalid_request_error")
            )
            return
        texts = _embedding_inputs(body.get("input"))
        if texts is None or any(text == "" for text in texts):
            message = "'$.input' is invalid. Please check the API reference."
            self._error(400, error_body(message, "invalid_request_error", None, "input"))
            return
        dimensions = int(body.get("dimensions") or EMBEDDING_DIMENSIONS)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(texts):
            vector = embed(text, dimensions)
            encoded: Any = vector
            if as_base64:
                encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(estimate_tokens(text) for text in texts)
        payload = {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        self.send_json(200, payload, {"x-request-id": self._request_id()})


FakeOpenAI.handler_class = _OpenAIHandler
