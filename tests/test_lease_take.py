"""Taking a run's job: its queued mark dropped and its lease taken in one round trip, with
what the holder reads first (issue 28)."""

from __future__ import annotations

import pytest

from tests.support.runtime import ALICE, make_runtime
from worker import service


@pytest.fixture
def submitted(redis_conn, model_server):
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "what does SQL Basics cost?", ALICE)
    job_id = redis_conn.get(rt.store.keys.queued(run.id)).decode()
    redis_conn.lpop(rt.queue.key)  # the job a worker took
    return rt, run, job_id


def test_the_taken_job_drops_its_mark_and_the_lease_comes_with_the_run(redis_conn, submitted):
    rt, run, job_id = submitted
    other = rt.leases.acquire(service.submit(rt, "and Python Basics?", ALICE).id)
    assert other is not None  # the script is loaded: what follows is what every take sends
    before = redis_conn.info("stats")
    lease = rt.leases.acquire(run.id, taken_job=job_id)
    after = redis_conn.info("stats")
    assert lease is not None
    assert redis_conn.get(rt.store.keys.queued(run.id)) is None
    assert redis_conn.get(rt.store.keys.lease(run.id)) == lease.token.encode()
    assert lease.document == redis_conn.get(rt.store.keys.run(run.id))
    assert float(lease.due_seen) == redis_conn.zscore(rt.store.keys.due, run.id)
    # one request: a script (its EVALSHA and the five commands it runs), and the INFO itself
    assert after["total_reads_processed"] - before["total_reads_processed"] == 1 + 1
    assert after["total_commands_processed"] - before["total_commands_processed"] == 6 + 1
    lease.release(lease.due_seen)
    other.release(other.due_seen)


def test_a_mark_naming_a_later_job_is_kept(redis_conn, submitted):
    rt, run, job_id = submitted
    redis_conn.set(rt.store.keys.queued(run.id), "a-later-job")
    lease = rt.leases.acquire(run.id, taken_job=job_id)
    assert lease is not None
    assert redis_conn.get(rt.store.keys.queued(run.id)) == b"a-later-job"
    lease.release(lease.due_seen)
    # a job whose id is not known ('') drops whichever mark there is
    lease = rt.leases.acquire(run.id, taken_job="")
    assert lease is not None
    assert redis_conn.get(rt.store.keys.queued(run.id)) is None
    lease.release(lease.due_seen)


def test_a_busy_run_still_loses_the_taken_jobs_mark(redis_conn, submitted):
    """Another worker holds the run: the job taken is spent all the same, so its mark goes
    (the holder looks again, woken), and nothing of the run is read."""
    rt, run, job_id = submitted
    holder = rt.leases.acquire(run.id)
    assert holder is not None
    assert redis_conn.get(rt.store.keys.queued(run.id)) == job_id.encode()  # not asked to
    assert rt.leases.acquire(run.id, taken_job=job_id) is None
    assert redis_conn.get(rt.store.keys.queued(run.id)) is None
    assert redis_conn.get(rt.store.keys.lease(run.id)) == holder.token.encode()
    holder.release(holder.due_seen)


def test_a_run_with_no_document_or_due_mark_is_leased_with_nothing_read(redis_conn, submitted):
    rt, run, _ = submitted
    redis_conn.delete(rt.store.keys.run(run.id))
    redis_conn.zrem(rt.store.keys.due, run.id)
    lease = rt.leases.acquire(run.id)
    assert lease is not None
    assert lease.document is None and lease.due_seen == ""
    lease.release("")
