"""Nothing is kept forever: runs, their events and every index entry go with retention."""

from __future__ import annotations

from tests.support.runtime import wait_until
from worker.eventlog import EventLog
from worker.events import EventKind
from worker.run import Requester, Run, RunStatus
from worker.store import RunStore


def test_an_abandoned_run_and_every_index_entry_of_it_expire(redis_conn):
    store, events = RunStore(redis_conn, retention=1), EventLog(redis_conn)
    user = Requester(user_id="UGONE")
    run = Run(id="r-abandoned", question="q", requester=user)
    store.create(run)
    run.status = RunStatus.AWAITING_APPROVAL  # never decided, never advanced again
    events.append(run.id, EventKind.SUSPENDED)
    store.save(run)
    assert 0 < redis_conn.ttl(store.keys.run(run.id)) <= 1
    assert 0 < redis_conn.ttl(store.keys.user_runs(user.user_id)) <= 1
    wait_until(lambda: not redis_conn.exists(store.keys.run(run.id)), what="the run to expire")
    assert not redis_conn.exists(store.keys.events(run.id))
    store.trim_indexes()
    for status in RunStatus:
        assert redis_conn.zscore(store.keys.status(status), run.id) is None
    assert redis_conn.zscore(store.keys.all_runs, run.id) is None
    assert not redis_conn.exists(store.keys.user_runs(user.user_id))


def test_a_persons_index_is_trimmed_when_they_ask_again(redis_conn):
    store = RunStore(redis_conn, retention=3600)
    user = Requester(user_id="UREGULAR")
    old = Run(id="r-old", question="q", requester=user, created_at=1.0)
    store.create(old)
    new = Run(id="r-new", question="q", requester=user)
    store.create(new)
    assert redis_conn.zrange(store.keys.user_runs(user.user_id), 0, -1) == [b"r-new"]
