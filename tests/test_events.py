"""The run event log: append-only, resumable by id, bounded."""

from __future__ import annotations

import threading

from worker import eventlog as events_module
from worker.eventlog import EventLog
from worker.events import EventKind


def test_events_resume_after_the_last_id_seen(redis_conn):
    log = EventLog(redis_conn)
    for n in range(5):
        log.append("r1", EventKind.MODEL_CALL, n=n)
    assert [e.id for e in log.read("r1")] == ["1", "2", "3", "4", "5"]
    assert [e.data["n"] for e in log.read("r1")] == [0, 1, 2, 3, 4]
    assert [e.data["n"] for e in log.read("r1", after="3")] == [3, 4]
    assert [e.id for e in log.read("r1", after="1", count=2)] == ["2", "3"]
    assert log.read("r1", after="5") == [] and log.read("nobody") == []


def test_wait_returns_new_events_or_nothing_after_the_timeout(redis_conn):
    log = EventLog(redis_conn)
    assert log.wait("r2", "0", block_ms=100) == []
    timer = threading.Timer(0.1, lambda: log.append("r2", EventKind.HANDED_BACK))
    timer.start()
    [event] = log.wait("r2", "0", block_ms=5000)
    assert event.kind == "handed_back" and event.id == "1"
    timer.join()


def test_a_runaway_log_is_capped(redis_conn, monkeypatch):
    monkeypatch.setattr(events_module, "MAX_EVENTS_PER_RUN", 3)
    log = EventLog(redis_conn)
    for n in range(5):
        log.append("r3", EventKind.MODEL_CALL, n=n)
    assert [e.data["n"] for e in log.read("r3")] == [0, 1, 2]


def test_a_held_runs_events_are_written_with_its_save_and_never_lost_on_release(redis_conn):
    from worker.run import Requester, Run
    from worker.store import RunStore

    store, log = RunStore(redis_conn), EventLog(redis_conn)
    run = Run(id="r4", question="q", requester=Requester(user_id="U1"))
    store.create(run)
    log.hold(run.id)
    log.append(run.id, EventKind.MODEL_CALL, step=1)
    log.append(run.id, EventKind.TOOL_RESULT, step=1)
    assert log.read(run.id) == []  # kept until the step is saved
    store.save(run, events=log.take(run.id))
    assert [e.kind for e in log.read(run.id)] == ["model_call", "tool_result"]
    log.append(run.id, EventKind.WRITE_STARTED)
    log.flush(run.id)  # on record at once
    log.append(run.id, EventKind.HANDED_BACK)
    log.release(run.id)  # what no save took is written when the run is let go
    log.append(run.id, EventKind.APPROVAL_DECIDED)  # not held any more: written at once
    kinds = [e.kind for e in log.read(run.id)]
    assert kinds == [
        "model_call",
        "tool_result",
        "write_started",
        "handed_back",
        "approval_decided",
    ]


def test_a_log_filled_by_a_save_or_a_model_calls_start_is_capped_and_said(redis_conn, monkeypatch):
    """The save and the script that reserves a model call write events too: a full log is
    trimmed there as by `append`, and said (`event_log_full`), not dropped in silence."""
    from structlog.testing import capture_logs

    from worker import limits as limits_module
    from worker import store as store_module
    from worker.limits import Limits, PersonLimits
    from worker.run import Requester, Run
    from worker.store import RunStore

    monkeypatch.setattr(store_module, "MAX_EVENTS_PER_RUN", 3)
    monkeypatch.setattr(limits_module, "MAX_EVENTS_PER_RUN", 3)
    store, log = RunStore(redis_conn), EventLog(redis_conn)
    limits = PersonLimits(redis_conn, "sb:", Limits(cost_per_day=5.0), stale=60)
    run = Run(id="r5", question="q", requester=Requester(user_id="U1"))
    store.create(run)
    encode = EventLog.encode
    with capture_logs() as said:
        store.save(run, events=[encode(EventKind.MODEL_CALL, n=n) for n in range(3)])
        assert not said  # exactly full is not over
        store.save(run, events=[encode(EventKind.MODEL_CALL, n=3)])
        assert [s["event"] for s in said] == ["event_log_full"] and said[0]["run_id"] == "r5"
        start = limits.begin_call(
            "U1", run.id, store.keys.events(run.id), [encode(EventKind.MODEL_CALL, n=4)]
        )
        assert start.over is None and start.reserved  # the call goes ahead all the same
        assert [s["event"] for s in said] == ["event_log_full"] * 2
    assert [e.data["n"] for e in log.read(run.id)] == [0, 1, 2]
