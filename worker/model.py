"""The model adapter: Chat Completions with native function calling through the openai SDK."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx2
import openai
import structlog

from tools.execute import valid_unicode
from worker import metrics
from worker.streaming import TextSink, TurnAccumulator

log = structlog.get_logger(__name__)

MAX_ARGUMENTS_KEPT = 64 * 1024  # what we keep of a call's raw arguments for the transcript


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


class Model(Protocol):
    """What the loop needs of a model: the OpenAI-backed client, or a scripted one."""

    model: str

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        timeout: float,
        sink: TextSink | None = None,
    ) -> ModelTurn: ...


class ModelClient:
    """One client per process; the SDK retries 408/409/429/5xx and connection errors itself,
    with bounded exponential backoff that honours Retry-After."""

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None,
        base_url: str | None,
        timeout: float = 60.0,
        max_retries: int = 2,
    ) -> None:
        if not api_key and not base_url:
            raise ModelNotConfigured(NO_MODEL)
        self.model = model
        self.timeout = timeout
        self.client = openai.OpenAI(
            api_key=api_key or "not-needed",
            base_url=base_url,
            timeout=openai.Timeout(timeout, connect=5.0),
            max_retries=max_retries,
        )
        url = self.client.base_url
        # Where the model server is, as logs may say it: host and port, never the key (a
        # header) nor anything else of the URL (a proxy's credentials, a query).
        self.server = f"{url.host}:{url.port}" if url.port else str(url.host)

    def check(self, timeout: float = 5.0) -> bool:
        """At start-up: one GET /models, no retries. Warns, and never raises, when the server
        cannot be reached, refuses, or does not list the configured model; a process starts
        either way (the server may come up later), but an operator reads why runs will fail."""
        try:
            listed = self._listed(timeout)
        except ModelError as exc:
            self._failed(exc, "model_server_check_failed")
            return False
        if listed and self.model not in listed:
            log.warning(
                "model_not_listed", server=self.server, model=self.model, listed=len(listed)
            )
            return False
        log.info("model_server_ok", server=self.server, model=self.model)
        return True

    def probe(self, timeout: float = 5.0) -> str | None:
        """As `check`, for a report (`switchboard status`): None when the server answers and
        lists the model, else why not, in words; nothing logged or counted."""
        try:
            listed = self._listed(timeout)
        except ModelError as exc:
            return exc.detail
        if listed and self.model not in listed:
            return f"the server does not list the model {self.model!r}"
        return None

    def _listed(self, timeout: float) -> list[str]:
        """GET /models, once (no retries), within `timeout`."""
        client = self.client.with_options(
            timeout=openai.Timeout(timeout, connect=min(timeout, 5.0)), max_retries=0
        )
        with model_errors(timeout):
            return [model.id for model in client.models.list()]

    def _failed(self, exc: ModelError, event: str) -> None:
        metrics.model_failed(exc.kind)
        log.warning(event, kind=exc.kind, server=self.server, model=self.model, error=exc.detail)

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        timeout: float,
        sink: TextSink | None = None,
    ) -> ModelTurn:
        """One model call. With a `sink`, the reply is streamed and its answer text passed on
        as it arrives; the turn (and its usage) is the same as without. A failure is counted
        by kind and logged as a warning naming the server, then raised."""
        try:
            return self._complete(messages, tools, timeout, sink)
        except ModelError as exc:
            self._failed(exc, "model_call_failed")
            raise

    def _complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        timeout: float,
        sink: TextSink | None,
    ) -> ModelTurn:
        started = time.monotonic()
        # The request is plain JSON already. Handed to `create(messages=...)`, the SDK would
        # first walk every message against its typed definitions, which measured as more CPU
        # than the rest of a step; `extra_body` is sent as it is (it replaces these keys).
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
            body["parallel_tool_calls"] = True
        client = self.client.with_options(timeout=openai.Timeout(timeout, connect=5.0))
        with model_errors(timeout):
            if sink is not None:
                return self._streamed(client, body, timeout, sink, started)
            response = client.chat.completions.create(
                model=self.model, messages=[], extra_body=body
            )
        if not response.choices:
            raise ModelError("the model server returned no choices")
        return read_turn(response.choices[0], response.usage, time.monotonic() - started)

    def _streamed(
        self,
        client: openai.OpenAI,
        body: dict[str, Any],
        timeout: float,
        sink: TextSink,
        started: float,
    ) -> ModelTurn:
        """The SDK retries a request that fails before its stream starts; a stream that breaks
        off midway is asked for again here, as often, and the sink told to start over."""
        for attempt in range(self.client.max_retries + 1):
            acc = TurnAccumulator(sink)
            stream = client.chat.completions.create(  # failures here: the SDK's retries
                model=self.model,
                messages=[],
                stream=True,
                stream_options={"include_usage": True},
                extra_body=body,
            )
            try:
                with stream:
                    for chunk in stream:
                        acc.add(chunk)
                        if time.monotonic() - started > timeout:
                            raise ModelError(
                                f"the model did not answer within {timeout:.0f} s", timed_out=True
                            )
            except (httpx2.TimeoutException, openai.APITimeoutError) as exc:
                raise ModelError(
                    f"the model did not answer within {timeout:.0f} s", timed_out=True
                ) from exc
            except (httpx2.TransportError, openai.APIConnectionError) as exc:
                if attempt >= self.client.max_retries:
                    raise ModelError(
                        "the model's streamed reply broke off", kind="unreachable"
                    ) from exc
                log.warning("model_stream_retry", attempt=attempt + 1, error=type(exc).__name__)
                sink.reset()
                continue
            if not acc.saw_choice:
                raise ModelError("the model server returned no choices")
            return acc.turn(time.monotonic() - started)
        raise AssertionError("unreachable")


@contextlib.contextmanager
def model_errors(timeout: float) -> Iterator[None]:
    """The SDK's exceptions as ModelError, in words fit for the run's record."""
    try:
        yield
    except openai.APITimeoutError as exc:
        raise ModelError(
            f"the model did not answer within {timeout:.0f} s", timed_out=True
        ) from exc
    except openai.APIConnectionError as exc:
        raise ModelError(
            "could not reach the model server (connection failed)", kind="unreachable"
        ) from exc
    except openai.APIStatusError as exc:
        raise ModelError(
            f"the model server answered HTTP {exc.status_code}: {_short(exc)}",
            kind="rate_limited" if exc.status_code == 429 else "rejected",
        ) from exc
    except openai.OpenAIError as exc:
        raise ModelError(f"model client error: {type(exc).__name__}") from exc


def read_turn(choice: Any, usage: Any, seconds: float) -> ModelTurn:
    """The SDK builds replies without validating them, so any field may be missing, null or
    of another type. Read each one defensively and canonically: a call without an id, or
    with one already used in the turn, gets one of ours (the transcript sends it back
    consistently); a call without a function is kept with an empty name, so the model reads
    "no such tool" instead of the run failing; model text is cleaned of lone surrogates,
    since it is stored and sent again."""
    message = getattr(choice, "message", None)
    calls: list[ProposedCall] = []
    for call in _list(getattr(message, "tool_calls", None)):
        if getattr(call, "type", None) not in ("function", None):
            continue  # another kind of tool (custom, ...) that we never offered
        function = getattr(call, "function", None)
        calls.append(
            ProposedCall(
                id=_unique_id(getattr(call, "id", None), {c.id for c in calls}),
                name=_text(getattr(function, "name", None)),
                arguments=_text(getattr(function, "arguments", None))[:MAX_ARGUMENTS_KEPT],
            )
        )
    content = getattr(message, "content", None)
    refusal = getattr(message, "refusal", None)
    finish = getattr(choice, "finish_reason", None)
    return ModelTurn(
        finish_reason=finish if isinstance(finish, str) and finish else _implied(calls),
        content=_text(content) if content is not None else None,
        refusal=_text(refusal) if refusal else None,
        calls=calls,
        prompt_tokens=_count(getattr(usage, "prompt_tokens", 0)),
        completion_tokens=_count(getattr(usage, "completion_tokens", 0)),
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


def _list(value: object) -> list[Any]:
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


def _short(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:300]
    return str(exc.message)[:300]
