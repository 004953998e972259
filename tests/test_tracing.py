"""OpenTelemetry traces (worker/tracing.py) with the real SDK and its in-memory exporter: one
trace per run, spans following the GenAI conventions, content only when opted in, and no
credential in any span."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.fakes.openai_server import Turn
from tests.support.runtime import ALICE, approve_first, make_runtime, work
from worker import service, tracing
from worker.run import RunStatus

SLACK_TOKEN = "xoxb-1111111111-2222222222-abcdefABCDEF"
API_KEY = "sk-live-abcdefghijklmnopqrstuvwx"
LOOKUP = Turn(tool_calls=[("knowledge_lookup", {"name": "Django Fundamentals"})])
CREATE = Turn(
    tool_calls=[
        (
            "create_ticket",
            {"project": "IT", "title": "VPN down", "body": f"my token is {SLACK_TOKEN}"},
        )
    ]
)
QUESTION = f"Django Fundamentals fee? Then file a ticket: VPN down (key {API_KEY})"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.setup("test", exporter=exporter, known_secrets=(API_KEY,))
    try:
        yield exporter
    finally:
        tracing.shutdown()


def run_with_read_and_approved_write(redis_conn: Any, model_server: Any) -> str:
    model_server.route("Django Fundamentals fee", [LOOKUP, CREATE, "Filed ticket #1."])
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, QUESTION, ALICE)
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.AWAITING_APPROVAL
    approve_first(rt, run.id)
    work(rt)
    ended = rt.store.load(run.id)
    assert ended.status == RunStatus.COMPLETED, ended.detail
    return tracing.trace_id(ended.trace)


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        named.setdefault(span.name.split(" ")[0], []).append(span)
    return named


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def when(span: ReadableSpan) -> tuple[int, int]:
    assert span.start_time is not None and span.end_time is not None
    return span.start_time, span.end_time


def every_value(spans: tuple[ReadableSpan, ...]) -> str:
    """Everything the spans carry, as one text: names, attributes, events, status."""
    out = []
    for span in spans:
        out.append(span.name)
        out.append(json.dumps(dict(span.attributes or {}), default=str))
        out += [e.name + json.dumps(dict(e.attributes or {})) for e in span.events]
        out.append(str(span.status.description))
    return "\n".join(out)


def test_a_run_is_one_trace_whose_spans_nest_under_the_run(
    redis_conn, model_server, tickets_db, spans
):
    trace_id = run_with_read_and_approved_write(redis_conn, model_server)
    finished = spans.get_finished_spans()
    assert {f"{s.context.trace_id:032x}" for s in finished} == {trace_id}
    named = by_name(finished)
    [ask], [agent] = named["switchboard.ask"], named["invoke_agent"]
    assert agent.parent is not None and agent.parent.span_id == ask.context.span_id
    assert len(named["switchboard.advance"]) == 2  # before the approval, and after it
    for advance in named["switchboard.advance"]:
        assert advance.parent is not None and advance.parent.span_id == agent.context.span_id
    [wait] = named["switchboard.approval"]
    assert wait.parent is not None and wait.parent.span_id == agent.context.span_id
    assert attrs(wait)["switchboard.approval.decision"] == "approved"
    assert "switchboard.approval.decided_by" not in attrs(wait)  # not opted in
    # the wait: from the request (the first job) to the decision (before the second job)
    first_job, second_job = (when(s) for s in named["switchboard.advance"])
    assert first_job[0] < when(wait)[0] < first_job[1] and when(wait)[1] <= second_job[0]

    advances = {s.context.span_id for s in named["switchboard.advance"]}
    chats, tools = named["chat"], named["execute_tool"]
    assert len(chats) == 3 and len(tools) == 2
    assert all(s.parent is not None and s.parent.span_id in advances for s in chats + tools)
    assert attrs(chats[0])["gen_ai.operation.name"] == "chat"
    assert attrs(chats[0])["gen_ai.request.model"] == "gpt-fake"
    assert attrs(chats[0])["gen_ai.usage.input_tokens"] > 0
    assert attrs(chats[0])["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert attrs(chats[-1])["gen_ai.response.finish_reasons"] == ("stop",)
    read, write = tools
    assert attrs(read)["gen_ai.tool.name"] == "knowledge_lookup"
    assert attrs(write)["gen_ai.tool.name"] == "create_ticket"
    assert attrs(write)["gen_ai.operation.name"] == "execute_tool"
    assert attrs(write)["gen_ai.tool.call.id"]
    ledger = [e.name for s in named["switchboard.advance"] for e in s.events]
    assert ledger == ["ledger begin", "ledger finish"]
    assert attrs(agent)["switchboard.run.status"] == "completed"
    # the run's span: from its creation (just before it was asked) to its end
    assert abs(when(agent)[0] - when(ask)[0]) < 10**9 and when(agent)[1] >= when(chats[-1])[1]
    # no content by default, nor who asked
    for span in finished:
        keys = set(span.attributes or {})
        assert not keys & {
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
            "enduser.id",
        }
    assert "UALICE" not in every_value(finished)


def test_content_is_recorded_when_opted_in_and_never_a_credential(
    redis_conn, model_server, tickets_db, monkeypatch
):
    monkeypatch.setenv(tracing.CONTENT_SWITCH, "true")
    spans = InMemorySpanExporter()
    assert tracing.setup("test", exporter=spans, known_secrets=(API_KEY,), user_ids=True)
    try:
        run_with_read_and_approved_write(redis_conn, model_server)
    finally:
        tracing.shutdown()
    finished = spans.get_finished_spans()
    named = by_name(finished)
    first = json.loads(attrs(named["chat"][0])["gen_ai.input.messages"])
    assert first[-1]["role"] == "user" and "Django Fundamentals" in json.dumps(first)
    output = json.loads(attrs(named["chat"][-1])["gen_ai.output.messages"])
    assert output[0]["parts"][0]["content"] == "Filed ticket #1."
    read, write = named["execute_tool"]
    assert json.loads(attrs(read)["gen_ai.tool.call.arguments"]) == {"name": "Django Fundamentals"}
    assert "2999" in attrs(read)["gen_ai.tool.call.result"]
    assert json.loads(attrs(write)["gen_ai.tool.call.arguments"])["project"] == "IT"
    assert attrs(named["invoke_agent"][0])["enduser.id"] == "UALICE"
    assert attrs(named["switchboard.approval"][0])["switchboard.approval.decided_by"]
    text = every_value(finished)
    assert "[redacted]" in text
    assert SLACK_TOKEN not in text and API_KEY not in text
    assert "2222222222" not in text and "abcdefghijklmnop" not in text


def test_off_nothing_is_recorded_and_the_run_carries_no_trace(redis_conn, model_server, tickets_db):
    assert not tracing.enabled()
    model_server.route("fee of Python Basics", [LOOKUP, "INR 1999."])
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "What is the fee of Python Basics?", ALICE)
    work(rt)
    ended = rt.store.load(run.id)
    assert ended.status == RunStatus.COMPLETED and ended.trace == {}
    assert tracing.trace_id(ended.trace) == ""


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_traces_are_on_only_when_the_otel_environment_asks(environ, on):
    assert tracing.configured(environ) is on


def test_an_exporter_that_is_not_installed_leaves_tracing_off_and_says_why(monkeypatch):
    from structlog.testing import capture_logs

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin_json")
    with capture_logs() as logs:
        assert tracing.setup("test") is False
    assert not tracing.enabled()
    [line] = [entry for entry in logs if entry["event"] == "tracing_not_started"]
    assert "zipkin_json" in line["error"] and "not installed" in line["error"]


def test_otlp_over_http_is_the_default_protocol_and_grpc_needs_its_package(monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    environ = {"OTEL_TRACES_EXPORTER": "otlp"}
    [made] = tracing._exporters(environ)
    assert isinstance(made, OTLPSpanExporter)
    with pytest.raises(ValueError, match="otlp_proto_grpc"):
        tracing._exporters({**environ, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(ValueError, match="not supported"):
        tracing._exporters({**environ, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_the_trace_url_must_be_a_link_that_names_the_trace_id(monkeypatch):
    from pydantic import ValidationError

    from switchboard.settings import Config

    monkeypatch.setenv("SWITCHBOARD_TRACE_URL", "https://jaeger.example/trace/{trace_id}")
    assert Config().trace_url.endswith("{trace_id}")
    for bad in ("https://jaeger.example/search", "javascript:{trace_id}"):
        monkeypatch.setenv("SWITCHBOARD_TRACE_URL", bad)
        with pytest.raises(ValidationError, match="trace URL"):
            Config()


def test_the_run_view_links_the_trace_where_the_operator_shows_traces():
    from bot.render.views import run_modal
    from tests.support.slack_bot import texts
    from worker.run import Requester, Run
    from worker.service.runs import TraceRef

    trace = "0af7651916cd43dd8448eb211c80319c"
    run = Run(id="r1", question="q", requester=Requester(user_id="U1"))
    run.trace = {"traceparent": f"00-{trace}-b7ad6b7169203331-01", "parent": "00f067aa0ba902b7"}
    assert tracing.trace_id(run.trace) == trace
    linked = run_modal(run, [], trace=TraceRef(trace, f"https://jaeger.example/trace/{trace}"))
    assert f"<https://jaeger.example/trace/{trace}|{trace}>" in texts(linked["blocks"])
    assert trace not in texts(run_modal(run, [], trace=TraceRef(trace, ""))["blocks"])
