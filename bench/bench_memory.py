"""Worker resident memory over 1,000 runs.

One `python -m switchboard worker` process (env as tests/support/processes.worker_env, production
lease/sweep timers, default configuration: BM25 demonstrations on) runs the 4-step fee
question against the zero-latency fake model, 1,000 times, in batches of 100: this process
submits a batch, waits until every run in it completed, lets the worker settle, then reads
the worker's VmRSS from /proc/PID/status (the median of 5 reads 20 ms apart).

Figures: RSS after the 1,000th run (target <= 80 MB); growth from the 500th to the 1,000th
run (target: none beyond noise — noise being the largest batch-to-batch change over the first
half, or 1% of RSS if larger); and, as the ratio, RSS after 1,000 runs / the same process's RSS
after start-up before any run (the baseline, measured in the same run). RQ's scheduler,
which `switchboard worker` starts as a child process, is reported apart.

    python bench/bench_memory.py
    python bench/bench_memory.py --runs 2000 --batch 200
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

import common
import psutil
import redis
from common import FEE_QUESTION, FakeModelProcess, row, rss_kib

from tests.support.runtime import ALICE, make_runtime
from worker import service
from worker.run import RunStatus
from worker.runtime import Runtime

TARGET_MB = 80.0
MB = 1024.0  # VmRSS is in KiB; "MB" below is MiB


def settled_rss(pid: int, reads: int = 5) -> tuple[float, float]:
    """(median, spread) of VmRSS in KiB over a few reads 20 ms apart."""
    values = []
    for _ in range(reads):
        values.append(rss_kib(pid))
        time.sleep(0.02)
    return statistics.median(values), max(values) - min(values)


def batch(rt: Runtime, n: int) -> None:
    ids = [service.submit(rt, FEE_QUESTION, ALICE).id for _ in range(n)]
    completed = rt.store.keys.status(RunStatus.COMPLETED)

    def done() -> bool:
        scores = rt.redis.zmscore(completed, ids)
        return all(s is not None for s in scores)

    common.wait_until(done, 120, f"a batch of {n} runs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    common.banner(f"bench_memory: worker RSS over {args.runs:,} runs")
    common.quiet_switchboard_logs()
    series: list[tuple[int, float]] = []
    with common.workdir("bench-memory-") as tmp, common.redis_server(tmp) as url:
        fake = FakeModelProcess(validate=False)
        conn = redis.Redis.from_url(url)
        rt = make_runtime(conn, fake.url)
        [worker] = common.switchboard_workers(1, url, fake.url, tmp)
        try:
            common.wait_for_workers(conn, rt.queue.name, 1)
            time.sleep(1.0)  # let start-up finish (the scheduler child, first heartbeat)
            startup, jitter = settled_rss(worker.pid)
            children = psutil.Process(worker.pid).children(recursive=True)
            row(
                "worker RSS after start-up, before any run",
                f"{startup / MB:7.1f} MB  (reads at rest vary by {jitter:.0f} KiB)",
            )
            done = 0
            while done < args.runs:
                size = min(args.batch, args.runs - done)
                batch(rt, size)
                done += size
                rss, _ = settled_rss(worker.pid)
                series.append((done, rss))
                print(f"   after {done:5d} runs: {rss / MB:7.1f} MB", flush=True)
            child_rss = [rss_kib(c.pid) for c in children if c.is_running()]
            # RSS counts pages shared with a forked child twice; PSS splits them (Switchboard's
            # workers fork none since RQ's scheduler moved into the sweeper thread)
            full = [p.memory_full_info() for p in [psutil.Process(worker.pid), *children]]
        finally:
            worker.stop()
            fake.stop()

    final = series[-1][1]
    half = min(series, key=lambda point: abs(point[0] - args.runs // 2))
    growth = final - half[1]
    steps = [b[1] - a[1] for a, b in itertools.pairwise(series)]
    second_half_steps = [s for (n, _), s in zip(series[1:], steps, strict=True) if n > half[0]]
    # noise: how much RSS moved from batch to batch in the first half (runs up to the 500th),
    # judged independently of the second half whose growth is being tested
    first_half_steps = [s for (n, _), s in zip(series[1:], steps, strict=True) if n <= half[0]]
    noise = max((abs(s) for s in first_half_steps), default=0.0)
    ratio = final / startup
    row(
        f"worker RSS after {args.runs:,} runs",
        f"{final / MB:7.1f} MB   target <= {TARGET_MB:.0f} MB",
    )
    row(
        f"growth run {half[0]} -> {args.runs}",
        f"{growth:+7.0f} KiB ({growth / half[1] * 100:+.1f}%)",
    )
    row("noise: largest batch-to-batch change, 1st half", f"{noise:7.0f} KiB")
    if second_half_steps:
        row(
            "batch-to-batch changes in the second half",
            " ".join(f"{s:+.0f}" for s in second_half_steps) + " KiB",
        )
    if child_rss:
        row(
            "RQ scheduler child RSS (not counted above)",
            ", ".join(f"{r / MB:.1f} MB" for r in child_rss),
        )
    row(
        "PSS (USS) worker" + ("; scheduler child" if child_rss else ""),
        "; ".join(f"{m.pss / MB / 1024:.1f} MB ({m.uss / MB / 1024:.1f} MB)" for m in full),
    )
    row("ratio RSS after runs / after start-up", f"{ratio:5.2f}x")
    flat = growth <= max(noise, 0.01 * half[1])
    met = common.verdict(final / MB <= TARGET_MB)
    print(
        f"RESULT memory: worker RSS {final / MB:.1f} MB after {args.runs:,} runs = {ratio:.2f}x "
        f"its start-up RSS (target <= {TARGET_MB:.0f} MB: {met}); growth {half[0]}->"
        f"{args.runs}: {growth:+.0f} KiB (flat within noise: {common.verdict(flat)})"
    )
    common.dump_json(
        args.json,
        {
            "startup_kib": startup,
            "final_kib": final,
            "ratio": ratio,
            "growth_kib": growth,
            "noise_kib": noise,
            "series": series,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
