"""OpenTelemetry traces: one trace per run, across the bot and every worker that advances it.

Off unless the standard environment configures it: `OTEL_TRACES_EXPORTER` (`otlp`, `console`,
or any exporter installed under the SDK's entry points; `none` is off) or an OTLP endpoint
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `..._TRACES_ENDPOINT`). The SDK reads the rest itself:
`OTEL_EXPORTER_OTLP_*` (endpoint, headers, timeout), `OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER(_ARG)`, `OTEL_BSP_*`. Off, nothing of
OpenTelemetry is imported and every hook below returns at once (bench/bench_tracing.py).

The trace of a run (README, "Traces"):

    slack.request (bot: arrival to ack)
      switchboard.ask (bot: the run is created; its trace context saved on the run)
      invoke_agent switchboard (the run: created_at to ended_at, status and reason)
        switchboard.advance (one per job, in whichever worker takes it)
          chat MODEL, execute_tool NAME, ledger begin / finish (events)
        switchboard.approval NAME (requested_at to decided_at, emitted by the decider)

A run and an approval wait last minutes or days and cross processes, so neither is held open
as a live span: each is emitted once it is over, with its recorded start time. The run's span
id is chosen when the run is created and saved in the run record (W3C `traceparent`), so
spans of every process name it as their parent before it is emitted (`_PinnedIds`).

Content (messages, tool arguments and results) only with the GenAI conventions' switch,
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`, and redacted of credentials
always (worker/redact.py); Slack user ids only with `SWITCHBOARD_TRACE_USER_IDS=true`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar, copy_context
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from tools.exceptions import brief
from worker.redact import redact_text, redact_value

if TYPE_CHECKING:
    from approvals import ApprovalRequest
    from worker.model_base import Model
    from worker.run import Call, Run
    from worker.turns import ModelTurn

log = structlog.get_logger(__name__)

T = TypeVar("T")

CONTENT_SWITCH = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
CONTENT_ON = ("true", "1", "yes", "span_only", "span_and_event")
MAX_CONTENT_CHARS = 8000  # one attribute's recorded content, at most (after redaction)
SCOPE = "switchboard"


@dataclass
class _On:
    tracer: Any  # opentelemetry.trace.Tracer
    provider: Any  # opentelemetry.sdk.trace.TracerProvider
    content: bool
    user_ids: bool
    known: tuple[str, ...]  # this process's own secrets, replaced wherever they appear


_state: _On | None = None
_PINNED: ContextVar[int | None] = ContextVar("switchboard_pinned_span_id", default=None)


def enabled() -> bool:
    return _state is not None


def configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the OTEL_* environment asks for traces."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = _exporter_names(env)
    return bool(names) and names != ["none"]


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    named = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    named = [n for n in named if n]
    if named:
        return named
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    return ["otlp"] if endpoint else []


def setup(
    role: str,
    *,
    user_ids: bool = False,
    known_secrets: Sequence[str] = (),
    exporter: Any = None,
) -> bool:
    """Start tracing in this process (`role`: bot, worker, chat...) when the environment
    asks for it, or with `exporter` (tests, benchmarks: any SDK SpanExporter, exported at
    once). True when on. A misconfiguration (an unknown exporter, the SDK not installed) is
    logged and leaves tracing off: traces are never a reason for a process not to start."""
    global _state
    if exporter is None and not configured():
        return False
    try:
        _state = _start(role, exporter, user_ids, tuple(s for s in known_secrets if s))
    except (ImportError, ValueError) as exc:
        log.warning("tracing_not_started", error=brief(exc))
        return False
    log.info("tracing_started", role=role)
    return True


def _start(role: str, exporter: Any, user_ids: bool, known: tuple[str, ...]) -> _On:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create({"switchboard.role": role})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "switchboard"}))
    # The sampler comes from OTEL_TRACES_SAMPLER (parent-based: a run is sampled or not whole)
    provider = TracerProvider(resource=resource, id_generator=_pinned_ids())
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        for made in _exporters(os.environ):
            provider.add_span_processor(BatchSpanProcessor(made))
    content = os.environ.get(CONTENT_SWITCH, "").strip().lower() in CONTENT_ON
    return _On(provider.get_tracer(SCOPE), provider, content, user_ids, known)


def _exporters(env: Mapping[str, str]) -> list[Any]:
    """The exporters OTEL_TRACES_EXPORTER names, found as the SDK's auto-configuration finds
    them (the `opentelemetry_traces_exporter` entry points), each configured by its own
    OTEL_EXPORTER_* variables. `otlp` is OTLP over HTTP unless OTEL_EXPORTER_OTLP_PROTOCOL
    says `grpc` (the specification's default; the gRPC exporter is not a dependency). Not the
    SDK's `_OTelSDKConfigurator` itself: it is private, and it also starts metrics and logs
    exporters and a global provider, which Switchboard does not want (Prometheus has its
    metrics, structlog its logs)."""
    from importlib.metadata import entry_points

    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    by_protocol = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
    made = []
    for name in _exporter_names(env):
        if name == "none":
            continue
        if name == "console":  # the SDK's, on stderr: stdout is the terminal console's
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            made.append(ConsoleSpanExporter(out=sys.stderr))
            continue
        if name == "otlp":
            if protocol not in by_protocol:
                raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported")
            name = by_protocol[protocol]
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            raise ValueError(f"the trace exporter {name!r} is not installed")
        made.append(next(iter(found)).load()())
    return made


def _pinned_ids() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class PinnedIds(RandomIdGenerator):
        """Random ids, except the span id pinned for the span being started (a run's span,
        whose id its record has carried since the run was created)."""

        def generate_span_id(self) -> int:
            pinned = _PINNED.get()
            return pinned if pinned is not None else super().generate_span_id()

    return PinnedIds()


def shutdown() -> None:
    """Export what is buffered and stop (a process's exit; the SDK does it at exit too)."""
    global _state
    state, _state = _state, None
    if state is not None:
        state.provider.shutdown()


# -- the run's trace context, in its record ---------------------------------------------------


def new_run(question_chars: int, profile: str | None) -> dict[str, str]:
    """At a run's creation, in the process that creates it: the `switchboard.ask` span (a
    child of the Slack request, when there is one), and the run's trace context, to save in
    the run record. {} when tracing is off."""
    if _state is None:
        return {}
    attributes: dict[str, Any] = {"switchboard.question.chars": question_chars}
    if profile:
        attributes["gen_ai.agent.name"] = profile
    with _state.tracer.start_as_current_span("switchboard.ask", attributes=attributes) as ask:
        made = ask.get_span_context()
    run_span = secrets.randbits(64) or 1
    flags = int(made.trace_flags)
    return {
        "traceparent": f"00-{made.trace_id:032x}-{run_span:016x}-{flags:02x}",
        "parent": f"{made.span_id:016x}",
    }


def trace_id(carrier: Mapping[str, str]) -> str:
    """The run's trace id (32 hex digits), or "" for a run recorded without one."""
    parts = carrier.get("traceparent", "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else ""


def _context(carrier: Mapping[str, str]) -> Any:
    """The OpenTelemetry context whose current span is the run's (saved) span."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": carrier.get("traceparent", "")})


@contextlib.contextmanager
def advance(run: Run) -> Iterator[None]:
    """One job advancing `run` in this worker: a span under the run's, current while the job
    runs (the model and tool calls nest in it), and the trace id on every log line."""
    if _state is None or not run.trace:
        yield
        return
    from opentelemetry import context as otel_context
    from opentelemetry.trace import Status, StatusCode

    span = _state.tracer.start_span(
        "switchboard.advance",
        context=_context(run.trace),
        attributes={"switchboard.run.id": run.id, "process.pid": os.getpid()},
    )
    token = otel_context.attach(_with_span(span))
    try:
        with structlog.contextvars.bound_contextvars(trace_id=trace_id(run.trace)):
            yield
        span.set_attribute("switchboard.run.status", run.status.value)
    except BaseException as exc:  # its kind only: an error's text may quote anything
        span.set_attribute("error.type", type(exc).__name__)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        otel_context.detach(token)
        span.end()


def _with_span(span: Any) -> Any:
    from opentelemetry.trace import set_span_in_context

    return set_span_in_context(span)


def model_called(model: Model, messages: list[dict[str, Any]], turn: ModelTurn) -> None:
    """A model call that answered: a `chat` span (GenAI conventions) ending now, begun the
    call's duration ago, under the current advance span."""
    if _state is None:
        return
    attributes = _chat_attributes(model)
    attributes.update(
        {
            "gen_ai.usage.input_tokens": turn.prompt_tokens,
            "gen_ai.usage.output_tokens": turn.completion_tokens,
            "gen_ai.response.finish_reasons": [turn.finish_reason or "unknown"],
        }
    )
    if _state.content:
        attributes["gen_ai.input.messages"] = _content(_input_messages(messages))
        attributes["gen_ai.output.messages"] = _content(_output_messages(turn))
    end = time.time_ns()
    span = _state.tracer.start_span(
        f"chat {model.model}",
        kind=_client_kind(),
        start_time=end - int(turn.seconds * 1e9),
        attributes=attributes,
    )
    span.end(end_time=end)


def model_failed(model: Model, error_type: str, seconds: float) -> None:
    """A model call that failed (worker.model.ModelError: `error_type` is its kind)."""
    if _state is None:
        return
    from opentelemetry.trace import Status, StatusCode

    attributes = _chat_attributes(model)
    attributes["error.type"] = error_type
    end = time.time_ns()
    span = _state.tracer.start_span(
        f"chat {model.model}",
        kind=_client_kind(),
        start_time=end - int(seconds * 1e9),
        attributes=attributes,
    )
    span.set_status(Status(StatusCode.ERROR, error_type))
    span.end(end_time=end)


def _chat_attributes(model: Model) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",  # the API it speaks (any OpenAI-compatible server)
        "gen_ai.request.model": model.model,
    }
    server = str(getattr(model, "server", ""))  # host:port, never the key (worker/model.py)
    host, _, port = server.rpartition(":")
    if server:
        attributes["server.address"] = host if port.isdigit() else server
    if port.isdigit():
        attributes["server.port"] = int(port)
    return attributes


def _client_kind() -> Any:
    from opentelemetry.trace import SpanKind

    return SpanKind.CLIENT


def _input_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conventions' input messages (role and parts) of a Chat Completions request."""
    shaped = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        if message.get("content"):
            kind = "tool_call_response" if message.get("role") == "tool" else "text"
            key = "response" if kind == "tool_call_response" else "content"
            part: dict[str, Any] = {"type": kind, key: str(message["content"])}
            if kind == "tool_call_response":
                part["id"] = message.get("tool_call_id", "")
            parts.append(part)
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id", ""),
                    "name": function.get("name", ""),
                    "arguments": function.get("arguments", ""),
                }
            )
        shaped.append({"role": message.get("role", ""), "parts": parts})
    return shaped


def _output_messages(turn: ModelTurn) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if turn.content:
        parts.append({"type": "text", "content": turn.content})
    for call in turn.calls:
        parts.append(
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        )
    return [{"role": "assistant", "parts": parts, "finish_reason": turn.finish_reason or ""}]


def _content(value: Any) -> str:
    """Content as the conventions record it on spans (a JSON string), redacted, bounded."""
    assert _state is not None
    text = json.dumps(redact_value(value, _state.known), ensure_ascii=False, default=str)
    return text if len(text) <= MAX_CONTENT_CHARS else text[:MAX_CONTENT_CHARS] + "…"


def tool_call(call: Call, run_tool: Callable[..., T], *args: Any) -> T:
    """`run_tool(*args)` (tools.execute.execute: it returns an Observation, never raises for
    a tool's own failure) inside an `execute_tool` span (GenAI conventions)."""
    if _state is None:
        return run_tool(*args)
    from opentelemetry.trace import Status, StatusCode

    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
        "switchboard.tool.effect": call.effect,
    }
    if call.approval_id:
        attributes["switchboard.approval.id"] = call.approval_id
    if _state.content and call.args is not None:
        attributes["gen_ai.tool.call.arguments"] = _content(call.args)
    with _state.tracer.start_as_current_span(
        f"execute_tool {call.name}", attributes=attributes
    ) as span:
        observation = run_tool(*args)
        ok = getattr(observation, "ok", True)
        if not ok:
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, "tool_error"))
        elif _state.content:
            span.set_attribute(
                "gen_ai.tool.call.result", _content(getattr(observation, "text", ""))
            )
        return observation


def ledger(what: str, approval_id: str, **fields: Any) -> None:
    """The execution ledger's begin or finish of an approved write: an event on the current
    span (the job advancing the run)."""
    if _state is None:
        return
    from opentelemetry.trace import get_current_span

    attributes = {"switchboard.approval.id": approval_id}
    attributes.update({f"switchboard.ledger.{k}": v for k, v in fields.items()})
    get_current_span().add_event(f"ledger {what}", attributes)


def approval_decided(request: ApprovalRequest, carrier: Callable[[], Mapping[str, str]]) -> None:
    """The wait for a decision, from the request to its decision (approved, rejected, expired,
    withdrawn): a span under the run's, emitted by whoever decided, once (the decision that
    won). It links the span current here (the Slack click, a CLI command), which belongs to a
    trace of its own."""
    if _state is None:
        return
    found = carrier()
    if not found:
        return
    from opentelemetry.trace import Link, get_current_span

    attributes: dict[str, Any] = {
        "switchboard.approval.id": request.id,
        "switchboard.approval.decision": request.status.value,
        "switchboard.approval.edited": request.original_args is not None,
        "gen_ai.tool.name": request.tool,
        "gen_ai.tool.call.id": request.call_id,
    }
    if _state.user_ids and request.decided_by:
        attributes["switchboard.approval.decided_by"] = request.decided_by
    here = get_current_span().get_span_context()
    links = [Link(here)] if here.is_valid else []
    decided = request.decided_at or time.time()
    span = _state.tracer.start_span(
        f"switchboard.approval {request.tool}",
        context=_context(found),
        start_time=int(request.created_at * 1e9),
        attributes=attributes,
        links=links,
    )
    span.end(end_time=int(decided * 1e9))


def run_ended(run: Run) -> None:
    """The run's own span (`invoke_agent`, GenAI agent conventions), from its creation to its
    end, with the id its record carried all along, under the `switchboard.ask` span."""
    if _state is None or not run.trace:
        return
    from opentelemetry.trace import (
        NonRecordingSpan,
        SpanContext,
        Status,
        StatusCode,
        TraceFlags,
        set_span_in_context,
    )

    parts = run.trace.get("traceparent", "").split("-")
    try:
        trace, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
        parent_id = int(run.trace.get("parent", ""), 16)
    except (IndexError, ValueError):
        return
    parent = SpanContext(trace, parent_id, is_remote=True, trace_flags=TraceFlags(flags))
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": run.profile.name if run.profile else "switchboard",
        "gen_ai.request.model": run.model,
        "gen_ai.conversation.id": run.parent_id or run.id,
        "gen_ai.usage.input_tokens": run.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": run.usage.completion_tokens,
        "switchboard.run.id": run.id,
        "switchboard.run.status": run.status.value,
        "switchboard.run.reason": run.reason.value if run.reason else "",
        "switchboard.run.steps": run.usage.steps,
        "switchboard.run.tool_calls": run.usage.tool_calls,
        "switchboard.run.cost": run.usage.cost,
    }
    if _state.user_ids:
        attributes["enduser.id"] = run.requester.user_id
    pinned = _PINNED.set(span_id)
    try:
        span = _state.tracer.start_span(
            "invoke_agent " + str(attributes["gen_ai.agent.name"]),
            context=set_span_in_context(NonRecordingSpan(parent)),
            start_time=int(run.created_at * 1e9),
            attributes=attributes,
        )
    finally:
        _PINNED.reset(pinned)
    if run.status.value == "failed":
        span.set_status(Status(StatusCode.ERROR, redact_text(run.detail, _state.known)[:200]))
        span.set_attribute("error.type", run.reason.value if run.reason else "_OTHER")
    span.end(end_time=int((run.ended_at or time.time()) * 1e9))


# -- the Slack surface ------------------------------------------------------------------------


@contextlib.contextmanager
def slack_request(kind: str) -> Iterator[None]:
    """A request from Slack, from its arrival to its ack (the bot's dispatch): the root of
    a question's trace; the trace id goes on the log lines of its listener."""
    if _state is None:
        yield
        return
    from opentelemetry.trace import SpanKind

    with (
        _state.tracer.start_as_current_span(
            f"slack {kind}", kind=SpanKind.SERVER, attributes={"slack.request.type": kind}
        ) as span,
        structlog.contextvars.bound_contextvars(
            trace_id=f"{span.get_span_context().trace_id:032x}"
        ),
    ):
        yield


class ContextPool(ThreadPoolExecutor):
    """A thread pool whose tasks run in the context they were submitted from (contextvars:
    the current span, the log context). Bolt runs listeners in one, after the ack."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return super().submit(copy_context().run, fn, *args, **kwargs)
