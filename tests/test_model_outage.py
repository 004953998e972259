"""A model outage is visible: counted by kind, logged as a warning naming the server (never
the key), alerted on by deploy/monitoring/alerts.yaml, and checked once at start-up."""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from switchboard import logs
from switchboard.startup import check_model
from tests.fakes.openai_server import Fault
from tests.support.processes import WorkerProcess, worker_env
from tests.support.promql import History, fires, samples_of
from tests.support.redis_server import free_port
from tests.support.runtime import ALICE, make_runtime, wait_until, work
from worker import metrics, service
from worker.run import EndReason, RunStatus

ALERTS = Path(__file__).resolve().parent.parent / "deploy" / "monitoring" / "alerts.yaml"


def rule(name: str) -> dict[str, Any]:
    [group] = yaml.safe_load(ALERTS.read_text())["groups"]
    [found] = [r for r in group["rules"] if r["alert"] == name]
    return found


def seconds(duration: str) -> float:
    return float(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


@pytest.fixture
def json_logs() -> Iterator[None]:
    logs.configure("json", logging.INFO)
    yield
    logs.configure("console", logging.INFO)


def said(err: str, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("event") == event]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def errors_of(text: str, kind: str) -> float:
    return samples_of(text).get(
        ("switchboard_model_errors_total", frozenset({("kind", kind)})), 0.0
    )


def unreachable_count() -> float:
    value = metrics.REGISTRY.get_sample_value(
        "switchboard_model_errors_total", {"kind": "unreachable"}
    )
    return value or 0.0


def test_an_unreachable_model_server_is_counted_logged_with_its_host_and_alerts(
    redis_conn, tickets_db, json_logs, capsys
):
    port = free_port()  # nothing listens there
    rt = make_runtime(redis_conn, f"http://127.0.0.1:{port}/v1", model_retries=0)
    served = metrics.serve(0, rt, host="127.0.0.1")
    try:
        before = scrape(served.port)
        run = service.submit(rt, "what is 2 + 3?", ALICE)
        work(rt)
        after = scrape(served.port)
    finally:
        served.stop()
    ended = rt.store.load(run.id)
    assert ended.status == RunStatus.PARTIAL and ended.reason == EndReason.MODEL_ERROR

    assert errors_of(after, "unreachable") == errors_of(before, "unreachable") + 1
    for kind in ("timeout", "rejected", "rate_limited"):  # every kind is exported from the start
        assert errors_of(after, kind) == errors_of(before, kind)

    err = capsys.readouterr().err
    [warning] = said(err, "model_call_failed")
    assert warning["level"] == "warning" and warning["kind"] == "unreachable"
    assert warning["server"] == f"127.0.0.1:{port}"
    assert "Bearer" not in err and '"test"' not in err  # the API key ("test") is never logged

    # The alert over these scrapes, a minute apart: the one before the outage, then the same
    # counters at each evaluation (nothing answered since). It needs `for:` to have passed.
    alert = rule("SwitchboardModelUnreachable")
    hold = seconds(alert["for"])
    outage: History = [(0.0, samples_of(before))] + [
        (60.0 * n, samples_of(after)) for n in range(1, int(hold // 60) + 2)
    ]
    assert fires(alert["expr"], outage, hold)
    quiet: History = [(60.0 * n, samples_of(before)) for n in range(len(outage))]
    assert not fires(alert["expr"], quiet, hold)


def test_the_unreachable_alert_stays_quiet_while_the_model_still_answers(
    redis_conn, model_server, tickets_db
):
    rt = make_runtime(redis_conn, model_server.url)
    model_server.route("2 + 3", ["It is 5."])
    served = metrics.serve(0, rt, host="127.0.0.1")
    try:
        before = scrape(served.port)
        service.submit(rt, "what is 2 + 3?", ALICE)
        work(rt)
        metrics.model_failed("unreachable")  # one failed call among answered ones
        after = scrape(served.port)
    finally:
        served.stop()
    history: History = [(0.0, samples_of(before))] + [
        (60.0 * n, samples_of(after)) for n in range(1, 5)
    ]
    assert not fires(rule("SwitchboardModelUnreachable")["expr"], history, 120)


def test_the_start_up_check_warns_naming_the_server_and_never_raises(
    redis_conn, model_server, tickets_db, json_logs, capsys
):
    assert check_model(make_runtime(redis_conn, model_server.url)) is True
    assert said(capsys.readouterr().err, "model_server_ok")

    model_server.models = ["gpt-other"]
    assert check_model(make_runtime(redis_conn, model_server.url)) is False
    [unknown] = said(capsys.readouterr().err, "model_not_listed")
    assert unknown["model"] == "gpt-fake" and unknown["level"] == "warning"

    port = free_port()
    before = unreachable_count()
    assert check_model(make_runtime(redis_conn, f"http://127.0.0.1:{port}/v1")) is False
    [failed] = said(capsys.readouterr().err, "model_server_check_failed")
    assert failed["server"] == f"127.0.0.1:{port}" and failed["kind"] == "unreachable"
    assert unreachable_count() == before + 1


@pytest.mark.slow
def test_a_worker_starts_with_its_model_server_down_and_says_so(
    redis_conn, redis_url, model_server, tmp_path
):
    port = free_port()
    log = tmp_path / "worker.log"
    worker = WorkerProcess(worker_env(redis_url, f"http://127.0.0.1:{port}/v1", tmp_path), log)
    try:
        wait_until(lambda: "worker_started" in log.read_text(), what="the worker's start")
    finally:
        worker.stop()
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    [failed] = [x for x in lines if x["event"] == "model_server_check_failed"]
    assert failed["level"] == "warning" and failed["server"] == f"127.0.0.1:{port}"


def test_a_rate_limited_model_is_counted_as_such_and_the_error_rate_alert_fires(
    redis_conn, model_server, tickets_db
):
    rt = make_runtime(redis_conn, model_server.url, model_retries=0)
    for n in range(3):
        model_server.route(f"limited [{n}]", [Fault.rate_limit()])
    served = metrics.serve(0, rt, host="127.0.0.1")
    try:
        before = scrape(served.port)
        for n in range(3):
            service.submit(rt, f"limited [{n}]: what is 2 + 3?", ALICE)
        work(rt)
        after = scrape(served.port)
    finally:
        served.stop()
    assert errors_of(after, "rate_limited") == errors_of(before, "rate_limited") + 3
    assert errors_of(after, "unreachable") == errors_of(before, "unreachable")
    alert = rule("SwitchboardModelErrors")
    hold = seconds(alert["for"])
    history: History = [(0.0, samples_of(before))] + [
        (60.0 * n, samples_of(after)) for n in range(1, int(hold // 60) + 2)
    ]
    assert fires(alert["expr"], history, hold)
    # an outage of rate limits is not "unreachable": that alert stays quiet
    assert not fires(rule("SwitchboardModelUnreachable")["expr"], history, hold)
