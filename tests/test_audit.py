"""Audit: `runs list` by channel, user, status and time (`--json`), every approval decision
as one log line, and `runs export` of whole trajectories (deciders included) as JSON Lines."""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from switchboard.cli import main
from tests.fakes.openai_server import Turn
from tests.support.runtime import ALICE, make_runtime, work
from worker import service
from worker.audit import (
    CHUNK,
    MAX_LIMIT,
    RunFilter,
    WhenError,
    export_runs,
    find_runs,
    parse_when,
)
from worker.jobs import expire
from worker.run import Requester, Run, RunStatus

CREATE = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Printer jam"})])
NOW = time.time()
HOUR = 3600.0


@pytest.fixture
def shell(monkeypatch, redis_url, model_server, tmp_path):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("OPENAI_BASE_URL", model_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("SWITCHBOARD_TICKETS_DB", str(tmp_path / "tickets.sqlite3"))
    for name in ("SWITCHBOARD_POLICY", "SWITCHBOARD_TOOLS", "SWITCHBOARD_MCP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def stored(rt, run_id, user, channel, status, hours_ago):
    run = Run(
        id=run_id,
        question=f"question {run_id}",
        requester=Requester(user_id=user, team_id="T1", channel_id=channel, roles=["everyone"]),
        status=status,
        created_at=NOW - hours_ago * HOUR,
        updated_at=NOW - hours_ago * HOUR,
    )
    rt.store.create(run, wake=False)
    return run


@pytest.fixture
def runs(redis_conn, model_server):
    """Five runs: who asked, where, how they ended, how long ago."""
    rt = make_runtime(redis_conn, model_server.url)
    done, partial = RunStatus.COMPLETED, RunStatus.PARTIAL
    stored(rt, "rfin_old", "UALICE", "CFINANCE", done, 72)
    stored(rt, "rfin_yday", "UALICE", "CFINANCE", done, 20)
    stored(rt, "rfin_bob", "UBOB", "CFINANCE", partial, 10)
    stored(rt, "rit_alice", "UALICE", "CIT", partial, 5)
    stored(rt, "rit_bob", "UBOB", "CIT", done, 1)
    return rt


def listed(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["runs", "list", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def ids(body: dict) -> list[str]:
    return [run["id"] for run in body["runs"]]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), ["rit_bob", "rit_alice", "rfin_bob", "rfin_yday", "rfin_old"]),
        (("--channel", "CFINANCE"), ["rfin_bob", "rfin_yday", "rfin_old"]),
        (("--user", "UALICE"), ["rit_alice", "rfin_yday", "rfin_old"]),
        (("--status", "partial"), ["rit_alice", "rfin_bob"]),
        (("--since", "24h"), ["rit_bob", "rit_alice", "rfin_bob", "rfin_yday"]),
        (("--until", "6h"), ["rfin_bob", "rfin_yday", "rfin_old"]),
        (("--channel", "CFINANCE", "--since", "1d", "--until", "15h"), ["rfin_yday"]),
        (("--user", "UBOB", "--status", "completed"), ["rit_bob"]),
        (("--status", "completed", "--since", "2d"), ["rit_bob", "rfin_yday"]),
        (("--channel", "CIT", "--user", "UALICE", "--status", "partial"), ["rit_alice"]),
        (("--channel", "CNONE"), []),
        (("--limit", "2"), ["rit_bob", "rit_alice"]),
    ],
)
def test_each_filter_of_runs_list(runs, shell, capsys, args, expected):
    assert ids(listed(capsys, *args)) == expected


def test_times_may_be_iso_8601(runs, shell, capsys):
    since = datetime.fromtimestamp(NOW - 21 * HOUR, UTC).isoformat()
    until = datetime.fromtimestamp(NOW - 9 * HOUR, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert ids(listed(capsys, "--since", since, "--until", until)) == ["rfin_bob", "rfin_yday"]


def test_the_json_shape_of_runs_list(runs, shell, capsys):
    body = listed(capsys, "--channel", "CIT", "--user", "UBOB")
    assert set(body) == {"runs", "count", "truncated", "skipped_unknown_schema"}
    assert (body["count"], body["truncated"], body["skipped_unknown_schema"]) == (1, False, 0)
    [run] = body["runs"]
    assert run == {
        "id": "rit_bob",
        "status": "completed",
        "reason": None,
        "user": "UBOB",
        "team": "T1",
        "channel": "CIT",
        "question": "question rit_bob",
        "created_at": datetime.fromtimestamp(NOW - HOUR, UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z"),
        "ended_at": None,
        "profile": None,
        "policy_version": None,
        "model": "",
        "steps": 0,
        "tool_calls": 0,
        "tokens": 0,
        "cost": 0.0,
    }


def test_bad_times_are_one_line_errors(runs, shell, capsys):
    assert main(["runs", "list", "--since", "yesterday"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "--since" in line and "ISO 8601" in line and "24h" in line
    assert main(["runs", "list", "--since", "1h", "--until", "2h"]) == 2
    assert "--since is after --until" in capsys.readouterr().err


def test_a_listing_reads_a_bounded_number_of_runs_and_says_so(runs):
    found = find_runs(runs.store, RunFilter(channel_id="CNONE"), max_scan=3)
    assert (found.runs, found.scanned, found.truncated) == ([], 3, True)
    found = find_runs(runs.store, RunFilter(), limit=10_000)
    assert len(found.runs) == 5 and not found.truncated
    assert MAX_LIMIT == 500  # what a --limit above it is cut to


def approved_run(rt, model_server):
    """A run whose write was approved by UALICE from the command line, and done."""
    model_server.route("Printer", [CREATE, "Filed ticket #1."])
    run = service.submit(rt, "Printer jam, file a ticket", ALICE)
    work(rt)
    approval = rt.store.load(run.id).pending_approvals[0]
    outcome = service.decide(
        rt,
        approval,
        decider_id="UALICE",
        decider_roles=frozenset({"everyone"}),
        approve=True,
        reason="yes, the printer on floor 2",
        surface="cli",
    )
    assert outcome.result == service.DecisionResult.DECIDED
    work(rt)
    return rt.store.load(run.id), approval


def test_export_writes_each_run_with_its_whole_trajectory_and_deciders(
    redis_conn, model_server, shell, tickets_db, capsys
):
    rt = make_runtime(redis_conn, model_server.url)
    stored(rt, "rtoo_old", "UBOB", "CIT", RunStatus.COMPLETED, 48)
    run, approval = approved_run(rt, model_server)
    assert run.status == RunStatus.COMPLETED
    capsys.readouterr()

    assert main(["runs", "export", "--since", "1d"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert captured.err.strip() == "exported 1 run"
    [entry] = [json.loads(line) for line in lines]
    assert entry["run"]["id"] == run.id and entry["run"]["answer"] == "Filed ticket #1."
    kinds = [e["kind"] for e in entry["events"]]
    assert kinds[0] == "run_created" and kinds[-1] == "run_completed"
    [decided] = [e for e in entry["events"] if e["kind"] == "approval_decided"]
    assert (decided["approval_id"], decided["by"], decided["status"]) == (
        approval,
        "UALICE",
        "approved",
    )
    assert "write_started" in kinds and "tool_result" in kinds

    assert main(["runs", "export", "--since", "3d", "--until", "1d"]) == 0
    [older] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert older["run"]["id"] == "rtoo_old"


def test_export_streams_every_run_once_in_pages_even_when_many_share_an_instant(
    redis_conn, model_server
):
    rt = make_runtime(redis_conn, model_server.url)
    for n in range(CHUNK * 2 + 50):  # three pages; the first 300 created in the same instant
        stored(rt, f"r{n:04d}", "UALICE", "CIT", RunStatus.COMPLETED, 2 if n < 300 else 1)
    exported = export_runs(rt.store, rt.events, NOW - 3 * HOUR)
    first = next(exported)  # a generator: nothing more is read until asked
    assert first["run"]["id"].startswith("r0")
    rest = [entry["run"]["id"] for entry in exported]
    all_ids = [first["run"]["id"], *rest]
    assert len(all_ids) == len(set(all_ids)) == CHUNK * 2 + 50


def test_every_decision_is_one_structured_log_line_without_arguments(
    redis_conn, model_server, tickets_db
):
    rt = make_runtime(redis_conn, model_server.url)
    with capture_logs() as logs:
        run, approval = approved_run(rt, model_server)
    [line] = [e for e in logs if e["event"] == "approval_decided"]
    assert line["approval_id"] == approval and line["run_id"] == run.id
    assert (line["tool"], line["requester"], line["decided_by"]) == (
        "create_ticket",
        "UALICE",
        "UALICE",
    )
    assert (line["outcome"], line["surface"], line["edited"]) == ("approved", "cli", False)
    assert abs(line["decided_at"] - time.time()) < 60
    assert line["policy_version"] == rt.policy.version
    text = json.dumps(line, default=str)
    assert "Printer jam" not in text and "floor 2" not in text  # no arguments, no reason


def test_an_expiry_is_logged_as_a_decision_nobody_made(redis_conn, model_server, tickets_db):
    rt = make_runtime(redis_conn, model_server.url)
    model_server.route("Printer", [CREATE, "It expired."])
    run = service.submit(rt, "Printer jam, file a ticket", ALICE)
    work(rt)
    approval = rt.store.load(run.id).pending_approvals[0]
    with capture_logs() as logs:
        assert expire(rt, approval) == "expired"
    [line] = [e for e in logs if e["event"] == "approval_decided"]
    assert (line["outcome"], line["surface"], line["decided_by"]) == ("expired", "expiry", None)


# -- the times people type ----------------------------------------------------------------


@given(st.text(max_size=200))
def test_any_text_is_a_time_or_a_one_line_error(text):
    try:
        stamp = parse_when(text, now=NOW)
    except WhenError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 300
    else:
        assert math.isfinite(stamp)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from("smhdw"))
def test_an_age_is_that_long_before_now(amount, unit):
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit] * amount
    if seconds > 20 * 366 * 86400:
        with pytest.raises(WhenError):
            parse_when(f"{amount}{unit}", now=NOW)
    else:
        assert parse_when(f"{amount}{unit}", now=NOW) == NOW - seconds


@given(
    st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
    st.integers(min_value=-14 * 60, max_value=14 * 60),
)
def test_an_iso_8601_time_means_that_instant_whatever_its_offset(moment, offset_minutes):
    shifted = moment.astimezone(__import__("datetime").timezone(timedelta(minutes=offset_minutes)))
    assert parse_when(shifted.isoformat()) == pytest.approx(moment.timestamp(), abs=1e-6)
    naive = moment.replace(tzinfo=None).isoformat()  # no offset: UTC
    assert parse_when(naive) == pytest.approx(moment.timestamp(), abs=1e-6)
    assert parse_when(moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")) == pytest.approx(
        moment.timestamp(), abs=1e-6
    )


@pytest.mark.slow
def test_an_export_read_only_in_part_ends_quietly(redis_conn, redis_url, model_server, tmp_path):
    import subprocess
    import sys

    from tests.support.processes import ROOT, worker_env

    rt = make_runtime(redis_conn, model_server.url)
    for n in range(400):  # far more than a pipe holds
        stored(rt, f"rpipe{n:04d}", "UALICE", "CIT", RunStatus.COMPLETED, 1)
    env = worker_env(redis_url, model_server.url, tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "runs", "export", "--since", "2h"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = json.loads(proc.stdout.readline())  # like `| head -1`
    proc.stdout.close()
    assert proc.wait(30) == 0
    assert first["run"]["id"].startswith("rpipe")
    assert b"Traceback" not in proc.stderr.read()
