"""Prometheus metrics, scraped over real HTTP from `worker.metrics.serve` after real runs
(real Redis, RQ's SimpleWorker, the openai client against the fake model)."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.openai_server import Turn
from tests.support.redis_server import RedisServer
from tests.support.runtime import ALICE, approve_first, make_runtime, work
from tools.exceptions import OperatorError
from worker import metrics, service
from worker.run import RunStatus

CALCULATE = Turn(tool_calls=[("calculate", {"expression": "2 + 3"})])
CREATE = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "VPN is down"})])

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def served(redis_conn, model_server, tickets_db) -> Iterator[tuple[str, object]]:
    rt = make_runtime(redis_conn, model_server.url)
    server = metrics.serve(0, rt, host="127.0.0.1")
    yield f"http://127.0.0.1:{server.port}", rt
    server.stop()


def scrape(base: str) -> tuple[Samples, str]:
    status, content_type, text = get(base + "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    return parse(text), text


def test_after_a_completed_run_and_with_an_approval_pending_metrics_show_both(served, model_server):
    base, rt = served
    model_server.route("2 + 3", [CALCULATE, "It is 5."])
    model_server.route("VPN", [CREATE, "Filed the ticket."])
    before, _ = scrape(base)

    answered = service.submit(rt, "what is 2 + 3?", ALICE)
    asked = service.submit(rt, "the VPN is down, file a ticket", ALICE)
    queued, _ = scrape(base)
    assert value(queued, "switchboard_queue_depth") == 2  # LLEN rq:queue:switchboard

    work(rt)
    assert rt.store.load(answered.id).status == RunStatus.COMPLETED
    assert rt.store.load(asked.id).status == RunStatus.AWAITING_APPROVAL
    after, text = scrape(base)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("switchboard_runs_total", status="completed") == 1
    assert value(after, "switchboard_approvals_pending") == 1
    assert 0 <= value(after, "switchboard_approval_oldest_pending_seconds") < 60
    assert value(after, "switchboard_queue_depth") == 0
    assert value(after, "switchboard_runs_in_flight") == 0  # nothing held between jobs
    assert value(after, "switchboard_redis_up") == 1
    # three model calls: two for the sum, one proposing the ticket; every bucket is there
    assert grew("switchboard_model_call_seconds_count") == 3
    buckets = [k for k in after if k[0] == "switchboard_model_call_seconds_bucket"]
    assert {dict(labels)["le"] for _, labels in buckets} >= {"0.25", "1.0", "60.0", "+Inf"}
    assert value(after, "switchboard_model_call_seconds_bucket", le="+Inf") == value(
        after, "switchboard_model_call_seconds_count"
    )
    assert grew("switchboard_model_tokens_total", kind="prompt") > 0
    assert ("switchboard_cost_usd_total", frozenset()) in after
    assert grew("switchboard_tool_calls_total", tool="calculate", effect="read", outcome="ok") == 1
    # bounded labels: no user, run or approval ids anywhere in the exposition
    for unbounded in ("UALICE", answered.id, asked.id, *rt.store.load(asked.id).pending_approvals):
        assert unbounded not in text

    approve_first(rt, asked.id)
    work(rt)
    assert rt.store.load(asked.id).status == RunStatus.COMPLETED
    decided, _ = scrape(base)
    assert value(decided, "switchboard_approvals_pending") == 0
    assert value(decided, "switchboard_approval_oldest_pending_seconds") == 0
    assert value(decided, "switchboard_approval_decision_seconds_count") == 1 + value(
        after, "switchboard_approval_decision_seconds_count"
    )
    assert value(decided, "switchboard_runs_total", status="completed") == 2 + value(
        before, "switchboard_runs_total", status="completed"
    )
    ticket = {"tool": "create_ticket", "effect": "write", "outcome": "ok"}
    assert value(decided, "switchboard_tool_calls_total", **ticket) == 1 + value(
        after, "switchboard_tool_calls_total", **ticket
    )


def test_every_public_name_is_exposed_from_the_start(served):
    base, _rt = served
    metrics.observe_ack(0.02)  # what the bot records when it acknowledges Slack
    samples, text = scrape(base)
    names = {name for name, _ in samples}
    public = {
        "switchboard_runs_in_flight",
        "switchboard_queue_depth",
        "switchboard_approvals_pending",
        "switchboard_cost_usd_total",
        "switchboard_approval_decision_seconds_bucket",
        "switchboard_model_call_seconds_bucket",
        "switchboard_slack_ack_seconds_bucket",
    }
    assert public <= names
    for status in ("completed", "partial", "failed"):  # there before the first run ends
        assert ("switchboard_runs_total", frozenset({("status", status)})) in samples
    for kind in ("prompt", "completion"):
        assert ("switchboard_model_tokens_total", frozenset({("kind", kind)})) in samples
    assert "# TYPE switchboard_tool_calls_total counter" in text
    assert value(samples, "switchboard_slack_ack_seconds_bucket", le="0.025") >= 1
    assert "_created" not in text  # counters' start times are left out (half the series)


def test_without_redis_metrics_still_answer_and_only_readiness_fails(tmp_path, model_server):
    server = RedisServer(tmp_path / "redis").start()
    conn = redis.Redis.from_url(server.url)
    rt = make_runtime(conn, model_server.url)
    http = metrics.serve(0, rt, host="127.0.0.1")
    base = f"http://127.0.0.1:{http.port}"
    try:
        assert get(base + "/healthz")[0] == 200
        server.stop()

        samples, _ = scrape(base)
        assert value(samples, "switchboard_redis_up") == 0
        assert not any(name == "switchboard_queue_depth" for name, _ in samples)
        assert ("switchboard_runs_total", frozenset({("status", "completed")})) in samples
        status, _, said = get(base + "/healthz")
        assert status == 503 and re.match(r"redis: \w+", said)
        assert get(base + "/livez")[0] == 200  # liveness never depends on Redis
        assert get(base + "/nothing")[0] == 404
    finally:
        http.stop()
        server.stop()
        conn.close()


def test_a_taken_metrics_port_is_one_line_for_the_operator(served):
    base, rt = served
    port = int(base.rsplit(":", 1)[1])
    with pytest.raises(
        OperatorError, match=f"cannot serve metrics on port {port}: .*--metrics-port"
    ):
        metrics.serve(port, rt, host="127.0.0.1")
