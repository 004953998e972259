"""A run is in exactly one status index, whatever order its saves come in, and a save that keeps
the status does not touch the other indexes."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.run import Requester, Run, RunStatus
from worker.store import RunStore


def indexes_holding(store: RunStore, run_id: str) -> set[RunStatus]:
    conn = store.redis
    return {s for s in RunStatus if conn.zscore(store.keys.status(s), run_id) is not None}


RUN_IDS = itertools.count()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from(list(RunStatus)), min_size=1, max_size=12))
def test_after_any_sequence_of_saves_the_run_is_in_its_status_index_alone(redis_conn, statuses):
    store = RunStore(redis_conn, retention=3600)
    run = Run(id=f"r-{next(RUN_IDS)}", question="q", requester=Requester(user_id="U1"))
    store.create(run)
    assert indexes_holding(store, run.id) == {RunStatus.QUEUED}
    for status in statuses:
        run.status = status
        store.save(run)
        assert indexes_holding(store, run.id) == {status}
        assert redis_conn.zscore(store.keys.status(status), run.id) == run.updated_at


def test_a_save_that_keeps_the_status_removes_from_no_index(redis_conn):
    store = RunStore(redis_conn, retention=3600)
    run = Run(id="r-steady", question="q", requester=Requester(user_id="U1"))
    store.create(run)
    run.status = RunStatus.RUNNING
    store.save(run)
    redis_conn.config_resetstat()
    for _ in range(5):
        store.save(run)
    stats = redis_conn.info("commandstats")
    assert "cmdstat_zrem" not in stats, stats.get("cmdstat_zrem")
    assert stats["cmdstat_zadd"]["calls"] == 5
    run.status = RunStatus.COMPLETED
    store.save(run)
    removals = redis_conn.info("commandstats")["cmdstat_zrem"]["calls"]
    assert removals == len(RunStatus) - 1  # a change of status leaves every other index
    assert indexes_holding(store, run.id) == {RunStatus.COMPLETED}
