"""End-to-end throughput: runs per second from enqueue to answer, 2 worker processes.

Switchboard: `python -m switchboard worker` x 2 (env as tests/support/processes.worker_env, with the
production lease/sweep timers), each one RQ SimpleWorker plus the sweeper and RQ's
scheduler, default configuration (BM25 demonstrations on). This process plays the bot:
service.submit() of the 4-step fee question, one after another, as fast as it can; the fake
model (zero latency, request checks off) answers from its own process. A round's rate is
N / (last run's completion - first submit).

Baseline, same run, same machine: raw RQ no-op jobs (`bench.common.noop`, JSON serializer,
the same result TTL) enqueued one by one on 2 bare SimpleWorker processes; rate is
N / (last job's ended_at - first enqueue). Rounds alternate Switchboard / baseline after a
warm-up; the medians are compared.

Worker class: RQ's SimpleWorker, for both. Switchboard uses it (worker/process.py) because it
runs jobs in the worker process instead of forking a work-horse per job — on this machine a
pair of fork-per-job workers did ~74 no-op jobs/s against ~370 for a pair of SimpleWorkers;
crash isolation is not needed since a run's state lives in Redis and crashed runs are
recovered by lease expiry and the sweeper. `--fork` also measures RQ's fork-per-job `Worker`
on no-op jobs, for reference.

Everything shares the 2 cores: the 2 workers, Redis, the fake model and this producer. The
CPU each used is printed, so the share taken by the fake model (which in production runs on
someone else's machine) is visible.

    python bench/bench_throughput.py
    python bench/bench_throughput.py --runs 400 --jobs 2000 --rounds 3 --fork
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import common
import psutil
import redis
from common import FEE_QUESTION, FakeModelProcess, RawRQWorker, median, row
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from tests.support.runtime import ALICE, make_runtime
from worker import service
from worker.run import RunStatus
from worker.runtime import Runtime

TARGET = 0.3
NOOP_QUEUE = "bench-noop"
FORK_QUEUE = "bench-fork"


class CPU:
    """CPU seconds (user+system) used by groups of processes in a span. Worker groups also
    count their children (RQ's scheduler; a fork-per-job worker's work-horses)."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.procs = {
            label: [psutil.Process(pid) for pid in group] for label, group in pids.items()
        }
        self.start = self.sample()

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for label, procs in self.procs.items():
            total = 0.0
            for proc in procs:
                family = [proc]
                if label == "workers":
                    family += proc.children(recursive=True)
                for p in family:
                    try:
                        t = p.cpu_times()
                    except psutil.NoSuchProcess:
                        continue
                    total += t.user + t.system
                    if label == "workers":
                        total += t.children_user + t.children_system
            out[label] = total
        return out

    def spent(self) -> dict[str, float]:
        now = self.sample()
        return {label: now[label] - self.start[label] for label in now}


def switchboard_round(rt: Runtime, n: int) -> float:
    """Submit n runs back to back; runs per second until the last one completed."""
    first = time.time()
    ids = [service.submit(rt, FEE_QUESTION, ALICE).id for _ in range(n)]
    completed = rt.store.keys.status(RunStatus.COMPLETED)
    others = [rt.store.keys.status(s) for s in (RunStatus.PARTIAL, RunStatus.FAILED)]

    def done() -> bool:
        pipe = rt.redis.pipeline(transaction=False)
        for key in [completed, *others]:
            pipe.zmscore(key, ids)
        scores = pipe.execute()
        if any(s is not None for group in scores[1:] for s in group):
            raise RuntimeError("a benchmark run did not complete (see the worker logs)")
        return all(s is not None for s in scores[0])

    common.wait_until(done, 300, f"{n} runs")
    last = max(s for s in rt.redis.zmscore(completed, ids) if s is not None)
    return n / (last - first)


def rq_round(queue: Queue, n: int) -> float:
    """Enqueue n no-op jobs back to back; jobs per second until the last one ended.

    Waits on the jobs themselves, not on the finished-job registry's count: the registry
    drops entries as their results expire, so a count taken before the round can fall while
    the round runs and never reach its target."""
    first = time.time()
    ids = [
        queue.enqueue_call("bench.common.noop", result_ttl=3600, failure_ttl=3600).id
        for _ in range(n)
    ]

    def ended() -> list[Job] | None:
        if queue.count:  # one LLEN while jobs wait, not a fetch of every job at each poll
            return None
        jobs = Job.fetch_many(ids, connection=queue.connection, serializer=JSONSerializer)
        if any(job is None or job.is_failed for job in jobs):
            raise RuntimeError("a no-op job failed or vanished (see the worker logs)")
        done = [job for job in jobs if job is not None and job.ended_at is not None]
        return done if len(done) == n else None

    jobs = common.wait_until(ended, 300, f"{n} no-op jobs")
    last = max(job.ended_at.timestamp() for job in jobs if job.ended_at)
    return n / (last - first)


def agents_round(model_url: str, n: int, processes: int = 2) -> float:
    """Reference: the openai-agents Runner in `processes` processes, n runs in all, same fake
    model and tools (see bench_loop.py). No queue, no persistence: the ceiling of an agent
    loop itself on this machine and this fake."""
    import subprocess

    each = n // processes
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--agents-child", model_url, str(each)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for child in children:  # warmed up and waiting
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        spans = []
        for child in children:
            assert child.stdout is not None
            first, last = map(float, child.stdout.readline().split())
            spans.append((first, last))
    finally:
        for child in children:
            child.kill()
            child.wait()
    return each * processes / (max(e for _, e in spans) - min(s for s, _ in spans))


def agents_child(model_url: str, n: int) -> None:
    from types import SimpleNamespace

    from bench_loop import agents_run, build_agent

    import tools.builtin
    from tools.policy import Policy
    from tools.registry import registry

    tools.builtin.load()
    one = agents_run(
        build_agent(SimpleNamespace(policy=Policy.default(registry), registry=registry), model_url)
    )
    for _ in range(10):
        one()
    print("ready", flush=True)
    sys.stdin.readline()
    first = time.time()
    for _ in range(n):
        one()
    print(f"{first} {time.time()}", flush=True)


def measure(
    label: str, fn: Callable[[], float], cpu_pids: dict[str, list[int]], log: list[dict[str, Any]]
) -> float:
    cpu = CPU(cpu_pids)
    started = time.perf_counter()
    rate = fn()
    wall = time.perf_counter() - started
    spent = cpu.spent()
    log.append({"label": label, "rate": rate, "wall": wall, "cpu": spent})
    shares = ", ".join(f"{k} {v / wall:.2f}" for k, v in spent.items() if v > 0.005)
    row(f"{label}", f"{rate:7.1f} /s   (cores busy: {shares})")
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300, help="Switchboard runs per round")
    parser.add_argument("--jobs", type=int, default=1500, help="no-op jobs per baseline round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fork", action="store_true", help="also measure RQ's fork-per-job Worker")
    parser.add_argument("--no-agents", action="store_true", help="skip the openai-agents reference")
    parser.add_argument(
        "--concurrency", type=int, help="runs per Switchboard worker (default: the worker's)"
    )
    parser.add_argument(
        "--pool",
        choices=("gevent", "threads"),
        help="the Switchboard workers' --pool (default: theirs)",
    )
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--agents-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agents_child:
        agents_child(args.agents_child[0], int(args.agents_child[1]))
        return 0

    common.banner("bench_throughput: runs/s from enqueue to answer, 2 worker processes")
    common.quiet_switchboard_logs()
    figures: dict[str, Any] = {}
    log: list[dict[str, Any]] = []
    with common.workdir("bench-throughput-") as tmp, common.redis_server(tmp) as url:
        fake = FakeModelProcess(validate=False)
        conn = redis.Redis.from_url(url)
        rt = make_runtime(conn, fake.url)
        flags = ["--concurrency", str(args.concurrency)] if args.concurrency else []
        flags += ["--pool", args.pool] if args.pool else []
        sb_workers = common.switchboard_workers(2, url, fake.url, tmp, *flags)
        rq_workers = [RawRQWorker(url, NOOP_QUEUE, tmp / f"rq-{i}.log") for i in range(2)]
        fork_workers: list[Any] = []
        try:
            noop_queue = Queue(NOOP_QUEUE, connection=conn, serializer=JSONSerializer)
            common.wait_for_workers(conn, rt.queue.name, 2)
            common.wait_for_workers(conn, NOOP_QUEUE, 2)
            redis_pid = _redis_pid(conn)
            producer = [psutil.Process().pid]
            sb_cpu = {
                "workers": [w.pid for w in sb_workers],
                "fake model": [fake.pid],
                "redis": redis_pid,
                "producer": producer,
            }
            rq_cpu = {
                "workers": [w.pid for w in rq_workers],
                "redis": redis_pid,
                "producer": producer,
            }
            row("worker class", "rq.SimpleWorker x 2 processes (both sides)")
            row("per round", f"{args.runs} Switchboard runs / {args.jobs} no-op jobs")
            switchboard_round(rt, 40)  # warm-up: imports, connections, BM25 index
            rq_round(noop_queue, 200)
            sb_rates: list[float] = []
            rq_rates: list[float] = []
            ag_rates: list[float] = []
            ag_cpu = {"fake model": [fake.pid]}
            for i in range(args.rounds):
                contenders = [
                    ("Switchboard", lambda: switchboard_round(rt, args.runs), sb_cpu, sb_rates),
                    ("raw RQ no-op", lambda: rq_round(noop_queue, args.jobs), rq_cpu, rq_rates),
                ]
                if not args.no_agents:
                    contenders.append(
                        (
                            "openai-agents x 2 (ref.)",
                            lambda: agents_round(fake.url, args.runs),
                            ag_cpu,
                            ag_rates,
                        )
                    )
                for name, fn, cpu, sink in contenders if i % 2 == 0 else reversed(contenders):
                    sink.append(measure(f"round {i + 1}: {name}", fn, cpu, log))
            sb, rq = median(sb_rates), median(rq_rates)
            ratio = sb / rq
            figures.update(switchboard_runs_per_s=sb, rq_noop_jobs_per_s=rq, ratio=ratio)
            row("Switchboard runs/s (median)", f"{sb:7.1f}")
            row("raw RQ SimpleWorker no-op jobs/s (median)", f"{rq:7.1f}")
            row("ratio Switchboard / raw RQ", f"{ratio:5.2f}x   target >= {TARGET:.1f}x")
            sb_log = [e for e in log if "Switchboard" in e["label"]]
            per_run = {
                k: median([e["cpu"][k] / (args.runs) * 1000 for e in sb_log]) for k in sb_cpu
            }
            row(
                "CPU ms per Switchboard run",
                ", ".join(f"{k} {v:.1f}" for k, v in per_run.items()),
            )
            figures["cpu_ms_per_run"] = per_run
            if ag_rates:
                ag = median(ag_rates)
                figures["agents_runs_per_s"] = ag
                row(
                    "reference: openai-agents Runner x 2 processes",
                    f"{ag:7.1f} runs/s (no queue, no persistence)",
                )
                row("  = raw RQ no-op ratio an agent loop alone reaches", f"{ag / rq:5.2f}x")
                row("ratio Switchboard / openai-agents throughput", f"{sb / ag:5.2f}x")
            if args.fork:
                fork_workers = [
                    RawRQWorker(url, FORK_QUEUE, tmp / f"fork-{i}.log", "Worker") for i in range(2)
                ]
                fork_queue = Queue(FORK_QUEUE, connection=conn, serializer=JSONSerializer)
                common.wait_for_workers(conn, FORK_QUEUE, 2)
                rq_round(fork_queue, 50)
                fork = measure(
                    "reference: RQ fork-per-job Worker x 2, no-op",
                    lambda: rq_round(fork_queue, 300),
                    {"workers": [w.pid for w in fork_workers], "redis": redis_pid},
                    log,
                )
                figures["rq_fork_noop_jobs_per_s"] = fork
                row("ratio Switchboard / RQ fork-per-job no-op", f"{sb / fork:5.2f}x")
        finally:
            for w in [*sb_workers, *rq_workers, *fork_workers]:
                w.stop()
            fake.stop()
    print(
        f"RESULT throughput: Switchboard/raw RQ = {ratio:.2f}x "
        f"({sb:.0f} runs/s vs {rq:.0f} no-op jobs/s; target >= {TARGET:.1f}x: "
        f"{common.verdict(ratio >= TARGET)})"
    )
    common.dump_json(args.json, figures)
    return 0


def _redis_pid(conn: redis.Redis) -> list[int]:
    pid = int(conn.info("server")["process_id"])
    try:
        psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []  # REDIS_URL on another host or user
    return [pid]


if __name__ == "__main__":
    sys.exit(main())
