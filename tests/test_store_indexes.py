"""A run is in exactly one status index, whatever order its saves come in, and a save that keeps
the status does not touch the other indexes."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.eventlog import EventLog
from worker.events import EventKind
from worker.run import Requester, Run, RunStatus
from worker.store import RunStore


def indexes_holding(store: RunStore, run_id: str) -> set[RunStatus]:
    conn = store.redis
    return {s for s in RunStatus if conn.zscore(store.keys.status(s), run_id) is not None}


RUN_IDS = itertools.count()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.tuples(st.sampled_from(list(RunStatus)), st.booleans()), min_size=1, max_size=12)
)
def test_after_any_sequence_of_saves_the_run_is_in_its_status_index_alone(redis_conn, saves):
    # Each save from the object saved last, or from the run as loaded, or from its document
    # read without the store (which does not know the index the run is in).
    store = RunStore(redis_conn, retention=3600)
    run = Run(id=f"r-{next(RUN_IDS)}", question="q", requester=Requester(user_id="U1"))
    store.create(run)
    assert indexes_holding(store, run.id) == {RunStatus.QUEUED}
    for i, (status, reread) in enumerate(saves):
        if reread:
            raw = redis_conn.get(store.keys.run(run.id))
            run = store.load(run.id) if i % 2 else Run.from_json(raw)
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
    assert removals == 1  # a change of status leaves the index it was in, known here
    assert indexes_holding(store, run.id) == {RunStatus.COMPLETED}
    # a run read without the store does not know where it is indexed: it leaves every other
    unknown = Run.from_json(redis_conn.get(store.keys.run(run.id)))
    unknown.status = RunStatus.PARTIAL
    redis_conn.config_resetstat()
    store.save(unknown)
    assert redis_conn.info("commandstats")["cmdstat_zrem"]["calls"] == len(RunStatus) - 1
    assert indexes_holding(store, run.id) == {RunStatus.PARTIAL}


def test_the_run_and_its_log_keep_a_time_to_live_however_they_are_saved(redis_conn):
    store = RunStore(redis_conn, retention=3600)
    run = Run(id="r-ttl", question="q", requester=Requester(user_id="U1"))
    event = EventLog.encode(EventKind.RUN_CREATED, user="U1")
    store.create(run, events=[event])
    run.status = RunStatus.RUNNING
    store.save(run, events=[event])  # a change of status: both renewed
    redis_conn.expire(store.keys.run(run.id), 60)
    redis_conn.expire(store.keys.events(run.id), 60)
    store.save(run, events=[event])  # the same status: the run's renewed, the log's kept
    assert 3590 < redis_conn.ttl(store.keys.run(run.id)) <= 3600
    assert 0 < redis_conn.ttl(store.keys.events(run.id)) <= 60
    redis_conn.delete(store.keys.events(run.id))
    store.save(run, events=[event])  # a log begun by this save gets the run's time to live
    assert 3590 < redis_conn.ttl(store.keys.events(run.id)) <= 3600
    run.status = RunStatus.COMPLETED
    store.save(run)
    assert 3590 < redis_conn.ttl(store.keys.events(run.id)) <= 3600


def test_a_run_is_created_with_its_first_event_and_its_due_entry_in_one_transaction(redis_conn):
    """A Redis that fails half-way through creating a run leaves nothing or a run the sweeper
    finds: never a `queued` run with no due entry (found by the chaos soak)."""
    store = RunStore(redis_conn, retention=3600)
    run = Run(id="r-created", question="q", requester=Requester(user_id="U1"))
    first = EventLog.encode(EventKind.RUN_CREATED, user="U1")
    redis_conn.config_resetstat()
    store.create(run, events=[first])
    stats = redis_conn.info("commandstats")
    assert stats["cmdstat_multi"]["calls"] == stats["cmdstat_exec"]["calls"] == 1
    # the transaction's writes, TIME and ZSCORE inside the wake script, redis-py's SCRIPT EXISTS
    allowed = ("set", "zadd", "zremrangebyscore", "expire", "rpush", "evalsha", "time", "zscore")
    others = set(stats) - {"cmdstat_multi", "cmdstat_exec", "cmdstat_config", "cmdstat_script"}
    assert others <= {f"cmdstat_{name}" for name in allowed}, others
    assert redis_conn.zscore(store.keys.due, run.id) is not None
    assert [e.kind for e in EventLog(redis_conn).read(run.id)] == [EventKind.RUN_CREATED]
    assert 0 < redis_conn.ttl(store.keys.events(run.id)) <= 3600

    waiting = Run(id="r-in-line", question="q", requester=Requester(user_id="U1"))
    store.create(waiting, wake=False)  # waits in its person's line: not due until admitted
    assert redis_conn.zscore(store.keys.due, waiting.id) is None
