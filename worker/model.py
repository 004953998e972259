"""The model adapter: Chat Completions with native function calling through the openai SDK."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Literal, Protocol

import httpx2
import openai
import structlog

from worker import metrics
from worker.deadline import CutOffSink, Overdue, within
from worker.streaming import TextSink, TurnAccumulator
from worker.turns import ModelTurn, read_turn

log = structlog.get_logger(__name__)

DEADLINE_GRACE = 0.25  # seconds past a call's timeout before it is given up (worker.deadline)


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
        as it arrives; the turn (and its usage) is the same as without. It ends within
        `timeout` (worker.deadline), also when the server stalls or the SDK retries. A
        failure is counted by kind and logged as a warning naming the server, then raised."""
        try:
            return self._within(messages, tools, timeout, sink)
        except ModelError as exc:
            self._failed(exc, "model_call_failed")
            raise

    def _within(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        timeout: float,
        sink: TextSink | None,
    ) -> ModelTurn:
        started = time.monotonic()
        guarded = CutOffSink(sink) if sink is not None else None
        try:
            return within(
                timeout + DEADLINE_GRACE,
                lambda: self._complete(messages, tools, timeout, guarded, started),
            )
        except Overdue:
            if guarded is not None:
                guarded.cut()
            log.warning("model_call_overdue", timeout=timeout)
            raise ModelError(
                f"the model did not answer within {timeout:.0f} s", timed_out=True
            ) from None

    def _complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        timeout: float,
        sink: TextSink | None,
        started: float,
    ) -> ModelTurn:
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


def _short(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:300]
    return str(exc.message)[:300]
