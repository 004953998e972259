"""Per-person limits: one person's burst waits in their own line; rate and spend are capped."""

from __future__ import annotations

import pytest

from tests.runtime_helpers import ALICE, make_runtime, work
from worker import service
from worker.budgets import PriceTable
from worker.limits import Limits
from worker.run import Requester, RunStatus

MALLORY = Requester(user_id="UMALLORY", team_id="T0001", channel_id="C0001", roles=["everyone"])


def test_a_burst_from_one_person_waits_in_their_line_not_ahead_of_others(redis_conn, model_server):
    model_server.route("burst", ["ok"])
    model_server.route("mine", ["yours"])
    rt = make_runtime(redis_conn, model_server.url, limits=Limits(runs_in_flight=2))
    burst = [service.submit(rt, f"burst {n}", MALLORY) for n in range(5)]
    alice = service.submit(rt, "mine, please", ALICE)
    # two of Mallory's five are queued; Alice's is next in the shared queue, not sixth
    queued = [rt.queue.fetch_job(j).args[0] for j in rt.queue.job_ids]
    assert queued == [burst[0].id, burst[1].id, alice.id]
    assert rt.limits.waiting(MALLORY.user_id) == 3
    assert "waiting_in_line" in [e.kind for e in rt.events.read(burst[4].id)]
    work(rt)  # each run that ends admits the next in its owner's line
    for run in [*burst, alice]:
        assert rt.store.load(run.id).status == RunStatus.COMPLETED
    assert rt.limits.waiting(MALLORY.user_id) == 0


def test_asking_faster_than_the_rate_is_refused_with_the_limit(redis_conn, model_server):
    rt = make_runtime(redis_conn, model_server.url, limits=Limits(runs_per_minute=3))
    for n in range(3):
        service.submit(rt, f"quick {n}", ALICE)
    with pytest.raises(service.QuestionRejected, match="limit is 3 a minute"):
        service.submit(rt, "one too many", ALICE)
    service.submit(rt, "someone else may still ask", MALLORY)


def test_the_days_spend_is_capped_per_person(redis_conn, model_server):
    model_server.route("pricey", ["expensive answer"])
    rt = make_runtime(redis_conn, model_server.url, limits=Limits(cost_per_day=0.01))
    rt.prices = PriceTable({"gpt-fake": (100_000.0, 100_000.0)})  # every call costs dollars
    run = service.submit(rt, "pricey question", ALICE)
    work(rt)
    assert rt.store.load(run.id).usage.cost > 0.01
    with pytest.raises(service.QuestionRejected, match="a day"):
        service.submit(rt, "pricey again", ALICE)
    service.submit(rt, "pricey for someone else", MALLORY)
