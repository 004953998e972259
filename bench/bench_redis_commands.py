"""Redis commands per run, as Redis counts them, against raw RQ's cost of one job in the same run.

Redis's `INFO commandstats` counts every command it executes: what clients send and what scripts
run inside (a script's EVALSHA and each `redis.call` in it). Both sides run on one private
Redis (or REDIS_URL, flushed), each measured from a `CONFIG RESETSTAT`:

  Switchboard  ONE `python -m switchboard worker --concurrency 4` (production lease and sweep
               timers, default settings otherwise) and this process as the bot
               (`service.submit`, with the default per-person limits a bot enforces: runs in
               flight, runs a minute, spend a day), each run asked by a person of its own (as
               in a workspace: nobody waits in their own line, nobody hits the per-minute
               limit); the fake model answers bench_loop's fee question (four model calls,
               three tool calls) at once. Every run is checked: completed, 4 steps.
               Measured twice, each time with a worker of its own: under the default model
               (SWITCHBOARD_MODEL's default, priced: each call's cost is spent against the
               person's day, and a call holds a place in flight at the day's largest call,
               from its person's second call on: each run here is its person's first
               question of the day), the figure held against the target; and under a model
               the price table does not know (a local model server's), whose calls cost
               nothing, so none holds a place or spends.
  raw RQ       ONE bare RQ SimpleWorker process (JSON serializer, the same worker TTLs) and
               this process enqueueing a no-op job per run, the least a run's one job costs.

Each is measured with only its own worker running (an idle worker sends commands too), warmed
up, then given `--runs` (default 200) back to back. What this process sends to
wait for the end (Switchboard: three ZMSCORE per poll, the status indexes; RQ: one ZCARD of
the finished registry per poll) is counted here and left out, as are INFO and CONFIG; what
the bot sends to submit, and what the worker does meanwhile (heartbeats, the sweeper), is in.
Printed: commands per run, by command, and the ratio to RQ's per job. Target (issue 28):
<= 60 commands per run, scripts included. Also the requests Redis read (INFO stats'
`total_reads_processed`): round trips per run, a pipeline or a transaction one, which cost
the worker CPU as commands inside a script do not.

    python bench/bench_redis_commands.py              # ~30 s
    python bench/bench_redis_commands.py --runs 500 --json /tmp/commands.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import common
import redis
from common import FEE_QUESTION, FakeModelProcess, RawRQWorker, row
from rq import Queue
from rq.serializers import JSONSerializer

from switchboard.settings import Config
from tests.support.runtime import ALICE, make_runtime
from worker import service
from worker.limits import Limits
from worker.run import RunStatus
from worker.runtime import Runtime

TARGET = 60  # commands per run (issue 28)
MODEL_CALLS = 4
PEOPLE = itertools.count()  # each run asked by a person of its own
IGNORED = {"info", "config|resetstat", "config"}  # this process's reading of the counts


def command_counts(conn: redis.Redis) -> Counter[str]:
    """Calls per command since the last CONFIG RESETSTAT (`cmdstat_get` -> "get")."""
    stats = conn.info("commandstats")
    counts: Counter[str] = Counter()
    for name, figures in stats.items():
        command = name.removeprefix("cmdstat_")
        if command not in IGNORED:
            counts[command] = int(figures["calls"])
    return counts


@dataclass
class Measured:
    counts: Counter[str]  # calls per command
    reads: int  # requests Redis read: round trips


def measured(
    conn: redis.Redis, start: Callable[[], None], done: Callable[[], bool], own: str, per_poll: int
) -> Measured:
    """The commands Redis ran from `start()` until `done()`, less the `per_poll` x `own`
    commands each poll of `done` sent; and the requests it read (`total_reads_processed`):
    round trips, a pipeline or a transaction one, less the polls' and the two INFO."""
    conn.config_resetstat()
    start()
    polls = 1
    while not done():
        polls += 1
        time.sleep(0.02)
    counts = command_counts(conn)
    counts[own] -= polls * per_poll
    reads = int(conn.info("stats")["total_reads_processed"]) - polls - 2
    return Measured(+counts, reads)  # + drops the zero entries


def switchboard_side(rt: Runtime, runs: int) -> Measured:
    ids: list[str] = []
    ended_as = (RunStatus.COMPLETED, RunStatus.PARTIAL, RunStatus.FAILED)
    keys = [rt.store.keys.status(s) for s in ended_as]

    def submit() -> None:
        for _ in range(runs):
            person = ALICE.model_copy(update={"user_id": f"U{next(PEOPLE):06d}"})
            ids.append(service.submit(rt, FEE_QUESTION, person).id)

    def ended() -> bool:
        pipe = rt.redis.pipeline(transaction=False)
        for key in keys:
            pipe.zmscore(key, ids)
        return sum(s is not None for scores in pipe.execute() for s in scores) >= len(ids)

    seen = measured(rt.redis, submit, ended, "zmscore", len(keys))
    for run_id in ids:
        run = rt.store.load(run_id)
        if run.status != RunStatus.COMPLETED or run.usage.steps != MODEL_CALLS:
            raise SystemExit(f"run {run_id}: {run.status} after {run.usage.steps} steps")
    return seen


def rq_side(conn: redis.Redis, queue: Queue, runs: int) -> Measured:
    def enqueue() -> None:
        for _ in range(runs):
            queue.enqueue_call("bench.common.noop", result_ttl=3600, failure_ttl=3600)

    key = queue.finished_job_registry.key
    before = int(conn.zcard(key))  # kept an hour (result_ttl): none expires meanwhile

    def finished() -> bool:
        return int(conn.zcard(key)) >= before + runs

    return measured(conn, enqueue, finished, "zcard", 1)


UNPRICED = "local-model"  # a name the price table does not know


def defaults() -> Config:
    """A deployment's default settings: neither the operator's SWITCHBOARD_* variables nor a
    .env file, as the workers' environment leaves them out (tests/support/processes.py)."""
    kept = {
        name: os.environ.pop(name) for name in list(os.environ) if name.startswith("SWITCHBOARD_")
    }
    try:
        return Config(_env_file=None)
    finally:
        os.environ.update(kept)


DEFAULTS = defaults()


def measure_switchboard(
    conn: redis.Redis, url: str, model_url: str, tmp: Path, model: str, runs: int
) -> Measured:
    """`runs` measured with a worker of their own, as the bot and the worker run `model`."""
    workers = common.switchboard_workers(
        1, url, model_url, tmp, "--concurrency", "4", SWITCHBOARD_MODEL=model
    )
    try:  # each side measured with only its own worker running (idle workers send too)
        limits = Limits(  # the bot's per-person limits, as a deployment's defaults
            runs_in_flight=DEFAULTS.user_runs_in_flight,
            runs_per_minute=DEFAULTS.user_runs_per_minute,
            cost_per_day=DEFAULTS.user_cost_per_day,
        )
        rt = make_runtime(conn, model_url, limits=limits, model=model)
        common.wait_for_workers(conn, rt.queue.name, 1)
        switchboard_side(rt, 8)  # warm-up: scripts loaded, connections made
        return switchboard_side(rt, runs)
    finally:
        for worker in workers:
            worker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs (and RQ jobs) measured")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    common.banner("bench_redis_commands: Redis commands per run, scripts included")
    with common.workdir("sb-commands-") as tmp, common.redis_server(tmp) as url:
        conn = redis.Redis.from_url(url)
        fake = FakeModelProcess(validate=False)
        try:
            sb = measure_switchboard(conn, url, fake.url, tmp, DEFAULTS.model, args.runs)
            unpriced = measure_switchboard(conn, url, fake.url, tmp, UNPRICED, args.runs)
        finally:
            fake.stop()
        rq_worker = RawRQWorker(url, "bench-raw", tmp / "rq.log")
        try:
            queue = Queue("bench-raw", connection=conn, serializer=JSONSerializer)
            common.wait_for_workers(conn, "bench-raw", 1)
            rq_side(conn, queue, 8)
            rq = rq_side(conn, queue, args.runs)
        finally:
            rq_worker.stop()
    report(sb, unpriced, rq, args.runs, args.json)
    return 0


def report(
    sb: Measured, unpriced: Measured, rq: Measured, runs: int, json_path: str | None
) -> None:
    per_run, per_job = sum(sb.counts.values()) / runs, sum(rq.counts.values()) / runs
    per_unpriced = sum(unpriced.counts.values()) / runs
    row("runs", f"{runs} fee questions ({MODEL_CALLS} model calls, 3 tool calls each)")
    row(f"Switchboard, per run ({DEFAULTS.model})", f"{per_run:6.1f} commands")
    for command, calls in sb.counts.most_common(16):
        share = rq.counts.get(command, 0) / runs
        row(f"  {command}", f"{calls / runs:6.2f}   (raw RQ {share:5.2f})")
    row(
        f"  unpriced model ({UNPRICED})",
        f"{per_unpriced:6.1f} commands, {unpriced.reads / runs:.1f} round trips",
    )
    row("raw RQ, per no-op job", f"{per_job:6.1f} commands")
    row("Switchboard run / RQ job", f"{per_run / per_job:6.2f}x")
    row("round trips, per run / per job", f"{sb.reads / runs:6.1f} / {rq.reads / runs:.1f}")
    met = common.verdict(per_run <= TARGET)
    print(
        f"RESULT redis commands: {per_run:.1f} per run = {per_run / per_job:.2f}x raw RQ's "
        f"{per_job:.1f} per no-op job (target <= {TARGET} per run: {met}); "
        f"{sb.reads / runs:.1f} round trips per run; {per_unpriced:.1f} with an unpriced model"
    )
    common.dump_json(
        json_path,
        {
            "runs": runs,
            "per_run": per_run,
            "per_rq_job": per_job,
            "round_trips_per_run": sb.reads / runs,
            "round_trips_per_rq_job": rq.reads / runs,
            "per_run_unpriced": per_unpriced,
            "round_trips_per_run_unpriced": unpriced.reads / runs,
            "switchboard": dict(sb.counts),
            "switchboard_unpriced": dict(unpriced.counts),
            "rq": dict(rq.counts),
        },
    )


if __name__ == "__main__":
    raise SystemExit(main())
