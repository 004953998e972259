"""The run event log: append-only, resumable by id, bounded."""

from __future__ import annotations

import threading

from worker import events as events_module
from worker.events import EventLog


def test_events_resume_after_the_last_id_seen(redis_conn):
    log = EventLog(redis_conn)
    ids = [log.append("r1", "step", n=n) for n in range(5)]
    assert ids == ["1", "2", "3", "4", "5"]
    assert [e.data["n"] for e in log.read("r1")] == [0, 1, 2, 3, 4]
    assert [e.data["n"] for e in log.read("r1", after="3")] == [3, 4]
    assert [e.id for e in log.read("r1", after="1", count=2)] == ["2", "3"]
    assert log.read("r1", after="5") == [] and log.read("nobody") == []


def test_wait_returns_new_events_or_nothing_after_the_timeout(redis_conn):
    log = EventLog(redis_conn)
    assert log.wait("r2", "0", block_ms=100) == []
    timer = threading.Timer(0.1, lambda: log.append("r2", "late"))
    timer.start()
    [event] = log.wait("r2", "0", block_ms=5000)
    assert event.kind == "late" and event.id == "1"
    timer.join()


def test_a_runaway_log_is_capped(redis_conn, monkeypatch):
    monkeypatch.setattr(events_module, "MAX_EVENTS_PER_RUN", 3)
    log = EventLog(redis_conn)
    for n in range(5):
        log.append("r3", "step", n=n)
    assert [e.data["n"] for e in log.read("r3")] == [0, 1, 2]
