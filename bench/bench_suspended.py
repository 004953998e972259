"""Suspended runs: 10,000 runs awaiting approval — Redis memory, workers held, resume latency.

Each run asks to file a ticket: the fake model proposes `create_ticket` (a write), the worker
creates the approval request, schedules its expiry job and suspends the run. All 10,000 go
through the real loop: this process submits them (service.submit, as the bot does) and two
`python -m switchboard worker` processes (env as tests/support/processes.worker_env, production
lease/sweep timers) take each as far as the approval.

1. Redis memory per suspended run: INFO used_memory after minus before, / N. Reported twice:
   right after the last run suspended, and at steady state — without the records of
   finished jobs RQ keeps for result_ttl=60 s, if any (removed here the way their TTL would;
   a worker keeps none of a run's `advance` jobs: worker/process.py). A breakdown by key
   (MEMORY USAGE on a sample) shows where the bytes are.
   Baseline ratio: the same measurement for a bare RQ job parked with enqueue_in (what
   merely keeping one piece of deferred work in RQ costs).
2. Workers held while the runs wait: run lease keys and worker slots RQ reports busy —
   target 0 (jobs in StartedJobRegistry and queued jobs are printed too).
3. Resume latency, from the click (issue 28): the real bot — `python -m switchboard bot
   --http` in its own process, uvicorn serving the Bolt app at /slack/events — and two new
   worker processes (as above, now with SLACK_BOT_TOKEN and SLACK_API_URL set: they report to
   Slack), Slack's Web API being tests/fakes' FakeSlack (in this process). 210 tickets are
   asked in Slack (signed app_mention events posted to the bot, as UALICE); a worker posts each
   approval card in its thread through FakeSlack. The policy is the default one (as
   tests.support.runtime.make_runtime's; no SWITCHBOARD_POLICY): create_ticket is approved by
   its requester, so UALICE clicks. Each click is a block_actions payload built by
   tests/fakes (slack_events.block_actions) from the card as FakeSlack holds it — the Approve
   button's action_id, value and block_id, the card message, a new trigger_id — signed with
   the signing secret (X-Slack-Signature, X-Slack-Request-Timestamp) and POSTed over a new
   loopback connection. Latency = time.time() as that request is sent (after signing) to the
   `at` of the run's `write_started` event (time.time() in the worker, rounded to 1 ms): the
   approved tool starting. One click at a time, with idle workers: before the next click the
   run has ended, the bot has redrawn the card, no job is queued or running. The first 10
   clicks are a warm-up. Also printed, for the same clicks: decision -> tool start (from the
   approval's decided_at, Redis TIME in the decision script: this figure before issue 28), and
   where the time goes — the bot's HTTP 200, decided_at, write_started (a run's `advance` job
   keeps no RQ record of its start: worker/process.py) — and the CPU each process used
   per click (/proc; the whole resumed run, to its answer). Every timestamp is this machine's
   CLOCK_REALTIME (time.time or datetime.now in each process, Redis TIME in Redis), so they
   compare across processes. Baseline, alternated click by click: raw RQ enqueue -> job start
   (job.started_at) of a no-op job on the same idle workers and queue. Target p99 <= 25 ms.
   `--profile DIR`: py-spy (`record --format raw`) of the bot and each worker during the
   measured clicks, one file each.

    python bench/bench_suspended.py              # 10,000 suspended runs, 200 clicks
    python bench/bench_suspended.py -n 1000      # quicker; per-run bytes scale linearly
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import common
import psutil
import redis
from common import TICKET_QUESTION, BotProcess, FakeModelProcess, median, percentile, row
from rq import Queue, worker_registration
from rq.job import Job
from rq.registry import FinishedJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from approvals import ApprovalStatus
from bot.render.blocks import APPROVE
from tests.fakes.slack_events import BOT_USER_ID
from tests.fakes.slack_server import (
    FakeSlack,
    app_mention,
    block_actions,
    event_callback,
    form_payload,
    send_signed,
    signed_headers,
)
from tests.support.processes import worker_env
from tests.support.runtime import ALICE, make_runtime
from worker import service
from worker.events import EventKind, is_run_end
from worker.run import RunStatus
from worker.runtime import Runtime
from worker.service import Access

TARGET_BYTES = 8 * 1024
TARGET_P99_MS = 25.0  # from the click (issue 28)
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
    """Workers of the queue RQ reports busy (as Worker.all + get_state, in two round trips
    instead of one per worker: there are --concurrency of them per process)."""
    keys = sorted(worker_registration.get_keys(queue=rt.queue))
    pipe = rt.redis.pipeline(transaction=False)
    for key in keys:
        pipe.hget(key, "state")
    return sum(1 for state in pipe.execute() if state == b"busy")


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


# --- resume: a signed click on the card, through the real bot ------------------------------

SECRET = "bench-signing-secret"
TOKEN = "xoxb-bench"
CHANNEL = ALICE.channel_id
ASKER = ALICE.user_id  # asks; under the default policy (make_runtime's) she approves her own
WARM_CLICKS = 10  # clicked first and not counted (the bot's first requests, connections)


@dataclass(frozen=True)
class Card:
    """An approval card as the worker posted it in the asker's thread (FakeSlack holds it)."""

    run_id: str
    approval_id: str  # the Approve button's value, as rendered on the card
    block_id: str  # the block the button is in
    button: dict[str, Any]  # the button as rendered
    message: dict[str, Any]  # the card message, which Slack sends back with a click
    thread_ts: str


def approve_button(message: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(block_id, the button) of the message's Approve button, if it has one."""
    for block in message.get("blocks") or []:
        for element in block.get("elements") or []:
            if element.get("type") == "button" and element.get("action_id") == APPROVE:
                return str(block.get("block_id", "")), element
    return None


def ask_in_slack(
    rt: Runtime, bot: BotProcess, slack: FakeSlack, n: int
) -> tuple[list[Card], float]:
    """Ask for n tickets as ASKER mentioning the bot (signed app_mention events posted to
    /slack/events, each message also stored in FakeSlack's channel), and wait until every run
    awaits approval with its card in its thread, posted by a worker through FakeSlack's
    chat.postMessage, and its status message shows the wait. Returns the cards (in the order
    asked) and the seconds it took."""
    waiting = rt.store.keys.status(RunStatus.AWAITING_APPROVAL)
    already = rt.redis.zcard(waiting)
    started = time.perf_counter()
    threads: list[str] = []
    for _ in range(n):
        text = f"<@{BOT_USER_ID}> {TICKET_QUESTION}"
        ts = slack.add_message(CHANNEL, text, user=ASKER)
        answer = send_signed(bot.url, SECRET, event_callback(app_mention(text, ASKER, CHANNEL, ts)))
        if answer.status != 200:
            raise RuntimeError(f"the bot answered a mention with {answer.status}: {answer.body}")
        threads.append(ts)
    common.wait_until(lambda: rt.redis.zcard(waiting) - already >= n, 300, f"{n} cards' runs")

    def all_cards() -> dict[str, dict[str, Any]]:
        found = {
            str(m["thread_ts"]): m
            for m in slack.messages(CHANNEL)
            if m.get("thread_ts") in asked and approve_button(m) is not None
        }
        return found if len(found) == n else {}

    asked = set(threads)
    by_thread = common.wait_until(all_cards, 60, f"{n} approval cards in FakeSlack")
    common.wait_until(lambda: rt.queue.count == 0 and _busy(rt) == 0, 60, "idle workers")
    cards = []
    access = Access.of(rt)
    for ts in threads:
        message = by_thread[ts]
        found = approve_button(message)
        assert found is not None
        block_id, button = found
        approval_id = str(button["value"])
        request = rt.approvals.get(approval_id)  # the store agrees: this card, this request
        assert {"channel": CHANNEL, "ts": message["ts"]} in request.cards, request.cards
        assert request.status == ApprovalStatus.PENDING and request.tool == "create_ticket"
        assert access.may_decide(request, ASKER, frozenset(ALICE.roles)), "not an approver"
        assert "confirm" not in button  # no dialog first (not high-risk, nothing cut)
        cards.append(Card(request.run_id, approval_id, block_id, button, message, ts))
    # the last held-back status update ("Waiting for approval") of each run is out
    for card in cards:
        status_ts = rt.store.load(card.run_id).origin.get("status_ts", "")
        if not status_ts:
            continue
        common.wait_until(
            lambda ts=status_ts: "approval" in str((slack.message(CHANNEL, ts) or {}).get("text")),
            30,
            "status messages",
        )
    return cards, time.perf_counter() - started


def send_click(port: int, body: str) -> tuple[float, float]:
    """POST the signed click to /slack/events over a new loopback connection (TCP_NODELAY,
    as bench_ack.py). Signed first, as Slack signs before it sends; the clock starts as the
    connection opens. Returns (time.time() then, ms until the bot's HTTP 200 was read)."""
    headers = signed_headers(SECRET, body)
    data = body.encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    sent = time.time()
    started = time.perf_counter()
    try:
        connection.connect()
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.request("POST", "/slack/events", body=data, headers=headers)
        response = connection.getresponse()
        response.read()
        acked = (time.perf_counter() - started) * 1000
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"the bot answered a click with {response.status}")
    return sent, acked


class CpuMeter:
    """CPU seconds (user + system) of groups of processes, from /proc; a child process's
    (e.g. a worker's RQ scheduler) count with its parent's, except for this process."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups: dict[str, list[psutil.Process]] = {}
        for name, pids in groups.items():
            with contextlib.suppress(psutil.NoSuchProcess):  # e.g. a Redis on another host
                self.groups[name] = [psutil.Process(pid) for pid in pids]
        self.used = dict.fromkeys(self.groups, 0.0)

    def read(self) -> dict[str, float]:
        seconds = {}
        for name, processes in self.groups.items():
            total = 0.0
            for proc in processes:
                with contextlib.suppress(psutil.NoSuchProcess):
                    own = proc.pid == os.getpid()  # its children are the ones measured
                    for each in [proc] if own else [proc, *proc.children(recursive=True)]:
                        times = each.cpu_times()
                        total += times.user + times.system
            seconds[name] = total
        return seconds

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Add what the processes use meanwhile to `used`."""
        before = self.read()
        yield
        for name, value in self.read().items():
            self.used[name] += value - before[name]


@dataclass(frozen=True)
class Click:
    """One measured click; times are time.time()-style seconds on this machine's clock."""

    sent: float  # the signed request leaves this process (time.time, here)
    ack_ms: float  # until the bot's HTTP 200 was read (perf_counter, here)
    decided: float  # the approval's decided_at (Redis TIME, in the decision script)
    tool_started: float  # the run's write_started event `at` (in a worker; rounded to 1 ms)

    @property
    def total_ms(self) -> float:
        return (self.tool_started - self.sent) * 1000

    @property
    def from_decision_ms(self) -> float:
        return (self.tool_started - self.decided) * 1000

    def stages(self) -> dict[str, float]:
        return {
            "click -> bot's HTTP 200 (ack)": self.ack_ms,
            "click -> decided (decided_at)": (self.decided - self.sent) * 1000,
            "decided -> tool started (write_started)": self.from_decision_ms,
        }


def click_to_tool_start(
    rt: Runtime, bot: BotProcess, slack: FakeSlack, card: Card, meter: CpuMeter | None = None
) -> Click:
    """Click Approve on `card` as ASKER (a signed block_actions payload as Slack posts it: the
    card's own button value, block and message, a new trigger_id), follow the run to its end,
    and wait until everything is idle again: the bot has redrawn the card, no job is queued
    or running. `meter` counts the CPU used from the click until the run ended and the card
    was redrawn."""
    form = block_actions(
        APPROVE,
        card.approval_id,
        user_id=ASKER,
        channel=CHANNEL,
        message_ts=str(card.message["ts"]),
        block_id=card.block_id,
        thread_ts=card.thread_ts,
        message=card.message,
    )
    payload = json.loads(dict(parse_qsl(form))["payload"])
    for name in ("text", "style"):  # the action as Slack reports it: the button's own
        if name in card.button:
            payload["actions"][0][name] = card.button[name]
    body = form_payload(payload)
    last = rt.events.read(card.run_id)[-1].id

    def redrawn() -> bool:
        return approve_button(slack.message(CHANNEL, str(card.message["ts"])) or {}) is None

    tool_started = None
    with meter.counting() if meter else contextlib.nullcontext():
        sent, ack_ms = send_click(bot.port, body)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # follow the run's events until it ends
            for event in rt.events.wait(card.run_id, last, 5000):
                last = event.id
                if event.kind == EventKind.WRITE_STARTED:
                    tool_started = float(event.at)
                if is_run_end(event.kind):
                    deadline = 0
        common.wait_until(redrawn, 30, "the bot to redraw the card")
    if tool_started is None:
        raise RuntimeError(f"run {card.run_id}: no write_started event after the click")
    request = rt.approvals.get(card.approval_id)
    assert request.status == ApprovalStatus.APPROVED and request.decided_by == ASKER, request
    assert request.decided_at > 0
    common.wait_until(lambda: rt.queue.count == 0 and _busy(rt) == 0, 30, "idle workers")
    return Click(
        sent=sent, ack_ms=ack_ms, decided=float(request.decided_at), tool_started=tool_started
    )


@contextlib.contextmanager
def profiled(folder: str | None, processes: dict[str, int]) -> Iterator[None]:
    """With a folder: `py-spy record --format raw` on each process meanwhile (stopped with
    SIGINT after), one file per process."""
    if not folder:
        yield
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    spies = [
        subprocess.Popen(
            [
                *("py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "250"),
                *("--output", str(Path(folder) / f"{name}.txt")),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in processes.items()
    ]
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            spy.wait(60)


def rq_start_latency(rt: Runtime) -> float:
    """Baseline: enqueue a no-op on the same queue and idle workers; ms to job.started_at."""
    enqueued = time.time()
    job_id = rt.queue.enqueue_call("bench.common.noop", result_ttl=60).id

    def finished() -> bool:
        return Job.fetch(job_id, connection=rt.redis, serializer=JSONSerializer).is_finished

    common.wait_until(finished, 30, "no-op job")
    job = Job.fetch(job_id, connection=rt.redis, serializer=JSONSerializer)
    assert job.started_at is not None
    common.wait_until(lambda: _busy(rt) == 0, 30, "idle workers")
    return (job.started_at.timestamp() - enqueued) * 1000


def measure_resume(
    rt: Runtime, redis_url: str, fake: FakeModelProcess, tmp: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Section 3: the bot and workers that report to Slack, cards asked through the bot,
    `args.decisions` clicks measured one at a time, each followed by one raw RQ no-op job on
    the same workers (the baseline). Prints its rows; returns its figures."""
    folder = tmp / "slack"
    folder.mkdir()
    with FakeSlack() as slack:
        extra = {"SLACK_BOT_TOKEN": TOKEN, "SLACK_API_URL": slack.url}
        env = worker_env(
            redis_url,
            fake.url,
            folder,
            **common.PRODUCTION_TIMERS,
            **extra,
            SLACK_SIGNING_SECRET=SECRET,
            # one person asks every question here: no per-person limits on asking
            SWITCHBOARD_USER_RUNS_PER_MINUTE="0",
            SWITCHBOARD_USER_RUNS_IN_FLIGHT="0",
        )
        workers = common.switchboard_workers(args.workers, redis_url, fake.url, folder, **extra)
        bot: BotProcess | None = None
        try:
            common.wait_for_workers(rt.redis, rt.queue.name, args.workers)
            bot = BotProcess(env, folder / "bot.log")
            total = WARM_CLICKS + args.decisions
            cards, asked_s = ask_in_slack(rt, bot, slack, total)
            row(
                "approval cards asked through the bot",
                f"{total} in {asked_s:.1f} s (signed mentions; bot pid {bot.pid}, "
                f"{args.workers} new workers with Slack)",
            )
            for card in cards[:WARM_CLICKS]:
                click_to_tool_start(rt, bot, slack, card)
            pids = {"bot": bot.pid} | {f"worker-{i}": w.pid for i, w in enumerate(workers)}
            meter = CpuMeter(
                {
                    "bot": [bot.pid],
                    "workers": [w.pid for w in workers],
                    "redis-server": [int(rt.redis.info("server")["process_id"])],
                    "fake model": [fake.pid],
                    "this process (FakeSlack, polling)": [os.getpid()],
                }
            )
            clicks: list[Click] = []
            base: list[float] = []
            load_before = os.getloadavg()[0]
            with profiled(args.profile, pids):
                for card in cards[WARM_CLICKS:]:  # alternately: a click, a raw RQ job
                    clicks.append(click_to_tool_start(rt, bot, slack, card, meter))
                    base.append(rq_start_latency(rt))
            load_after = os.getloadavg()[0]
        finally:
            if bot is not None:
                bot.stop()
            for w in workers:
                w.stop()
    total_ms = [c.total_ms for c in clicks]
    from_decision = [c.from_decision_ms for c in clicks]
    figures: dict[str, Any] = {
        "from": "a signed Approve click sent to the bot's /slack/events",
        "clicks": len(clicks),
        **spread(total_ms),
        "decision": spread(from_decision),
        "rq": spread(base),
    }
    row(
        f"resume, click -> tool start, {len(clicks)} clicks",
        f"{spread_text(total_ms)}   target p99 <= {TARGET_P99_MS:.0f} ms",
    )
    row("resume, decision -> tool start (same clicks)", spread_text(from_decision))
    row("baseline: raw RQ enqueue -> job start", spread_text(base))
    row(
        "ratio click->tool start / raw RQ start",
        f"p50 {figures['p50'] / figures['rq']['p50']:5.1f}x   "
        f"p99 {figures['p99'] / figures['rq']['p99']:5.1f}x",
    )
    figures["stages"] = where_the_time_goes(clicks)
    cpu = {name: seconds * 1000 / len(clicks) for name, seconds in meter.used.items()}
    row(
        "CPU per click, click to run end + redraw (ms)",
        ", ".join(f"{name} {ms:.1f}" for name, ms in cpu.items()),
    )
    figures["cpu_ms_per_click"] = cpu
    row(
        "load average (1 min), clicks' start / end",
        f"{load_before:.2f} / {load_after:.2f} on {os.cpu_count()} cores (a shared machine: "
        "the tail moves with it)",
    )
    figures["load_average"] = [load_before, load_after]
    return figures


def spread(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def spread_text(values: list[float]) -> str:
    s = spread(values)
    return (
        f"p50 {s['p50']:6.1f} ms   p90 {s['p90']:6.1f} ms   p99 {s['p99']:6.1f} ms   "
        f"max {s['max']:6.1f} ms"
    )


def where_the_time_goes(clicks: list[Click]) -> dict[str, dict[str, float]]:
    """Each stage's spread over all clicks, and its mean over all clicks and over the slowest
    5 % (at or above the 95th percentile of click -> tool start)."""
    cutoff = percentile([c.total_ms for c in clicks], 95)
    slow = [c for c in clicks if c.total_ms >= cutoff]
    print(
        f"   where the time goes (ms){'':<20} {'p50':>6} {'p90':>6} {'p99':>6} {'max':>6}"
        f"   {'mean':>6} {'mean of slowest 5 %':>20}"
    )
    figures: dict[str, dict[str, float]] = {}
    for name in clicks[0].stages():
        values = [c.stages()[name] for c in clicks]
        s = spread(values)
        mean = statistics.fmean(values)
        slow_mean = statistics.fmean(c.stages()[name] for c in slow)
        figures[name] = {**s, "mean": mean, "mean_slowest_5pct": slow_mean}
        print(
            f"     {name:<40} {s['p50']:6.1f} {s['p90']:6.1f} {s['p99']:6.1f} {s['max']:6.1f}"
            f"   {mean:6.1f} {slow_mean:20.1f}"
        )
    total = statistics.fmean(c.total_ms for c in slow)
    print(f"     {'(slowest 5 %: ' + str(len(slow)) + ' clicks, mean total)':<40} {total:6.1f}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10_000, help="runs to suspend")
    parser.add_argument("--decisions", type=int, default=200, help="clicks measured")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument(
        "--profile", metavar="DIR", help="py-spy the bot and workers during the clicks (raw)"
    )
    args = parser.parse_args()

    common.banner(f"bench_suspended: {args.n:,} runs awaiting approval")
    common.quiet_switchboard_logs()
    figures: dict[str, Any] = {}
    with common.workdir("bench-suspended-") as tmp, common.redis_server(tmp) as url:
        fake = FakeModelProcess(validate=False)
        conn = redis.Redis.from_url(url)
        rt = make_runtime(conn, fake.url)
        # measured while nothing else writes to this Redis: beside the idle workers, their
        # registry cleaning or an expiring record moved used_memory by more than 1,000 jobs'
        # worth (it read -816 and 3 bytes a job)
        baseline_parked = rq_parked_job_bytes(conn, 1000)
        try:
            workers = common.switchboard_workers(args.workers, url, fake.url, tmp)
            try:
                common.wait_for_workers(conn, rt.queue.name, args.workers)
                # warm the workers (imports, BM25 index, connections) and the Redis structures
                warm, _ = suspend_runs(rt, 20)
                for run_id in warm:
                    service.cancel(rt, run_id, by=ALICE.user_id, roles=frozenset(ALICE.roles))
                common.wait_until(lambda: rt.queue.count == 0 and _busy(rt) == 0, 60, "warm-up")
                drop_finished_job_records(rt)

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
                workers_held = holding["run lease keys"] + holding["busy workers"]
            finally:
                for w in workers:
                    w.stop()
            resume = measure_resume(rt, url, fake, tmp, args)
            figures["resume_ms"] = resume
            still = conn.zcard(rt.store.keys.status(RunStatus.AWAITING_APPROVAL))
            scheduled = ScheduledJobRegistry(queue=rt.queue).count
            row("runs still awaiting approval", f"{still:,} (scheduled expiry jobs: {scheduled:,})")
        finally:
            fake.stop()
    p50, p99, b99 = resume["p50"], resume["p99"], resume["rq"]["p99"]
    print(
        f"RESULT suspended: {per_run / 1024:.2f} KiB/run = {per_run / baseline_parked:.2f}x a "
        f"parked RQ job (target <= 8 KiB: {common.verdict(per_run <= TARGET_BYTES)}); workers held "
        f"{workers_held} (target 0: {common.verdict(workers_held == TARGET_HELD)}); resume from "
        f"the click to tool start p50 {p50:.1f} ms, p99 {p99:.1f} ms = {p99 / b99:.1f}x raw RQ "
        f"start p99 (target p99 <= {TARGET_P99_MS:.0f} ms: {common.verdict(p99 <= TARGET_P99_MS)})"
    )
    common.dump_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
