"""Scrape cost: `/metrics` latency with 10,000 runs awaiting approval, against a baseline.

The runs are suspended through the real loop (bench_suspended.suspend_runs: this process
submits ticket requests, two `python -m switchboard worker` processes take each as far as
the approval). Before that, this process works 50 fee questions itself (RQ's SimpleWorker,
in-process), so its counters and histograms carry real samples (model calls, tokens, tool
calls with their labels) and the exposition has its production shape.

Measured: `worker.metrics.serve` (what `--metrics-port` starts; the bot's `/metrics` renders
the same registry) scraped over HTTP from this process, one new connection per scrape, as
Prometheus does. The shared gauges cost one Redis round trip (LLEN, ZCARD, ZRANGE 0 0).
Baseline: the same server class and handler serving a bare prometheus_client registry with
only the process's default collectors (process, platform, GC) — what any instrumented
Python process exposes. Rounds alternate the order; the p99 over all rounds is compared.
Also measured with no run waiting, before the 10,000 are made: the scrape must not grow
with the backlog.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from typing import Any

import common
import redis
from bench_suspended import suspend_runs
from common import FEE_QUESTION, FakeModelProcess, percentile, row
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client import generate_latest as bare_exposition
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from tests.support.runtime import ALICE, make_runtime, work
from worker import metrics, service
from worker.run import RunStatus
from worker.runtime import Runtime

TARGET_P99_MS = 50.0  # a tenth of Prometheus's default scrape timeout would still be 1 s


class BaselineServer(metrics.MetricsServer):
    """The same server and handler, serving only the default collectors."""

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)

    def render(self) -> tuple[bytes, str]:
        return bare_exposition(self.registry), CONTENT_TYPE_PLAIN_0_0_4


def scrape_ms(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as response:
        size = len(response.read())
    return (time.perf_counter() - started) * 1000, size


def measure(urls: dict[str, str], rounds: int, per_round: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in urls}
    order = list(urls)
    for n in range(rounds):
        for name in order if n % 2 == 0 else order[::-1]:
            for _ in range(per_round):
                times[name].append(scrape_ms(urls[name])[0])
    return times


def warm_counters(rt: Runtime, n: int) -> None:
    """Real runs in this process, so its counters and histograms carry real samples."""
    ids = [service.submit(rt, FEE_QUESTION, ALICE).id for _ in range(n)]
    work(rt)
    done = sum(rt.store.load(i).status == RunStatus.COMPLETED for i in ids)
    if done != n:
        raise RuntimeError(f"only {done} of {n} warm-up runs completed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10_000, help="runs to suspend")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--scrapes", type=int, default=250, help="scrapes per round and server")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    common.banner(f"bench_metrics: /metrics with {args.n:,} runs awaiting approval")
    common.quiet_switchboard_logs()
    figures: dict[str, Any] = {}
    with common.workdir("bench-metrics-") as tmp, common.redis_server(tmp) as url:
        fake = FakeModelProcess(validate=False)
        conn = redis.Redis.from_url(url)
        rt = make_runtime(conn, fake.url)
        ours = metrics.serve(0, rt, host="127.0.0.1")
        bare = BaselineServer(rt, ("127.0.0.1", 0))
        bare.thread.start()
        urls = {
            "switchboard": f"http://127.0.0.1:{ours.port}/metrics",
            "baseline": f"http://127.0.0.1:{bare.port}/metrics",
        }
        workers = []
        try:
            warm_counters(rt, 50)
            sizes = {name: scrape_ms(u)[1] for name, u in urls.items()}
            series = sum(1 for line in metrics.render()[0].splitlines() if line[:1] != b"#")
            row(
                "exposition size: Switchboard / baseline",
                f"{sizes['switchboard']:,} B / {sizes['baseline']:,} B ({series} series)",
            )
            empty = measure(urls, args.rounds, args.scrapes)

            workers = common.switchboard_workers(args.workers, url, fake.url, tmp)
            common.wait_for_workers(conn, rt.queue.name, args.workers)
            _ids, seconds = suspend_runs(rt, args.n)
            pending = conn.zcard(rt.approvals.keys.pending)
            row(
                "runs suspended through the real loop",
                f"{args.n:,} in {seconds:.1f} s ({pending:,} approvals pending)",
            )
            for w in workers:  # idle and about to go: they take no CPU from the scrapes
                w.stop()
            workers = []
            full = measure(urls, args.rounds, args.scrapes)
        finally:
            for w in workers:
                w.stop()
            ours.stop()
            bare.stop()
            fake.stop()

    scrapes = args.rounds * args.scrapes
    for label, times in (("no run waiting", empty), (f"{args.n:,} awaiting approval", full)):
        ms = times["switchboard"]
        base = times["baseline"]
        row(
            f"/metrics, {label} ({scrapes} scrapes)",
            f"p50 {percentile(ms, 50):5.2f} ms   p99 {percentile(ms, 99):5.2f} ms",
        )
        row(
            "  baseline: default collectors only",
            f"p50 {percentile(base, 50):5.2f} ms   p99 {percentile(base, 99):5.2f} ms",
        )
    p99 = percentile(full["switchboard"], 99)
    b99 = percentile(full["baseline"], 99)
    p99_empty = percentile(empty["switchboard"], 99)
    row(f"ratio p99 / baseline p99, {args.n:,} waiting", f"{p99 / b99:5.2f}x")
    row(f"ratio p99 {args.n:,} waiting / none waiting", f"{p99 / p99_empty:5.2f}x")
    figures = {
        "runs_awaiting_approval": args.n,
        "scrapes_per_server": scrapes,
        "p99_ms": p99,
        "baseline_p99_ms": b99,
        "p99_ms_none_waiting": p99_empty,
        "p50_ms": percentile(full["switchboard"], 50),
        "baseline_p50_ms": percentile(full["baseline"], 50),
        "exposition_bytes": sizes,
    }
    print(
        f"RESULT metrics: /metrics p99 {p99:.2f} ms with {args.n:,} runs awaiting approval = "
        f"{p99 / b99:.2f}x a bare exposition's p99 ({b99:.2f} ms); {p99 / p99_empty:.2f}x its own "
        f"p99 with none waiting (target p99 <= {TARGET_P99_MS:.0f} ms: "
        f"{common.verdict(p99 <= TARGET_P99_MS)})"
    )
    common.dump_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
