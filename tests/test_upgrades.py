"""Upgrades: runs stored by another release (another `schema_version`) never break a
listing, `runs show` refuses them in one line, and older versions are migrated on read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from structlog.testing import capture_logs

from switchboard.cli import main
from tests.support.runtime import ALICE, make_runtime
from worker import service
from worker.jobs import UNKNOWN_SCHEMA, advance_run
from worker.run import MIGRATIONS, SCHEMA_VERSION, Run, RunSchemaError, RunStatus, migrate


@pytest.fixture
def cli_env(monkeypatch, redis_url, tmp_path, model_server):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("OPENAI_BASE_URL", model_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    monkeypatch.chdir(tmp_path)  # no .env file here


def store_future_run(rt, run_id: str = "rfuture1") -> str:
    """A run as a newer release (schema_version 2) would store it, in every index."""
    document = json.loads(Run(id=run_id, question="from the future", requester=ALICE).to_json())
    document.update(schema_version=2, renamed_field="a field this release does not know")
    pipe = rt.redis.pipeline()
    pipe.set(rt.store.keys.run(run_id), json.dumps(document))
    pipe.zadd(rt.store.keys.all_runs, {run_id: 9e12})  # newest of all
    pipe.zadd(rt.store.keys.user_runs(ALICE.user_id), {run_id: 9e12})
    pipe.zadd(rt.store.keys.status(RunStatus.QUEUED), {run_id: 9e12})
    pipe.execute()
    return run_id


def test_runs_list_works_with_a_schema_2_run_stored_and_says_one_was_left_out(
    redis_conn, model_server, cli_env, capsys
):
    rt = make_runtime(redis_conn, model_server.url)
    model_server.route("ordinary", ["fine"])
    ordinary = service.submit(rt, "an ordinary question", ALICE)
    store_future_run(rt)

    assert main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    assert ordinary.id in out
    assert "rfuture1" not in out
    assert "1 run of another schema version left out" in out


def test_runs_show_of_a_schema_2_run_answers_one_line(redis_conn, model_server, cli_env, capsys):
    rt = make_runtime(redis_conn, model_server.url)
    store_future_run(rt)

    assert main(["runs", "show", "rfuture1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert "rfuture1" in line and "schema_version 2" in line and "Traceback" not in line


def test_every_listing_skips_the_run_and_it_is_logged_once_per_process(redis_conn, model_server):
    rt = make_runtime(redis_conn, model_server.url)
    store_future_run(rt)
    store_future_run(rt, "rfuture2")
    with capture_logs() as logs:
        assert rt.store.recent() == []
        assert rt.store.recent(user_id=ALICE.user_id) == []
        assert rt.store.recent(status=RunStatus.QUEUED) == []  # App Home, uninstall, /switchboard
        assert rt.store.created_since(0) == []
    skipped = [e for e in logs if e["event"] == "run_schema_unknown_skipped"]
    assert len(skipped) == 1, skipped
    assert skipped[0]["schema_version"] == "2"
    assert rt.store.skipped_unknown == 8  # two runs, four listings


def test_an_older_worker_leaves_a_newer_run_untouched_and_due(redis_conn, model_server):
    rt = make_runtime(redis_conn, model_server.url)
    run_id = store_future_run(rt)
    before = redis_conn.get(rt.store.keys.run(run_id))
    assert rt.store.count_recovery(run_id) == 1  # the sweeper queued it for this worker

    assert advance_run(rt, run_id) == UNKNOWN_SCHEMA

    assert redis_conn.get(rt.store.keys.run(run_id)) == before
    assert redis_conn.zscore(rt.store.keys.due, run_id) is not None  # another worker may take it
    assert model_server.chat_requests == []
    # passed over, not stopped under: the sweeper's re-queues until a newer worker takes it
    # do not count towards ending it (worker/loop.py: MAX_RECOVERIES)
    assert not redis_conn.exists(rt.store.keys.recovered(run_id))


def _from_0(data: dict[str, Any]) -> dict[str, Any]:
    """A synthetic older format: the question was called `text`."""
    data["question"] = data.pop("text")
    data["schema_version"] = 1
    return data


def test_a_known_older_version_is_migrated_when_read(redis_conn, model_server, monkeypatch):
    # No release has stored another version yet, so the older document is synthetic.
    monkeypatch.setitem(MIGRATIONS, 0, _from_0)
    rt = make_runtime(redis_conn, model_server.url)
    document = json.loads(Run(id="rold", question="x", requester=ALICE).to_json())
    del document["question"]
    document.update(schema_version=0, text="asked under version 0")
    redis_conn.set(rt.store.keys.run("rold"), json.dumps(document))
    redis_conn.zadd(rt.store.keys.all_runs, {"rold": 1.0})

    run = rt.store.load("rold")
    assert (run.schema_version, run.question) == (SCHEMA_VERSION, "asked under version 0")
    assert [r.id for r in rt.store.recent()] == ["rold"]


def test_a_migration_must_advance_the_version_by_one():
    def stuck(data: dict[str, Any]) -> dict[str, Any]:
        return data

    with pytest.raises(RunSchemaError, match="produced 0, not 1"):
        migrate({"schema_version": 0}, {0: stuck})


def test_a_document_a_migration_cannot_read_is_skipped_like_an_unknown_version(
    redis_conn, model_server, monkeypatch
):
    monkeypatch.setitem(MIGRATIONS, 0, _from_0)  # expects `text`, which this one lacks
    rt = make_runtime(redis_conn, model_server.url)
    redis_conn.set(rt.store.keys.run("rodd"), json.dumps({"schema_version": 0, "id": "rodd"}))
    redis_conn.zadd(rt.store.keys.all_runs, {"rodd": 1.0})
    with pytest.raises(RunSchemaError, match="could not be migrated: KeyError"):
        rt.store.load("rodd")
    assert rt.store.recent() == [] and rt.store.skipped_unknown == 1


@pytest.mark.parametrize(
    ("version", "words"),
    [(2, "written by a newer version"), (0, "schema_version 0"), ("1", "'1'"), (True, "True")],
)
def test_a_version_without_a_migration_is_refused(version, words):
    with pytest.raises(RunSchemaError, match=words):
        migrate({"schema_version": version}, {})
