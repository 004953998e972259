"""What a model is to the runtime, without the SDK that calls one (worker/model.py): the
protocol the loop calls, its errors, what a failed attempt cost, how requests sample, how
many connection pools serve a process. The bot, which never calls the model, imports this
and not the openai SDK."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tools.decode import compact_json
from worker.streaming import TextSink
from worker.turns import ModelTurn

if TYPE_CHECKING:
    from tools.registry import Tool

# Threads per HTTP connection pool. The pool (httpx's, under the SDK) does work proportional to
# its connections and waiting requests, under one lock, at every request start and response
# end: shared by 1,000 slots it was where 884 of 1,011 threads waited (issue 28). A pool per
# group of threads keeps that work small and the lock mostly uncontended.
POOL_THREADS = 16


def pools_for(threads: int) -> int:
    """How many connection pools `threads` concurrent callers get."""
    return max(1, math.ceil(threads / POOL_THREADS))


# Why a model request failed, for the metric and the log line (metrics.MODEL_ERROR_KINDS):
# the server could not be reached (or its reply broke off), did not answer in time, answered
# with an error (an unknown model, a bad key, a 5xx after the retries, an empty reply), or
# kept answering 429.
ModelErrorKind = Literal["unreachable", "timeout", "rejected", "rate_limited"]


class ModelError(Exception):
    """The model could not be reached or refused the request after the client's own retries."""

    def __init__(
        self, detail: str, *, timed_out: bool = False, kind: ModelErrorKind | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.timed_out = timed_out
        self.kind: ModelErrorKind = kind or ("timeout" if timed_out else "rejected")


NO_MODEL = (
    "No model is configured. Set OPENAI_API_KEY (and SWITCHBOARD_MODEL) to use OpenAI, or "
    "OPENAI_BASE_URL to use any OpenAI-compatible server."
)


class ModelNotConfigured(RuntimeError):
    pass


@dataclass(frozen=True)
class Sampling:
    """How every request asks the model to write, besides its output bound (which the loop
    gives per step): what the bound is called, and the knobs sent only when configured."""

    tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    temperature: float | None = None
    tool_choice: str = ""  # "": not sent (the server's default, "auto")
    parallel_tool_calls: bool | None = None  # None: not sent


TokensKnown = Literal["reported", "estimated", "unknown", "none"]


@dataclass(frozen=True)
class Spent:
    """What an attempt that failed cost, as far as it is known: `reported` by the server
    (usage came before the stream was cut), `estimated` from what it streamed (4 characters
    a token, the prompt from the request's size), `unknown` (an answer sent whole that never
    came: the server may have generated anything), or `none` (nothing was generated: the
    connection failed, or the server answered an error)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    known: TokensKnown = "none"


class Watch(Protocol):
    """Told about a model step while it runs (worker/model_watch.py records and shows it)."""

    def attempt_started(self, attempt: int, attempts: int) -> None: ...

    def attempt_failed(
        self, attempt: int, attempts: int, error: ModelError, spent: Spent, seconds: float
    ) -> None: ...

    def waiting(self, seconds: float) -> None:
        """Called every few seconds while an attempt runs: `seconds` since the step began."""


class Model(Protocol):
    """What the loop needs of a model: the OpenAI-backed client, or a scripted one."""

    model: str

    @property
    def attempts(self) -> int:
        """How many times one step is tried at most (the first attempt and the retries)."""
        ...

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        timeout: float,
        sink: TextSink | None = None,
        *,
        max_tokens: int | None = None,
        watch: Watch | None = None,
    ) -> ModelTurn: ...


class ToolSpecs(tuple[dict[str, Any], ...]):
    """A request's `tools` entries (a tuple: its text could not follow a change), with their
    JSON text as posted: each tool's own, encoded once (`Tool.openai_spec_json`), joined.
    `encode_body` splices it in, where json.dumps encoded the entries again at every model
    call: measured in a worker at 100 slots (800 calls of 8.4 KB), 59 us a body against 97."""

    text: str

    def __new__(cls, tools: Iterable[Tool]) -> ToolSpecs:
        offered = list(tools)
        specs = super().__new__(cls, (tool.openai_spec() for tool in offered))
        specs.text = "[" + ",".join(tool.openai_spec_json for tool in offered) + "]"
        return specs


def encode_body(body: dict[str, Any]) -> str:
    """A request's body as posted (`compact_json`), its ToolSpecs' text spliced in (as its
    last key: the same JSON object as the body encoded whole, keys aside)."""
    tools = body.get("tools")
    if not isinstance(tools, ToolSpecs):
        return compact_json(body)
    rest = compact_json({name: value for name, value in body.items() if name != "tools"})
    return f'{rest[:-1]}{"," if len(rest) > 2 else ""}"tools":{tools.text}}}'
