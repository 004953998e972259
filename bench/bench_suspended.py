"""Suspended runs: 10,000 runs awaiting approval — Redis memory, workers held, resume latency.

Each run asks to file a ticket: the fake model proposes `create_ticket` (a write), the worker
creates the approval request, schedules its expiry job and suspends the run. All 10,000 go
through the real loop: this process submits them (service.submit, as the bot does) and two
`python -m switchboard worker` processes (env as tests/support/processes.worker_env, production
lease/sweep timers) take each as far as the approval.

1. Redis memory per suspended run: INFO used_memory after minus before, / N. Reported twice:
   right after the last run suspended, and at steady state — without the records of the
   finished `advance` jobs, which RQ keeps for result_ttl=60 s (removed here the way their
   TTL would). A breakdown by key (MEMORY USAGE on a sample) shows where the bytes are.
   Baseline ratio: the same measurement for a bare RQ job parked with enqueue_in (what
   merely keeping one piece of deferred work in RQ costs).
2. Workers held while the runs wait: jobs in StartedJobRegistry, run lease keys, and workers
   RQ reports busy — target 0.
3. Resume latency with idle workers: 200 approvals decided one at a time (service.decide, as
   the Slack button does); latency = the approval's decided_at (Redis TIME, in the decision
   script) to the `at` of the run's `write_started` event (the approved tool starting, in a
   worker). Each run finishes before the next decision. Baseline: raw RQ enqueue -> job start
   (job.started_at) of a no-op job on the same idle workers and queue. Target p99 <= 100 ms.

    python bench/bench_suspended.py              # 10,000 suspended runs, 200 decisions
    python bench/bench_suspended.py -n 1000      # quicker; per-run bytes scale linearly
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

import common
import redis
from common import TICKET_QUESTION, FakeModelProcess, median, percentile, row
from rq import Queue, Worker
from rq.job import Job
from rq.registry import FinishedJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from tests.support.runtime import ALICE, make_runtime
from worker import service
from worker.events import EventKind, is_run_end
from worker.run import RunStatus
from worker.runtime import Runtime

TARGET_BYTES = 8 * 1024
TARGET_P99_MS = 100.0
TARGET_HELD = 0


def suspend_runs(rt: Runtime, n: int) -> tuple[list[str], float]:
    """Submit n ticket requests and wait until every one awaits approval. Returns ids, seconds."""
    waiting = rt.store.keys.status(RunStatus.AWAITING_APPROVAL)
    already = rt.redis.zcard(waiting)
    started = time.perf_counter()
    ids: list[str] = []
    for i in range(n):
        ids.append(service.submit(rt, TICKET_QUESTION, ALICE).id)
        if i % 2000 == 1999:
            print(
                f"   ... submitted {i + 1:,}, suspended {rt.redis.zcard(waiting) - already:,}",
                flush=True,
            )
    common.wait_until(lambda: rt.redis.zcard(waiting) - already >= n, 600, f"{n} suspended runs")
    seconds = time.perf_counter() - started
    common.wait_until(lambda: rt.queue.count == 0 and _busy(rt) == 0, 60, "idle workers")
    for chunk in range(0, n, 1000):
        scores = rt.redis.zmscore(waiting, ids[chunk : chunk + 1000])
        if any(s is None for s in scores):
            raise RuntimeError("some runs did not suspend (see the worker logs)")
    return ids, seconds


def _busy(rt: Runtime) -> int:
    return sum(1 for w in Worker.all(queue=rt.queue) if w.get_state() == "busy")


def drop_finished_job_records(rt: Runtime) -> int:
    """Delete what RQ keeps of finished jobs for result_ttl (60 s): as their expiry would."""
    registry = FinishedJobRegistry(queue=rt.queue)
    ids = registry.get_job_ids()
    pipe = rt.redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.delete(f"rq:job:{job_id}", f"rq:results:{job_id}")
    pipe.delete(registry.key)
    pipe.execute()
    return len(ids)


def by_shape(conn: redis.Redis) -> dict[str, tuple[int, int]]:
    """Every key in the database grouped by shape (ids replaced by *): shape -> (keys, bytes
    by MEMORY USAGE)."""
    sizes: dict[str, tuple[int, int]] = {}
    keys = [k.decode() for k in conn.scan_iter(count=2000)]
    for start in range(0, len(keys), 2000):
        chunk = keys[start : start + 2000]
        pipe = conn.pipeline(transaction=False)
        for key in chunk:
            pipe.memory_usage(key, samples=0)
        for key, size in zip(chunk, pipe.execute(), strict=True):
            count, total = sizes.get(_shape(key), (0, 0))
            sizes[_shape(key)] = (count + 1, total + int(size or 0))
    return sizes


def breakdown(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], n: int
) -> list[tuple[str, int, float]]:
    """What the n runs added, by key shape: (shape, keys added, bytes per run), largest first."""
    rows = []
    for shape, (count, total) in after.items():
        count0, total0 = before.get(shape, (0, 0))
        rows.append((shape, count - count0, (total - total0) / n))
    return sorted(rows, key=lambda r: -r[2])


_IDS = re.compile(r"(r[0-9a-f]{12,}|ap_[0-9a-f]{8,}|[0-9a-f]{8}-[0-9a-f-]{27}|[0-9a-f]{32})")


def _shape(key: str) -> str:
    return _IDS.sub("*", key)


def payload_bytes(rt: Runtime, run_id: str) -> int:
    """The data itself: run JSON, event bodies, approval fields, expiry job fields."""
    run = rt.store.load(run_id)
    approval = run.pending_approvals[0]
    size = len(rt.redis.get(rt.store.keys.run(run_id)) or b"")
    size += sum(len(json.dumps(e.data)) + 40 for e in rt.events.read(run_id))
    size += sum(
        len(k) + len(v) for k, v in rt.redis.hgetall(rt.approvals.keys.approval(approval)).items()
    )
    size += sum(
        len(k) + len(v) for k, v in rt.redis.hgetall(f"rq:job:{rt.expiry_job_id(approval)}").items()
    )
    return size


def rq_parked_job_bytes(conn: redis.Redis, n: int) -> float:
    """Baseline: used_memory per bare RQ job parked with enqueue_in a day ahead, carrying the
    question as its argument (then deleted again)."""
    from datetime import timedelta

    queue = Queue("bench-parked", connection=conn, serializer=JSONSerializer)
    before = common.used_memory(conn)
    for i in range(n):
        queue.enqueue_in(
            timedelta(days=1),
            "bench.common.noop",
            TICKET_QUESTION,
            job_id=f"parked-{i}",
            result_ttl=60,
        )
    after = common.used_memory(conn)
    conn.delete(*[f"rq:job:parked-{i}" for i in range(n)], "rq:scheduled:bench-parked")
    return (after - before) / n


def held(rt: Runtime) -> dict[str, int]:
    leases = sum(
        1 for _ in rt.redis.scan_iter(match=f"{rt.settings.namespace}run:*:lease", count=1000)
    )
    return {
        "StartedJobRegistry jobs": StartedJobRegistry(queue=rt.queue).count,
        "run lease keys": leases,
        "busy workers": _busy(rt),
        "queued jobs": rt.queue.count,
    }


def resume_latencies(rt: Runtime, ids: list[str], decisions: int) -> list[float]:
    """Approve `decisions` requests one by one; ms from decided_at to write_started.at."""
    latencies: list[float] = []
    for run_id in ids[:decisions]:
        run = rt.store.load(run_id)
        approval = run.pending_approvals[0]
        last = rt.events.read(run_id)[-1].id
        outcome = service.decide(
            rt,
            approval,
            decider_id=ALICE.user_id,
            decider_roles=frozenset(ALICE.roles),
            approve=True,
        )
        assert outcome.result == service.DecisionResult.DECIDED, outcome
        started_at = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # follow the run's events until it ends
            for event in rt.events.wait(run_id, last, 5000):
                last = event.id
                if event.kind == EventKind.WRITE_STARTED:
                    started_at = event.at
                if is_run_end(event.kind):
                    deadline = 0
        if started_at is None:
            raise RuntimeError(f"run {run_id}: no write_started event after the approval")
        decided_at = rt.approvals.get(approval).decided_at
        latencies.append((started_at - decided_at) * 1000)
        common.wait_until(lambda: rt.queue.count == 0 and _busy(rt) == 0, 30, "idle workers")
    return latencies


def rq_start_latencies(rt: Runtime, n: int) -> list[float]:
    """Baseline: enqueue a no-op on the same queue and idle workers; ms to job.started_at."""
    latencies: list[float] = []
    for _ in range(n):
        enqueued = time.time()
        job_id = rt.queue.enqueue_call("bench.common.noop", result_ttl=60).id

        def finished(job_id: str = job_id) -> bool:
            return Job.fetch(job_id, connection=rt.redis, serializer=JSONSerializer).is_finished

        common.wait_until(finished, 30, "no-op job")
        job = Job.fetch(job_id, connection=rt.redis, serializer=JSONSerializer)
        assert job.started_at is not None
        latencies.append((job.started_at.timestamp() - enqueued) * 1000)
        common.wait_until(lambda: _busy(rt) == 0, 30, "idle workers")
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10_000, help="runs to suspend")
    parser.add_argument("--decisions", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    common.banner(f"bench_suspended: {args.n:,} runs awaiting approval")
    common.quiet_switchboard_logs()
    figures: dict[str, Any] = {}
    with common.workdir("bench-suspended-") as tmp, common.redis_server(tmp) as url:
        fake = FakeModelProcess(validate=False)
        conn = redis.Redis.from_url(url)
        rt = make_runtime(conn, fake.url)
        workers = common.switchboard_workers(args.workers, url, fake.url, tmp)
        try:
            common.wait_for_workers(conn, rt.queue.name, args.workers)
            # warm the workers (imports, BM25 index, connections) and the Redis structures
            warm, _ = suspend_runs(rt, 20)
            for run_id in warm:
                service.cancel(rt, run_id, by=ALICE.user_id, roles=frozenset(ALICE.roles))
            common.wait_until(lambda: rt.queue.count == 0 and _busy(rt) == 0, 60, "warm-up")
            drop_finished_job_records(rt)
            baseline_parked = rq_parked_job_bytes(conn, 1000)

            shapes_before = by_shape(conn)
            before = common.used_memory(conn)
            ids, seconds = suspend_runs(rt, args.n)
            after_all = common.used_memory(conn)
            dropped = drop_finished_job_records(rt)
            steady = common.used_memory(conn)
            per_run_now = (after_all - before) / args.n
            per_run = (steady - before) / args.n
            parts = breakdown(shapes_before, by_shape(conn), args.n)
            payload = median([payload_bytes(rt, i) for i in ids[:: max(1, args.n // 50)]])
            row(
                "runs suspended through the real loop",
                f"{args.n:,} in {seconds:.1f} s with {args.workers} worker processes "
                f"({args.n / seconds:.0f}/s)",
            )
            row(
                "Redis bytes per suspended run, right after",
                f"{per_run_now:8.0f} B  (incl. {dropped:,} finished-job records kept 60 s)",
            )
            row(
                "Redis bytes per suspended run, steady",
                f"{per_run:8.0f} B = {per_run / 1024:.2f} KiB   target <= 8 KiB",
            )
            shown = 0.0
            for shape, count, size in parts:
                if size >= 20:
                    keys = f"+{count:,} keys" if count > 1 else "one key"
                    row(f"  {shape} ({keys})", f"{size:8.0f} B")
                    shown += size
            row("  the rest (allocator, dictionaries)", f"{per_run - shown:8.0f} B")
            row("the data itself (JSON, fields), median run", f"{payload:8.0f} B")
            row("baseline: an RQ job parked with enqueue_in", f"{baseline_parked:8.0f} B")
            row("ratio suspended run / parked RQ job", f"{per_run / baseline_parked:5.2f}x")
            figures["memory"] = {
                "bytes_per_run": per_run,
                "bytes_per_run_before_result_ttl": per_run_now,
                "parked_rq_job_bytes": baseline_parked,
                "ratio_vs_parked_rq_job": per_run / baseline_parked,
                "breakdown": {shape: size for shape, _, size in parts},
            }

            holding = held(rt)
            for label, count in holding.items():
                row(f"held while suspended: {label}", f"{count}")
            figures["held"] = holding
            workers_held = holding["StartedJobRegistry jobs"] + holding["run lease keys"]

            lat = resume_latencies(rt, ids, args.decisions)
            base = rq_start_latencies(rt, args.decisions)
            p50, p99 = percentile(lat, 50), percentile(lat, 99)
            b50, b99 = percentile(base, 50), percentile(base, 99)
            row(
                f"resume latency, {args.decisions} decisions",
                f"p50 {p50:6.1f} ms   p99 {p99:6.1f} ms   max {max(lat):.1f} ms",
            )
            row("baseline: raw RQ enqueue -> job start", f"p50 {b50:6.1f} ms   p99 {b99:6.1f} ms")
            row("ratio resume / raw RQ start", f"p50 {p50 / b50:5.1f}x   p99 {p99 / b99:5.1f}x")
            figures["resume_ms"] = {"p50": p50, "p99": p99, "rq_p50": b50, "rq_p99": b99}
            still = conn.zcard(rt.store.keys.status(RunStatus.AWAITING_APPROVAL))
            scheduled = ScheduledJobRegistry(queue=rt.queue).count
            row("runs still awaiting approval", f"{still:,} (scheduled expiry jobs: {scheduled:,})")
        finally:
            for w in workers:
                w.stop()
            fake.stop()
    print(
        f"RESULT suspended: {per_run / 1024:.2f} KiB/run = {per_run / baseline_parked:.2f}x a "
        f"parked RQ job (target <= 8 KiB: {common.verdict(per_run <= TARGET_BYTES)}); workers held "
        f"{workers_held} (target 0: {common.verdict(workers_held == TARGET_HELD)}); resume p99 "
        f"{p99:.1f} ms = {p99 / b99:.1f}x raw RQ start p99 (target <= 100 ms: "
        f"{common.verdict(p99 <= TARGET_P99_MS)})"
    )
    common.dump_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
