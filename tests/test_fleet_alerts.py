"""The fleet's health in metrics and in the alert rules: workers alive by heartbeat, a queue
with no live worker, Redis unreachable also when every target is down, build info and the
runs' working time. Rules are evaluated over real scrapes (tests/support/promql.py)."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
import yaml
from rq.utils import utcformat

from switchboard import redisconn
from tests.support.promql import History, fires, samples_of, selectors
from tests.support.redis_server import RedisServer
from tests.support.runtime import ALICE, make_runtime, wait_until, work
from worker import metrics, service
from worker.fleet import FRESH_SECONDS, judge, read_fleet
from worker.process import Slot, unblock_idle_slots
from worker.runtime import Runtime

ALERTS = Path(__file__).resolve().parent.parent / "deploy" / "monitoring" / "alerts.yaml"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def rule(name: str) -> dict[str, Any]:
    [group] = yaml.safe_load(ALERTS.read_text())["groups"]
    [found] = [r for r in group["rules"] if r["alert"] == name]
    return found


def seconds(duration: str) -> float:
    return float(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


def scrape(rt: Runtime) -> str:
    server = metrics.serve(0, rt, host="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())
    finally:
        server.stop()


def steady(text: str, minutes: int) -> History:
    """The same scraped state at every minute for `minutes` (what a rule's `for:` needs)."""
    return [(60.0 * n, samples_of(text)) for n in range(minutes + 1)]


def ago(s: float) -> str:
    return utcformat(NOW - timedelta(seconds=s))


def test_a_slot_is_live_by_a_fresh_heartbeat_or_a_job_in_hand():
    fleet = judge(
        [
            ("host.10.0", ago(5), "idle"),
            ("host.10.1", ago(FRESH_SECONDS + 60), "busy"),  # busy slots do not heartbeat
            ("host.11.0", ago(FRESH_SECONDS + 1), "idle"),  # killed: registered, silent
            ("host.12.0", "", "idle"),
            ("other.10.0", "not a time", "idle"),
        ],
        NOW,
    )
    assert (fleet.processes, fleet.slots, fleet.busy) == (1, 2, 1)
    assert not judge([], NOW).alive


def run_slots(rt: Runtime, count: int) -> list[Slot]:
    slots = [Slot(rt, i, burst=False) for i in range(count)]
    for slot in slots:
        slot.start()
    wait_until(lambda: read_fleet(rt.redis, rt.queue.name).slots == count, what="live slots")
    return slots


def stop_slots(rt: Runtime, slots: list[Slot]) -> None:
    """Every slot ended before the runtime may take jobs again: a slot that began its
    blocking dequeue just after `unblock_idle_slots` read the client list would otherwise
    wait there, outlive the test, and take a later test's jobs (one Redis per xdist worker)."""
    rt.stopping.set()
    for slot in slots:
        slot.request_stop()

    def all_ended() -> bool:
        unblock_idle_slots(rt)
        return not any(slot.alive for slot in slots)

    wait_until(all_ended, what="every slot ended")
    for slot in slots:
        slot.worker.register_death()
    rt.stopping.clear()


def test_jobs_waiting_with_no_live_worker_alert_however_few(
    redis_conn, redis_url, model_server, tickets_db
):
    # connected as a process is (its connections named after it, so its slots can be woken)
    rt = make_runtime(redisconn.connect(redis_url), model_server.url)
    model_server.route("2 + 3", ["It is 5."])
    alert = rule("SwitchboardNoLiveWorker")
    hold = seconds(alert["for"])
    idle = scrape(rt)
    assert not fires(alert["expr"], steady(idle, 3), hold)  # nothing waits: quiet

    service.submit(rt, "what is 2 + 3?", ALICE)  # one job, no worker
    stuck = scrape(rt)
    assert samples_of(stuck)[("switchboard_queue_depth", frozenset())] == 1
    assert samples_of(stuck)[("switchboard_workers_alive", frozenset())] == 0
    assert fires(alert["expr"], steady(stuck, 3), hold)

    slots = run_slots(rt, 2)  # a live worker (it takes the job and answers it)
    try:
        live = scrape(rt)
    finally:
        stop_slots(rt, slots)
        rt.redis.close()
    assert samples_of(live)[("switchboard_workers_alive", frozenset())] == 1
    assert not fires(alert["expr"], steady(live, 3), hold)
    # and the same state with the job still waiting but a worker alive: quiet too
    waiting_but_served = samples_of(live) | {("switchboard_queue_depth", frozenset()): 5.0}
    assert not fires(alert["expr"], [(60.0 * n, waiting_but_served) for n in range(4)], hold)


def test_redis_unreachable_fires_when_redis_is_down_and_when_no_target_reports(
    tmp_path, model_server, tickets_db
):
    alert = rule("SwitchboardRedisUnreachable")
    hold = seconds(alert["for"])
    server = RedisServer(tmp_path / "redis").start()
    conn = redis.Redis.from_url(server.url)
    try:
        rt = make_runtime(conn, model_server.url)
        healthy = scrape(rt)
        server.stop()
        cut_off = scrape(rt)
    finally:
        server.stop()
        conn.close()
    assert not fires(alert["expr"], steady(healthy, 3), hold)
    assert fires(alert["expr"], steady(cut_off, 3), hold)
    every_target_down: History = [(60.0 * n, {}) for n in range(4)]  # no sample at all
    assert fires(alert["expr"], every_target_down, hold)


def test_alert_selectors_name_exported_series_and_labels(redis_conn, model_server, tickets_db):
    """Each selector of each rule names a series the code exports, and only its labels."""
    exposition = scrape(make_runtime(redis_conn, model_server.url))
    exported: dict[str, set[str]] = {}
    for name, labels in samples_of(exposition):
        exported.setdefault(name, set()).update(k for k, _ in labels)
    [group] = yaml.safe_load(ALERTS.read_text())["groups"]
    for r in group["rules"]:
        for name, matchers in selectors(r["expr"]):
            assert name in exported, (r["alert"], name)
            for label, _op, _value in matchers:
                assert label in exported[name], (r["alert"], name, label)


def test_build_info_and_run_working_time_are_exported(redis_conn, model_server, tickets_db):
    rt = make_runtime(redis_conn, model_server.url)
    model_server.route("2 + 3", ["It is 5."])
    before = samples_of(scrape(rt))
    service.submit(rt, "what is 2 + 3?", ALICE)
    work(rt)
    after = samples_of(scrape(rt))
    count = ("switchboard_run_duration_seconds_count", frozenset({("status", "completed")}))
    assert after[count] == before.get(count, 0) + 1
    [info] = [labels for name, labels in after if name == "switchboard_build_info"]
    assert dict(info)["version"] and dict(info)["python"].count(".") == 2
