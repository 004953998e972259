"""A run is in exactly one status index, whatever order its saves come in, scored when it reached
its status; a save that keeps the status touches no index."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.runtime import ALICE, make_runtime
from worker import service
from worker.eventlog import EventLog
from worker.events import EventKind
from worker.limits import Limits, PersonLimits
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
    # Each save from the object saved last, or from the run as loaded again.
    store = RunStore(redis_conn, retention=3600)
    run = Run(id=f"r-{next(RUN_IDS)}", question="q", requester=Requester(user_id="U1"))
    store.create(run)
    assert indexes_holding(store, run.id) == {RunStatus.QUEUED}
    reached = redis_conn.zscore(store.keys.status(RunStatus.QUEUED), run.id)
    for status, reread in saves:
        if reread:
            run = store.load(run.id)
        changed = status != run.status
        run.status = status
        store.save(run)
        assert indexes_holding(store, run.id) == {status}
        reached = run.updated_at if changed else reached
        assert redis_conn.zscore(store.keys.status(status), run.id) == reached


def test_a_save_that_keeps_the_status_touches_no_index(redis_conn):
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
    assert "cmdstat_zadd" not in stats, stats.get("cmdstat_zadd")
    assert "cmdstat_expire" not in stats, stats.get("cmdstat_expire")
    run.status = RunStatus.COMPLETED
    store.save(run)
    removals = redis_conn.info("commandstats")["cmdstat_zrem"]["calls"]
    assert removals == 1  # a change of status leaves the index its stored document names
    assert indexes_holding(store, run.id) == {RunStatus.COMPLETED}


def test_a_change_of_status_leaves_the_index_the_stored_document_names(redis_conn):
    """The save reads the status the run had from its stored document, not from what the saving
    process remembers: a Redis that lost the last writes (a failover, a restart) rolled the
    document and its index back together, and the next save still leaves one index only."""
    store = RunStore(redis_conn, retention=3600)
    run = Run(id="r-rolled-back", question="q", requester=Requester(user_id="U1"))
    store.create(run)
    queued = redis_conn.get(store.keys.run(run.id))
    run.status = RunStatus.RUNNING
    store.save(run)
    # the lost write: the document and the index as they were before it
    redis_conn.set(store.keys.run(run.id), queued)
    redis_conn.zrem(store.keys.status(RunStatus.RUNNING), run.id)
    redis_conn.zadd(store.keys.status(RunStatus.QUEUED), {run.id: 1.0})
    run.status = RunStatus.AWAITING_APPROVAL  # the same object, which saw `running` saved
    store.save(run)
    assert indexes_holding(store, run.id) == {RunStatus.AWAITING_APPROVAL}
    # a document whose first bytes do not say its status: every other index is left
    redis_conn.set(store.keys.run(run.id), '{"id": "' + "x" * 300 + '", "status": "partial"}')
    redis_conn.zadd(store.keys.status(RunStatus.PARTIAL), {run.id: 1.0})
    run.status = RunStatus.COMPLETED
    redis_conn.config_resetstat()
    store.save(run)
    assert redis_conn.info("commandstats")["cmdstat_zrem"]["calls"] == len(RunStatus) - 1
    assert indexes_holding(store, run.id) == {RunStatus.COMPLETED}


def test_the_run_and_its_log_expire_retention_after_it_reached_its_status(redis_conn):
    """A change of status gives the document and its log the retention as their time to live;
    a save that keeps the status keeps theirs (a running run saves at every step); a log that
    had gone gets the document's again from the events that begin it."""
    store = RunStore(redis_conn, retention=3600)
    run = Run(id="r-ttl", question="q", requester=Requester(user_id="U1"))
    event = EventLog.encode(EventKind.RUN_CREATED, user="U1")
    store.create(run, events=[event])
    run.status = RunStatus.RUNNING
    redis_conn.expire(store.keys.run(run.id), 60)
    redis_conn.expire(store.keys.events(run.id), 60)
    store.save(run, events=[event])  # queued -> running
    assert 3590 < redis_conn.ttl(store.keys.run(run.id)) <= 3600
    assert 3590 < redis_conn.ttl(store.keys.events(run.id)) <= 3600
    for saved_with in ([event], []):  # the same status, with events and without
        redis_conn.expire(store.keys.run(run.id), 60)
        redis_conn.expire(store.keys.events(run.id), 60)
        store.save(run, events=saved_with)
        assert 50 < redis_conn.ttl(store.keys.run(run.id)) <= 60
        assert 50 < redis_conn.ttl(store.keys.events(run.id)) <= 60
    redis_conn.delete(store.keys.events(run.id))
    store.save(run, events=[event, event])  # a log begun by this save: never without an end
    assert 3590 < redis_conn.ttl(store.keys.events(run.id)) <= 3600
    assert redis_conn.llen(store.keys.events(run.id)) == 2
    redis_conn.delete(store.keys.run(run.id))  # a document gone: written whole, with its term
    store.save(run)
    assert 3590 < redis_conn.ttl(store.keys.run(run.id)) <= 3600
    assert indexes_holding(store, run.id) == {RunStatus.RUNNING}
    run.status = RunStatus.COMPLETED
    redis_conn.expire(store.keys.run(run.id), 60)
    redis_conn.expire(store.keys.events(run.id), 60)
    store.save(run)  # running -> completed, no events: both get the full term again
    assert 3590 < redis_conn.ttl(store.keys.run(run.id)) <= 3600
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
    # the transaction's writes only: a new run's due entry needs no wake script (nor the
    # SCRIPT EXISTS redis-py sends before one in a transaction)
    allowed = ("set", "zadd", "zremrangebyscore", "expire", "rpush")
    others = set(stats) - {"cmdstat_multi", "cmdstat_exec", "cmdstat_config"}
    assert others <= {f"cmdstat_{name}" for name in allowed}, others
    assert redis_conn.zscore(store.keys.due, run.id) is not None
    assert [e.kind for e in EventLog(redis_conn).read(run.id)] == [EventKind.RUN_CREATED]
    assert 0 < redis_conn.ttl(store.keys.events(run.id)) <= 3600

    waiting = Run(id="r-in-line", question="q", requester=Requester(user_id="U1"))
    store.create(waiting, wake=False)  # waits in its person's line: not due until admitted
    assert redis_conn.zscore(store.keys.due, waiting.id) is None


def test_an_admitted_question_is_stored_and_queued_in_one_transaction(redis_conn, model_server):
    """The run and its job: neither is written without the other (issue 28: one round trip
    and a MULTI/EXEC fewer a run)."""
    rt = make_runtime(redis_conn, model_server.url, limits=Limits(runs_in_flight=3))
    redis_conn.config_resetstat()
    run = service.submit(rt, "what does SQL Basics cost?", ALICE)
    stats = redis_conn.info("commandstats")
    assert stats["cmdstat_multi"]["calls"] == stats["cmdstat_exec"]["calls"] == 1
    [job] = rt.queue.get_jobs()
    assert job.args == [run.id] and job.func_name == "worker.jobs.advance"
    assert redis_conn.get(rt.store.keys.queued(run.id)) == job.id.encode()
    assert redis_conn.zscore(rt.store.keys.due, run.id) is not None


def test_a_log_begun_again_outside_a_save_gets_its_time_to_live(redis_conn):
    """A run's log that went while the run stayed (evicted, deleted) is begun again by the next
    write: an event appended outside a save or a model call's start gives it the retention as
    its time to live, as a save does, so it is not kept for good (a save that keeps the status
    leaves the time to live alone). A write to a log that has one leaves it as it is."""
    store = RunStore(redis_conn, retention=3600)
    log = EventLog(redis_conn, retention=3600)
    limits = PersonLimits(redis_conn, "sb:", Limits(), stale=60)
    run = Run(id="r-log-again", question="q", requester=Requester(user_id="U1"))
    store.create(run)
    key = store.keys.events(run.id)
    event = EventLog.encode(EventKind.MODEL_CALL_STARTED, step=1)
    redis_conn.delete(key)
    log.append(run.id, EventKind.APPROVAL_DECIDED, approval_id="ap1")
    assert 3590 < redis_conn.ttl(key) <= 3600
    redis_conn.delete(key)
    assert limits.begin_call("U1", run.id, key, [event], log_ttl=3600).over is None
    assert 3590 < redis_conn.ttl(key) <= 3600
    redis_conn.expire(key, 60)
    log.append(run.id, EventKind.APPROVAL_DECIDED, approval_id="ap2")
    limits.begin_call("U1", run.id, key, [event], log_ttl=3600)
    assert 50 < redis_conn.ttl(key) <= 60
    assert redis_conn.llen(key) == 3
