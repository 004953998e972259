"""What traces cost the loop: the 4-step run of bench_loop.py with tracing off, on, and with
OpenTelemetry absent, as ratios.

  absent  no OpenTelemetry at all: every `opentelemetry` import fails in that process (as if
          neither the API nor the SDK were installed; redis-py then skips its own check).
  off     installed, not configured (no OTEL_TRACES_EXPORTER): the default. The process must
          not import the trace SDK (checked).
  on      the real SDK: every span of a run (ask, advance, 4 chat, 3 execute_tool,
          invoke_agent; no Slack here) built and handed to a span processor whose exporter
          drops it, so the figure is Switchboard's and the SDK's work on the loop's threads,
          not a collector's.

Off and on run in one process, in alternating batches of 10 runs (A B B A ...), so the pair
sees the same machine: on/off is the headline. Absent needs a process of its own; absent and
off/on processes alternate round by round, so off/absent compares separate processes and
moves with the machine's load. A third figure needs no comparison: the time the off hooks of
one run take (100,000 calls of each, in the off process), as a share of a run.

A run is timed from service.submit until its RQ job is done, by a resident SimpleWorker in
the main thread (bench_loop's `resident` mode), against one Redis and one fake model.

    python bench/bench_tracing.py              # 6 rounds x 60 runs per configuration
    python bench/bench_tracing.py --rounds 4 -n 100
"""

from __future__ import annotations

import argparse
import importlib.abc
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any


class NoOpenTelemetry(importlib.abc.MetaPathFinder):
    """Every `opentelemetry` import fails, as when it is not installed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r} (bench: OpenTelemetry absent)")


if sys.argv[1:3] == ["--child", "absent"]:  # before anything imports it (redis-py would)
    sys.meta_path.insert(0, NoOpenTelemetry())

import common  # noqa: E402
from common import FakeModelProcess, median, percentile, row  # noqa: E402

MODES = ("absent", "off", "on")  # "offon": one process, off and on in alternating batches
ROOT = Path(__file__).resolve().parents[1]


def child(mode: str, redis_url: str, model_url: str, n: int, warmup: int) -> dict[str, Any]:
    """`absent`: n runs. `offon`: n runs with tracing off and n with it on, in alternating
    batches in this one process (A B B A ...), so the pair sees the same machine."""
    import redis
    from bench_loop import ResidentWorker, switchboard_resident
    from rq.serializers import JSONSerializer

    from tests.support.runtime import make_runtime
    from worker import tracing

    common.quiet_switchboard_logs()
    rt = make_runtime(redis.Redis.from_url(redis_url), model_url)
    one = switchboard_resident(rt)
    times: dict[str, list[float]] = {"absent": [], "off": [], "on": []}
    plan = plan_batches(mode, n, warmup)
    sdk_when_off = False

    def driver() -> None:
        nonlocal sdk_when_off
        try:
            for which, count, timed in plan:
                if which == "on" and not tracing.enabled():
                    assert tracing.setup("bench", exporter=dropped())
                elif which != "on" and tracing.enabled():
                    tracing.shutdown()
                if which == "off" and not timed:
                    sdk_when_off = "opentelemetry.sdk.trace" in sys.modules
                for _ in range(count):
                    elapsed = one()
                    if timed:
                        times[which].append(elapsed)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # RQ's warm shutdown ends work()

    worker = ResidentWorker(
        [rt.queue], connection=rt.redis, serializer=JSONSerializer, worker_ttl=60
    )
    thread = threading.Thread(target=driver, daemon=True)
    thread.start()
    worker.work(max_jobs=sum(count for _, count, _ in plan), logging_level="WARNING")
    thread.join(60)
    tracing.shutdown()
    return {
        "times": times,
        "sdk_when_off": sdk_when_off,
        "api_imported": "opentelemetry" in sys.modules,
        "off_hooks_us": off_hooks_us() if mode == "offon" else 0.0,
    }


def plan_batches(mode: str, n: int, warmup: int, batch: int = 10) -> list[tuple[str, int, bool]]:
    """(configuration, runs, timed?) in order: a warm-up of each, then A B B A ... batches."""
    if mode == "absent":
        return [("absent", warmup, False), ("absent", n, True)]
    plan = [("off", warmup, False), ("on", warmup, False)]
    order = ["off", "on"]
    for i in range(0, n, batch):
        for which in order if (i // batch) % 2 == 0 else order[::-1]:
            plan.append((which, min(batch, n - i), True))
    return plan


def dropped() -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return Dropped()


def off_hooks_us() -> float:
    """What the hooks a run calls cost with tracing off, in microseconds per run: a 4-step
    run calls new_run once, advance once, model_called 4 times, tool_call 3 times and
    run_ended once (measured: 100,000 such sets, in this process, tracing off)."""
    import time

    from worker import tracing
    from worker.run import Requester, Run

    assert not tracing.enabled()
    run = Run(id="r0", question="q", requester=Requester(user_id="U0"))
    sets = 100_000
    started = time.perf_counter()
    for _ in range(sets):
        tracing.new_run(1, None)
        with tracing.advance(run):
            pass
        for _ in range(4):
            tracing.model_called(None, [], None)  # type: ignore[arg-type]
        for _ in range(3):
            tracing.tool_call(None, int, 0)  # type: ignore[arg-type]
        tracing.run_ended(run)
    return (time.perf_counter() - started) / sets * 1e6


def run_child(mode: str, redis_url: str, model_url: str, n: int, warmup: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "bench")])
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, redis_url, model_url, str(n), str(warmup)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{done.stderr[:3000]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=60, help="timed runs per configuration per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, redis_url, model_url, n, warmup = args.child
        print(json.dumps(child(mode, redis_url, model_url, int(n), int(warmup))))
        return 0

    common.banner("bench_tracing: the loop with traces absent / off / on (4-step run)")
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    flags: list[dict[str, Any]] = []
    with common.workdir("bench-tracing-") as tmp, common.redis_server(tmp) as url:
        os.environ["SWITCHBOARD_TICKETS_DB"] = str(tmp / "tickets.sqlite3")
        fake = FakeModelProcess()
        try:
            row("runs per configuration", f"{args.rounds} rounds x {args.n} (+{args.warmup})")
            for round_ in range(args.rounds):
                for mode in ("absent", "offon") if round_ % 2 == 0 else ("offon", "absent"):
                    got = run_child(mode, url, fake.url, args.n, args.warmup)
                    for which, found in got["times"].items():
                        times[which] += found
                    flags.append(got | {"mode": mode, "times": None})
        finally:
            fake.stop()
    figures: dict[str, Any] = {}
    for mode in MODES:
        figures[mode] = {
            "median_ms": median(times[mode]) * 1000,
            "p90_ms": percentile(times[mode], 90) * 1000,
        }
        row(f"{mode}: median per run", f"{figures[mode]['median_ms']:7.2f} ms")
    on_off = median(times["on"]) / median(times["off"])
    off_absent = median(times["off"]) / median(times["absent"])
    hooks = median([f["off_hooks_us"] for f in flags if f["mode"] == "offon"])
    hooks_share = hooks / 1000 / figures["off"]["median_ms"]
    figures["ratios"] = {"on_to_off": on_off, "off_to_absent": off_absent}
    figures["off_hooks_us_per_run"] = hooks
    row("on / off (same processes, A/B batches)", f"{on_off:5.3f}x")
    row("off / absent (separate processes)", f"{off_absent:5.3f}x")
    row("off: the hooks a run calls", f"{hooks:.2f} us per run = {hooks_share:.4%} of a run")
    sdk_off = any(f["sdk_when_off"] for f in flags)
    row("off imported the trace SDK", "yes (a defect)" if sdk_off else "no")
    assert not any(f["api_imported"] for f in flags if f["mode"] == "absent")
    print(
        f"RESULT tracing on/off = {on_off:.3f}x; off/absent = {off_absent:.3f}x; "
        f"off hooks {hooks:.2f} us per run"
    )
    common.dump_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
