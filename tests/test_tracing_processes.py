"""One trace per run across processes: the bot (this process, the real Bolt app over HTTP),
a worker process that takes the run to its approval and is stopped, and another that runs the
approved write; every process exports with the official OTLP/HTTP exporter to a local
receiver (tests/support/otlp_receiver.py)."""

from __future__ import annotations

import json

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from bot.render.blocks import APPROVE
from switchboard.cli import main
from tests.fakes.openai_server import Turn
from tests.fakes.slack_server import app_mention
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support.processes import WorkerProcess, worker_env
from tests.support.runtime import wait_until
from tests.support.slack_bot import ALICE, SUPPORT, TOKEN, bot_env, buttons, has_button
from worker import tracing
from worker.run import RunStatus

pytestmark = pytest.mark.slow

LOOKUP = Turn(tool_calls=[("knowledge_lookup", {"name": "Django Fundamentals"})])
CREATE = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Fee question"})])
QUESTION = "<@UBOT> what does Django Fundamentals cost? file a ticket about it"


def test_a_run_across_the_bot_and_two_worker_processes_is_one_nested_trace(
    redis_conn, redis_url, model_server, tickets_db, tmp_path, monkeypatch, capsys
):
    model_server.route("what does Django Fundamentals cost", [LOOKUP, CREATE, "Filed #1."])
    with OtlpReceiver() as receiver, bot_env(redis_conn, model_server.url, tmp_path) as env:
        exporter = OTLPSpanExporter(endpoint=receiver.url + "/v1/traces")
        assert tracing.setup("bot", exporter=exporter)
        process_env = worker_env(
            redis_url,
            model_server.url,
            tmp_path,
            SWITCHBOARD_POLICY=str(tmp_path / "policy.yaml"),
            SLACK_BOT_TOKEN=TOKEN,
            SLACK_API_URL=env.slack.url,
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_SERVICE_NAME="switchboard-worker",
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        try:
            first = WorkerProcess(process_env, tmp_path / "w1.log")  # it starts meanwhile
            env.event(app_mention(QUESTION, user=ALICE))
            [run] = env.wait_for_runs(1)
            try:
                wait_until(
                    lambda: env.rt.store.load(run.id).status == RunStatus.AWAITING_APPROVAL,
                    timeout=60,
                    what="the run to wait for its approval",
                )
                card = env.slack.wait_for_call("chat.postMessage", has_button(APPROVE))
            finally:
                first.stop()  # SIGTERM: it exports what it buffered on the way out
            second = WorkerProcess(process_env, tmp_path / "w2.log")  # the restart
            try:
                env.click(APPROVE, buttons(card["blocks"])[APPROVE], user=SUPPORT)
                wait_until(
                    lambda: env.rt.store.load(run.id).status.terminal,
                    timeout=60,
                    what="the run to end",
                )
            finally:
                second.stop()
            run = env.rt.store.load(run.id)
            assert run.status == RunStatus.COMPLETED, run.detail
        finally:
            tracing.shutdown()
        trace_id = tracing.trace_id(run.trace)
        spans = receiver.of_trace(trace_id)

    def one(name: str) -> ReceivedSpan:
        [found] = [s for s in spans if s.name == name]
        return found

    ids = {s.span_id: s for s in spans}
    request, ask = one("slack event_callback app_mention"), one("switchboard.ask")
    agent = one("invoke_agent switchboard")
    assert request.parent_id == "" and ask.parent_id == request.span_id
    assert agent.parent_id == ask.span_id
    assert agent.attributes["switchboard.run.status"] == "completed"
    advances = [s for s in spans if s.name == "switchboard.advance"]
    pids = {s.attributes["process.pid"] for s in advances}
    assert pids == {first.pid, second.pid}  # a worker each side of the approval
    assert all(s.parent_id == agent.span_id for s in advances)
    wait = one("switchboard.approval create_ticket")
    assert wait.parent_id == agent.span_id and wait.resource["switchboard.role"] == "bot"
    assert wait.attributes["switchboard.approval.decision"] == "approved"
    [click] = wait.links  # the click's own request, a trace of its own
    assert click[0] != trace_id
    assert wait.start_ns < wait.end_ns <= max(s.start_ns for s in advances)
    roles = {s.resource.get("switchboard.role") for s in spans}
    assert roles == {"bot", "worker"}

    chats = [s for s in spans if s.name == "chat gpt-fake"]
    tools = {s.attributes["gen_ai.tool.name"]: s for s in spans if s.name.startswith("execute")}
    assert len(chats) == 3 and set(tools) == {"knowledge_lookup", "create_ticket"}
    for span in [*chats, *tools.values()]:
        parent = ids[span.parent_id]
        assert parent.name == "switchboard.advance"
    assert {c.attributes["gen_ai.operation.name"] for c in chats} == {"chat"}
    assert all(c.attributes["gen_ai.usage.output_tokens"] > 0 for c in chats)
    assert [c.attributes["gen_ai.response.finish_reasons"] for c in chats] == [
        ("tool_calls",),
        ("tool_calls",),
        ("stop",),
    ]
    write = tools["create_ticket"]
    assert write.attributes["gen_ai.operation.name"] == "execute_tool"
    assert ids[write.parent_id].attributes["process.pid"] == second.pid
    assert ids[write.parent_id].events == ["ledger begin", "ledger finish"]
    everything = json.dumps([s.attributes for s in spans], default=str)
    assert "gen_ai.input.messages" not in everything and TOKEN not in everything

    # `switchboard runs show` names the trace, with the configured link
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("SWITCHBOARD_TRACE_URL", "https://jaeger.example/trace/{trace_id}")
    capsys.readouterr()
    assert main(["runs", "show", run.id]) == 0
    assert f"https://jaeger.example/trace/{trace_id}" in capsys.readouterr().out
