"""Latency under load: 100 runs in flight at once, a model that takes 500 ms per call.

The task is bench_loop's fee question (knowledge_lookup x 2, calculate, then the answer: four
model calls, so 2.0 s is the ideal time for a run and for the whole burst). The fake model
(tests/fakes' FakeOpenAI, `python bench/common.py fake-model --delay 0.5 --no-validate`) answers
every scripted turn after 500 ms, from its own process; every side talks to that same process.
Three sides, each in its own process(es), each warmed up with one burst, then measured in
interleaved rounds (default 3, the order reversed every other round):

  Switchboard    ONE `python -m switchboard worker --concurrency 100` (100 RQ SimpleWorker
                 loops in threads; env as tests/support/processes.worker_env with the production
                 lease/sweep timers; default configuration, BM25 demonstrations on), and the
                 bot: `python -m switchboard bot --http` against tests/fakes' FakeSlack, a
                 process a deployment needs, counted in memory and CPU but idle: this process
                 submits for it, `service.submit` x 100 back to back, then waits until
                 every run is terminal. Time = the last run's `ended_at` - the first submit.
                 Every run is checked: completed, 4 steps, 3 tool calls, "4998" in the answer.
  openai-agents  one process (bench/latency_peer.py): 100 x `Runner.run(agent, question)`
                 under asyncio.gather; an Agent with OpenAIChatCompletionsModel on an
                 AsyncOpenAI client pointed at the fake, tracing off.
  LangGraph      one process (bench/latency_peer.py): `langgraph.prebuilt.create_react_agent`
                 on `ChatOpenAI(base_url=fake)`, checkpointer AsyncSqliteSaver on a temp file,
                 100 x `ainvoke` with distinct thread_ids under asyncio.gather.

The peers get Switchboard's instructions and its knowledge_lookup and calculate functions as
their tools; a peer's time runs from its first start to its last answer, and each answer is
checked ("4998", 3 tool results). The peers live in a file of their own so that their process
imports only their framework and the two tools (not Redis, RQ or the worker). For every side
and round the fake counts the chat requests it answered, by turn index: 100 of each of turns
0-3 (4 model calls per run, no retries), or the report says otherwise.

Memory and CPU: Switchboard's are its workers', its bot's and its Redis server's (when it
runs here), the peers' their one process's. Peak RSS = VmHWM from /proc/PID/status after the
burst, reset to the current RSS just before it (5 written to /proc/PID/clear_refs), summed
over the side's processes (with several, a sum of peaks: an upper bound of their
simultaneous total); "at rest" = VmRSS just before. Runs in flight per GiB = the most chat
requests the fake model was answering at once during the burst (runs really waiting on the
model together, not runs submitted or held) / peak RSS in GiB. Targets (issue):
Switchboard's time <= 1.1x the faster peer's, its peak RSS <= 1.2x that peer's, >= 700 runs in
flight per GiB.
Also counted: `sweeper_requeue` lines in the workers' JSON logs (target 0: no run in flight
taken for abandoned), and the CPU each side and the fake model used during each burst.

`--large`: 1,000 runs in flight, 4 worker processes x `--concurrency 250`, 2 s per model call
(ideal 8 s), Switchboard only: time to the last answer and the workers' total peak RSS.

Everything shares the machine's 2 cores (the fake model, Redis, the bot and the side being
measured): read the ratios, not the absolute times.

    python bench/bench_latency.py                  # 3 rounds, ~1 min
    python bench/bench_latency.py --large          # ~1 min
    python bench/bench_latency.py --runs 8 --processes 8 --concurrency 1 --rounds 1
    python bench/bench_latency.py --peers none --rounds 8 --keep-logs /tmp/logs
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import common
import psutil
import redis
from common import FEE_QUESTION, BotProcess, FakeModelProcess, median, row

from tests.fakes.slack_server import FakeSlack
from tests.support.processes import WorkerProcess, worker_env
from tests.support.runtime import ALICE, make_runtime
from worker import service
from worker.prompt import INSTRUCTIONS
from worker.run import RunStatus
from worker.runtime import Runtime

TIME_TARGET = 1.1  # Switchboard time / the faster peer's
# issue 28: the last answer against the ideal (the model's own time), and the faster peer's
LIMIT_TARGET, LARGE_LIMIT_TARGET = 1.25, 1.5  # 100 runs (default settings); 1,000 runs
PEER_TARGET = 0.6
RSS_TARGET = 1.2  # Switchboard peak RSS / that peer's
PER_GIB_TARGET = 700  # runs in flight per GiB of Switchboard worker RSS
ANSWER = "4998"
MODEL_CALLS = 4
TOOL_CALLS = 3
PEERS = {"agents": "openai-agents", "langgraph": "LangGraph"}
# what a worker logs when its leases are late, fail to renew or are lost: why runs were re-queued
LEASE_WARNINGS = ("lease_renew_late", "lease_renew_failed", "lease_lost")


@dataclass
class Burst:
    seconds: float  # first submit (or start) -> last answer
    rest_kib: int  # VmRSS just before, summed over the side's processes
    peak_kib: int  # VmHWM after (reset just before), summed
    cpu_seconds: float  # CPU the side's processes used during it
    fake_cpu_seconds: float  # CPU the fake model used meanwhile
    requeues: int = 0  # sweeper_requeue log lines (Switchboard)
    lease_warnings: int = 0  # lease_renew_late, lease_renew_failed and lease_lost lines
    submit_seconds: float = 0.0  # the bot's submits, first to last (Switchboard)
    redis_rest_kib: int = 0  # the Redis server's share of rest_kib (Switchboard)
    bot_rest_kib: int = 0  # the bot's share of rest_kib (Switchboard)
    at_model: int = 0  # the most chat requests the fake model answered at once
    rest_threads: int = 0  # threads of the side's workers (not the bot, not Redis) at rest
    rest_sockets: int = 0  # and their open sockets (Redis, the model, the bot): what a burst
    # leaves open shows here, not only in RSS

    @property
    def worker_rest_kib(self) -> int:
        return self.rest_kib - self.redis_rest_kib - self.bot_rest_kib

    def per_gib(self) -> float:
        """Runs in flight at the model per GiB of peak RSS."""
        return self.at_model / (self.peak_kib / 2**20)


# --- the sides ----------------------------------------------------------------------------


class SwitchboardSide:
    """Worker processes and a bot started here; this process submits the runs (as the bot
    would: the benchmark's own code beside it is not counted)."""

    name = "Switchboard"

    def __init__(
        self, rt: Runtime, workers: list[WorkerProcess], bot: BotProcess, runs: int
    ) -> None:
        self.rt, self.workers, self.bot, self.runs = rt, workers, bot, runs
        # a deployment's processes: the workers, the bot and Redis
        self.redis_pids = local_redis_pid(rt.redis)
        self.bot_pids = [bot.pid]
        self.worker_pids = [w.pid for w in workers]
        self.pids = self.worker_pids + self.bot_pids + self.redis_pids

    def burst(self) -> dict[str, float]:
        offsets = [w.log.stat().st_size for w in self.workers]
        first = time.time()
        ids = [service.submit(self.rt, FEE_QUESTION, ALICE).id for _ in range(self.runs)]
        submitted = time.time()
        self.wait_terminal(ids)
        last = max(self.checked_end(run_id) for run_id in ids)

        def count(event: str) -> int:
            return sum(
                common.count_log_events(w.log, event, offset)
                for w, offset in zip(self.workers, offsets, strict=True)
            )

        return {
            "seconds": last - first,
            "requeues": count("sweeper_requeue"),
            "lease_warnings": sum(count(e) for e in LEASE_WARNINGS),
            "submit_seconds": submitted - first,
        }

    def wait_terminal(self, ids: list[str], timeout: float = 600) -> None:
        """Poll the status indexes (every 50 ms: the time measured is each run's own
        `ended_at`, so polling only has to be cheap, not prompt)."""
        keys = [
            self.rt.store.keys.status(s)
            for s in (RunStatus.COMPLETED, RunStatus.PARTIAL, RunStatus.FAILED)
        ]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pipe = self.rt.redis.pipeline(transaction=False)
            for key in keys:
                pipe.zmscore(key, ids)
            if sum(s is not None for scores in pipe.execute() for s in scores) >= len(ids):
                return
            time.sleep(0.05)
        raise TimeoutError(f"{self.runs} runs not terminal after {timeout} s (see worker logs)")

    def checked_end(self, run_id: str) -> float:
        run = self.rt.store.load(run_id)
        ok = (
            run.status == RunStatus.COMPLETED
            and ANSWER in (run.answer or "")
            and run.usage.steps == MODEL_CALLS
            and run.usage.tool_calls == TOOL_CALLS
            and run.ended_at is not None
        )
        if not ok:
            raise RuntimeError(f"run {run_id}: {run.status} {run.usage} {run.detail!r}")
        assert run.ended_at is not None
        return run.ended_at

    def stop(self) -> None:
        for w in self.workers:
            w.stop()
        self.bot.stop()


class PeerSide:
    """A peer framework in a child process (bench/latency_peer.py), warmed up; one burst per
    `go` line."""

    def __init__(self, kind: str, model_url: str, runs: int, folder: Path) -> None:
        self.name = PEERS[kind]
        script = Path(__file__).with_name("latency_peer.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), kind, model_url, str(runs), str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pids = self.worker_pids = [self.proc.pid]
        self.redis_pids: list[int] = []  # in-process state (AsyncSqliteSaver: a file)
        self.bot_pids: list[int] = []
        ready = self._read()
        if ready != {"ready": True}:
            raise RuntimeError(f"{self.name}: wrong answers in the warm-up burst: {ready}")

    @staticmethod
    def write_task(folder: Path) -> None:
        """What the peers ask and check (they do not import the benchmark's modules)."""
        task = {
            "question": FEE_QUESTION,
            "instructions": INSTRUCTIONS.format(user_id=ALICE.user_id),
            "answer": ANSWER,
            "tools": TOOL_CALLS,
        }
        (folder / "peer.json").write_text(json.dumps(task))

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: the child exited ({self.proc.wait()})")
        return json.loads(line)

    def burst(self) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        out = self._read()
        if out["bad"]:
            raise RuntimeError(f"{self.name}: {out['bad']} wrong answers, e.g. {out['sample']}")
        return {"seconds": out["last"] - out["first"]}

    def stop(self) -> None:
        common.stop_child(self.proc)


Side = SwitchboardSide | PeerSide


def local_redis_pid(conn: redis.Redis) -> list[int]:
    """[the Redis server's pid] when it runs on this machine (it says its pid, and /proc
    has a redis-server of that pid), else [] (REDIS_URL elsewhere: its memory is not seen)."""
    pid = int(conn.info("server").get("process_id", 0))
    try:
        return [pid] if pid and "redis" in psutil.Process(pid).name() else []
    except psutil.Error:
        return []


def threads_and_sockets(pids: list[int]) -> tuple[int, int]:
    """Threads and open sockets of `pids`, summed."""
    threads = sockets = 0
    for pid in pids:
        process = psutil.Process(pid)
        threads += process.num_threads()
        sockets += len(process.net_connections(kind="all"))
    return threads, sockets


def cpu_seconds(pids: list[int]) -> float:
    times = [psutil.Process(pid).cpu_times() for pid in pids]
    return sum(t.user + t.system for t in times)


def measure(
    side: Side, fake: FakeModelProcess, runs: int, settle: float = 0.0
) -> tuple[Burst, str | None]:
    """One burst of `side`; also what the fake answered meanwhile (None when as scripted).
    `settle`: seconds left to the side, idle, before its memory at rest is read."""
    fake.chat_counts()  # forget what came before
    time.sleep(settle)
    for pid in side.pids:
        common.reset_peak_rss(pid)
    rest = sum(common.rss_kib(pid) for pid in side.pids)
    redis_rest = sum(common.rss_kib(pid) for pid in side.redis_pids)
    bot_rest = sum(common.rss_kib(pid) for pid in side.bot_pids)
    threads, sockets = threads_and_sockets(side.worker_pids)
    cpu, fake_cpu = cpu_seconds(side.pids), cpu_seconds([fake.pid])
    timed = side.burst()
    burst = Burst(
        rest_kib=rest,
        peak_kib=sum(common.peak_rss_kib(pid) for pid in side.pids),
        cpu_seconds=cpu_seconds(side.pids) - cpu,
        fake_cpu_seconds=cpu_seconds([fake.pid]) - fake_cpu,
        seconds=timed["seconds"],
        requeues=int(timed.get("requeues", 0)),
        lease_warnings=int(timed.get("lease_warnings", 0)),
        submit_seconds=timed.get("submit_seconds", 0.0),
        redis_rest_kib=redis_rest,
        bot_rest_kib=bot_rest,
        rest_threads=threads,
        rest_sockets=sockets,
    )
    counts = fake.chat_counts()
    burst.at_model = int(counts["peak_in_flight"])
    expected = {turn: runs for turn in range(MODEL_CALLS)}
    problem = None
    if counts["by_turn"] != expected or counts["script_errors"]:
        problem = f"the fake answered {counts} (expected {runs} of each of turns 0-3)"
    return burst, problem


# --- running and reporting -------------------------------------------------------------------


@dataclass
class Plan:
    runs: int
    delay: float
    rounds: int
    processes: int
    concurrency: int
    peers: list[str]
    large: bool
    settle: float = 0.0
    pool: str | None = None  # the workers' --pool; None: their default

    @property
    def ideal(self) -> float:
        return MODEL_CALLS * self.delay


def plan(args: argparse.Namespace) -> Plan:
    large = args.large
    runs = args.runs or (1000 if large else 100)
    processes = args.processes or (4 if large else 1)
    return Plan(
        runs=runs,
        delay=args.delay if args.delay is not None else (2.0 if large else 0.5),
        rounds=args.rounds or (1 if large else 3),
        processes=processes,
        concurrency=0 if args.defaults else args.concurrency or math.ceil(runs / processes),
        peers=[] if large or args.peers == "none" else args.peers.split(","),
        large=large,
        settle=args.settle,
        pool=args.pool,
    )


def worker_args(concurrency: int) -> list[str]:
    """`--concurrency N` (N RQ loops in threads per worker process) when the worker has it;
    nothing for 0 (`--defaults`: the worker's own default)."""
    if not concurrency:
        return []
    if common.worker_has_option("--concurrency"):
        return ["--concurrency", str(concurrency)]
    if concurrency > 1:
        raise SystemExit(
            "this `switchboard worker` has no --concurrency option: use --processes N "
            "--concurrency 1 (N = --runs) to try the harness"
        )
    return []


def mib(kib: float) -> str:
    return f"{kib / 1024:6.1f} MiB"


def burst_row(label: str, b: Burst, note: str = "") -> None:
    row(
        label,
        f"{b.seconds:6.2f} s   peak RSS {mib(b.peak_kib)} (at rest {b.rest_kib / 1024:.1f})   "
        f"{b.at_model} at the model, {b.per_gib():5.0f}/GiB   CPU {b.cpu_seconds:4.1f} s "
        f"(fake model {b.fake_cpu_seconds:.1f}){note}",
    )


def against_faster_peer(bursts: dict[str, Burst]) -> tuple[str, float, float] | None:
    """(the faster peer, Switchboard's time / its time, Switchboard's peak RSS / its peak)."""
    peers = [name for name in bursts if name != SwitchboardSide.name]
    if not peers:
        return None
    peer = min(peers, key=lambda name: bursts[name].seconds)
    sb, other = bursts[SwitchboardSide.name], bursts[peer]
    return peer, sb.seconds / other.seconds, sb.peak_kib / other.peak_kib


def ratio_row(label: str, versus: tuple[str, float, float]) -> None:
    peer, t, r = versus
    row(label, f"time {t:5.2f}x   peak RSS {r:5.2f}x   (faster peer: {peer})")


def run_rounds(
    p: Plan, tmp: Path, url: str, keep_logs: str | None
) -> tuple[dict[str, list[Burst]], list[str], int]:
    """Start the sides, warm them up, run the rounds. Returns each side's bursts, the rounds
    where the fake did not answer as scripted, and the sweeper's re-queues in all."""
    results: dict[str, list[Burst]] = {}
    problems: list[str] = []
    sides: list[Side] = []
    fake = FakeModelProcess(validate=False, delay=p.delay)
    slack = FakeSlack().start()
    try:
        conn = redis.Redis.from_url(url)
        rt = make_runtime(conn, fake.url)
        flags = worker_args(p.concurrency) + (["--pool", p.pool] if p.pool else [])
        bot_env = worker_env(
            url,
            fake.url,
            tmp,
            SLACK_BOT_TOKEN="xoxb-bench",
            SLACK_API_URL=slack.url,
            SLACK_SIGNING_SECRET="bench-signing-secret",
        )
        bot = BotProcess(bot_env, tmp / "bot.log")
        try:
            workers = common.switchboard_workers(p.processes, url, fake.url, tmp, *flags)
        except BaseException:
            bot.stop()
            raise
        sides.append(SwitchboardSide(rt, workers, bot, p.runs))
        common.wait_for_workers(conn, rt.queue.name, p.processes)
        PeerSide.write_task(tmp)
        sides += [PeerSide(kind, fake.url, p.runs, tmp) for kind in p.peers]
        row(
            "burst",
            f"{p.runs:,} fee questions x {MODEL_CALLS} model calls, {p.delay:g} s each: "
            f"ideal {p.ideal:.2f} s",
        )
        row(
            "Switchboard",
            f"{p.processes} x `switchboard worker {' '.join(flags) or '(defaults)'}`"
            " + `switchboard bot --http` (idle: runs submitted here)",
        )
        for side in sides[1:]:
            row(side.name, f"1 process, {p.runs:,} runs under asyncio.gather")
        sides[0].burst()  # warm-up (each peer warmed up with a burst in its child)
        for i in range(p.rounds):
            this_round: dict[str, Burst] = {}
            for side in sides if i % 2 == 0 else reversed(sides):
                burst, problem = measure(side, fake, p.runs, p.settle)
                this_round[side.name] = burst
                results.setdefault(side.name, []).append(burst)
                if problem:
                    problems.append(f"round {i + 1}, {side.name}: {problem}")
                note = ""
                if side is sides[0]:
                    note = (
                        f"   submits {burst.submit_seconds:.2f} s, re-queued {burst.requeues} "
                        f"(lease warnings {burst.lease_warnings}), "
                        f"at rest: workers {burst.worker_rest_kib / 1024:.1f} "
                        f"+ bot {burst.bot_rest_kib / 1024:.1f} "
                        f"+ Redis {burst.redis_rest_kib / 1024:.1f} MiB, "
                        f"{burst.rest_threads} threads, {burst.rest_sockets} sockets"
                    )
                burst_row(f"round {i + 1}: {side.name}", burst, note)
            versus = against_faster_peer(this_round)
            if versus:
                ratio_row(f"round {i + 1}: Switchboard / faster peer", versus)
    finally:
        for side in sides:
            side.stop()
        fake.stop()
        slack.stop()
        logs = sorted(tmp.glob("worker-*.log"))
        requeues = sum(common.count_log_events(log, "sweeper_requeue") for log in logs)
        warned = sum(common.count_log_events(log, e) for log in logs for e in LEASE_WARNINGS)
        if (requeues or warned) and not keep_logs:  # kept unasked: what led to them is there
            keep_logs = tempfile.mkdtemp(prefix="bench-latency-logs-")
            print(f"   worker logs kept in {keep_logs} (re-queues or lease warnings)")
        if keep_logs:
            Path(keep_logs).mkdir(parents=True, exist_ok=True)
            for log in logs:
                shutil.copy(log, keep_logs)
    return results, problems, requeues


def report(
    p: Plan, results: dict[str, list[Burst]], problems: list[str], requeues: int
) -> dict[str, Any]:
    """Print the medians, the ratios and the RESULT line; return the figures."""
    medians = {
        name: Burst(
            seconds=median([b.seconds for b in bursts]),
            rest_kib=round(median([b.rest_kib for b in bursts])),
            peak_kib=round(median([b.peak_kib for b in bursts])),
            cpu_seconds=median([b.cpu_seconds for b in bursts]),
            fake_cpu_seconds=median([b.fake_cpu_seconds for b in bursts]),
            requeues=sum(b.requeues for b in bursts),
            submit_seconds=median([b.submit_seconds for b in bursts]),
            at_model=round(median([b.at_model for b in bursts])),
        )
        for name, bursts in results.items()
    }
    for name, m in medians.items():
        burst_row(f"{name} (median)", m, f"   = {m.seconds / p.ideal:.2f}x ideal")
    row("sweeper re-queues (warm-up and rounds)", f"{requeues}   target 0")
    for problem in problems:
        row("MODEL CALLS NOT AS SCRIPTED", problem)
    if not problems:
        row("model calls per run (counted on the fake)", f"{MODEL_CALLS}, every run of every side")
    sb = medians[SwitchboardSide.name]
    per_gib = sb.per_gib()
    figures: dict[str, Any] = {
        "plan": asdict(p),
        "rounds": {name: [asdict(b) for b in bursts] for name, bursts in results.items()},
        "medians": {
            name: {**asdict(m), "runs_per_gib": m.per_gib()} for name, m in medians.items()
        },
        "sweeper_requeues": requeues,
        "model_call_problems": problems,
    }
    requeue_verdict = f"sweeper re-queues {requeues} (target 0: {common.verdict(requeues == 0)})"
    limit_target = LARGE_LIMIT_TARGET if p.runs >= 1000 else LIMIT_TARGET
    of_limit = sb.seconds / p.ideal
    limit_verdict = (
        f"{of_limit:.2f}x the ideal {p.ideal:g} s (issue 28: <= {limit_target}x: "
        f"{common.verdict(of_limit <= limit_target)})"
    )
    versus = against_faster_peer(medians)
    if versus is None:
        print(
            f"RESULT latency ({p.runs:,} runs, {p.processes} x {p.concurrency or 'default'}): "
            f"last answer after {sb.seconds:.2f} s = {limit_verdict}; "
            f"peak RSS {sb.peak_kib / 1024:.1f} MiB in all = {per_gib:.0f} runs in flight/GiB; "
            f"{requeue_verdict}"
        )
        return figures
    peer, time_ratio, rss_ratio = versus
    for name, other in medians.items():
        if name != SwitchboardSide.name:
            row(
                f"Switchboard / {name} (medians)",
                f"time {sb.seconds / other.seconds:5.2f}x   "
                f"peak RSS {sb.peak_kib / other.peak_kib:5.2f}x",
            )
    ratio_row("Switchboard / faster peer (medians)", versus)
    row("  target", f"time <= {TIME_TARGET}x, peak RSS <= {RSS_TARGET}x")
    row(
        "Switchboard runs in flight (at the model) per GiB",
        f"{per_gib:5.0f}   target >= {PER_GIB_TARGET}",
    )
    figures.update(faster_peer=peer, time_ratio=time_ratio, rss_ratio=rss_ratio)
    print(
        f"RESULT latency: last answer after {sb.seconds:.2f} s = {limit_verdict}; "
        f"Switchboard/{peer} time = {time_ratio:.2f}x (issue 28: <= {PEER_TARGET}x: "
        f"{common.verdict(time_ratio <= PEER_TARGET)}; issue 5: <= {TIME_TARGET}x: "
        f"{common.verdict(time_ratio <= TIME_TARGET)}); peak RSS = {rss_ratio:.2f}x (target <= "
        f"{RSS_TARGET}x: {common.verdict(rss_ratio <= RSS_TARGET)}); {per_gib:.0f} runs in "
        f"flight/GiB (target >= {PER_GIB_TARGET}: {common.verdict(per_gib >= PER_GIB_TARGET)}); "
        f"{requeue_verdict}"
    )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, help="runs per burst (100; --large 1,000)")
    parser.add_argument("--delay", type=float, help="seconds per model call (0.5; --large 2)")
    parser.add_argument("--rounds", type=int, help="measured bursts per side (3; --large 1)")
    parser.add_argument("--processes", type=int, help="Switchboard worker processes (1; 4)")
    parser.add_argument("--concurrency", type=int, help="runs per worker (runs / processes)")
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="the worker's default settings: no --concurrency (runs may wait for a slot)",
    )
    parser.add_argument("--peers", default="agents,langgraph", help="comma-separated, or none")
    parser.add_argument("--large", action="store_true", help="1,000 runs, 4 x 250, 2 s, no peers")
    parser.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="seconds idle before each burst's memory at rest is read (a worker gives its "
        "free memory back within a turn of its main loop, 0.2 s, of going idle)",
    )
    parser.add_argument(
        "--pool",
        choices=("gevent", "threads"),
        help="the workers' --pool (default: theirs, SWITCHBOARD_WORKER_POOL's default)",
    )
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy the worker logs to DIR")
    args = parser.parse_args()
    p = plan(args)
    if p.concurrency and p.processes * p.concurrency < p.runs:
        parser.error(f"{p.processes} x {p.concurrency} slots < {p.runs} runs: not all in flight")

    common.banner(
        f"bench_latency: time to the last answer, {p.runs:,} runs in flight, "
        f"{p.delay * 1000:.0f} ms per model call"
    )
    common.quiet_switchboard_logs()
    with common.workdir("bench-latency-") as tmp, common.redis_server(tmp) as url:
        results, problems, requeues = run_rounds(p, tmp, url, args.keep_logs)
    common.dump_json(args.json, report(p, results, problems, requeues))
    return 0


if __name__ == "__main__":
    sys.exit(main())
