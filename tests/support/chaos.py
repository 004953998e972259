"""The chaos soak: a real stack under a steady load while a seeded schedule of faults runs,
then invariants checked on what Redis, the tools' own records and the Slack fake recorded:
no run lost, no write run twice, every decision on its card, every run that ended told so in
its thread.

Run by bench/chaos_soak.py (minutes, a report) and by tests/test_chaos.py (60 s, in the
suite). The stack: Redis primary + replica + Sentinel (Debian's redis-server and
redis-sentinel; tests/support/sentinel_group.py), `switchboard bot --http` and several
`switchboard worker` processes on `redis+sentinel://`, FakeOpenAI and FakeSlack in this
process. People ask over signed HTTP (app_mention events) and decide over signed clicks and
modal submissions, as Slack would send them.

Phases: calm (load, no faults: the baseline), chaos (load and faults), drain (no new
questions, no faults: everything must settle). A fault is one of `KINDS`, at a time and
with parameters drawn from `random.Random(seed)` up front, so the schedule is printed before
anything starts and the same seed gives the same schedule. Faults overlap: each runs in its
own thread; the Redis ones take turns (a paused server is not also restarted).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import redis

from bot.render.blocks import (
    APPROVE,
    EDIT,
    EDIT_MODAL,
    REJECT,
    REJECT_MODAL,
    REJECT_REASON_BLOCK,
    REJECT_REASON_INPUT,
    VIEW_RUN,
)
from tests.fakes.openai_server import FakeOpenAI, Fault, Script, Turn, conversation_key
from tests.fakes.slack_events import (
    app_mention,
    block_actions,
    event_callback,
    send_signed,
    view_submission,
)
from tests.fakes.slack_server import FakeSlack
from tests.support import chaos_tools, sentinel_group
from tests.support.processes import ROOT, WorkerProcess, worker_env
from tests.support.redis_server import free_port
from tests.support.slack_bot import buttons

SECRET = "chaos-signing-secret"
TOKEN = "xoxb-chaos"
MODEL_TIMEOUT = 4.0
SLACK_METHODS = ("chat.postMessage", "chat.update", "views.open", "chat.postEphemeral")
REDIS_KINDS = ("redis_pause", "redis_sigstop", "redis_debug_sleep", "redis_restart", "failover")
PROCESS_KINDS = ("worker_kill9", "worker_term", "bot_kill9", "bot_term")
MODEL_KINDS = ("model_5xx", "model_429", "model_hang", "model_stall", "model_reset")
SLACK_KINDS = ("slack_ratelimited", "slack_5xx", "slack_slow")
KINDS = (*PROCESS_KINDS, *REDIS_KINDS, *MODEL_KINDS, *SLACK_KINDS)
SCENARIOS = ("read", "approve", "approve", "reject", "edit", "expire")
EVENT_RETRIES = [2.0, 8.0, 20.0]
READ_RETRY_BOUND = 4  # starts of one read call: the first and at most 3 repeats after crashes
QUESTION = re.compile(r"chaos (?P<tag>[a-z0-9-]+) (?P<scenario>[a-z]+)")

POLICY = """\
tools:
  chaos_record:
    allow: [everyone]
    approvers: [requester]
    self_approval: true
defaults:
  read: {allow: [everyone]}
  write: {allow: [everyone]}
"""


@dataclass(frozen=True)
class Planned:
    at: float  # seconds from the start of the chaos phase
    kind: str
    seconds: float  # how long it lasts (a pause, a stop, a window of failing answers)

    def __str__(self) -> str:
        return f"+{self.at:6.1f}s {self.kind:<18} {self.seconds:4.1f}s"


def schedule(seed: int, seconds: float, gap: float) -> list[Planned]:
    """The faults of a chaos phase `seconds` long: every kind in turn, shuffled per round,
    about `gap` seconds apart (exponential gaps: sometimes together, sometimes apart)."""
    rng = random.Random(seed)
    faults: list[Planned] = []
    t = rng.uniform(0, gap)
    while t < seconds:
        kinds = list(KINDS)
        rng.shuffle(kinds)
        for kind in kinds:
            if t >= seconds:
                break
            faults.append(Planned(round(t, 2), kind, round(rng.uniform(0.5, 3.0), 2)))
            t += rng.expovariate(1 / gap)
    return faults


@dataclass
class Ask:
    """One question of the load and what its person saw."""

    tag: str
    scenario: str
    user: str
    channel: str
    asked: float
    acked: bool = False
    approval_id: str = ""
    card_seen: float | None = None
    clicked: float | None = None  # the decision's click (approve / edit submitted / reject)
    decided_as: str = ""  # what the person meant: approved / rejected / (nothing: expire)
    answered: float | None = None
    in_chaos: bool = False  # the click (or the question) came while faults were running


@dataclass
class Report:
    seed: int
    seconds: float
    workers: int
    schedule: list[Planned]
    asks: list[Ask] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)
    fault_errors: list[str] = field(default_factory=list)
    runs_started: int = 0
    runs_ended: int = 0
    runs_waiting: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    unseen: list[str] = field(default_factory=list)  # what a person waited for in vain
    unknown_writes: list[str] = field(default_factory=list)
    click_to_write_calm: list[float] = field(default_factory=list)
    click_to_write_chaos: list[float] = field(default_factory=list)
    worst_stall: tuple[float, str] = (0.0, "")
    read_starts_max: int = 0
    drained_in: float | None = None
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds of each phase
    load_seconds: float = 0.0

    def figures(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "seconds": self.seconds,
            "workers": self.workers,
            "questions": len(self.asks),
            "runs_started": self.runs_started,
            "runs_ended": self.runs_ended,
            "statuses": dict(self.statuses),
            "faults": dict(self.injected),
            "violations": self.violations,
            "unknown_writes": self.unknown_writes,
            "click_to_write_calm_s": sorted(self.click_to_write_calm),
            "click_to_write_chaos_s": sorted(self.click_to_write_chaos),
            "worst_stall_s": self.worst_stall[0],
            "worst_stall": self.worst_stall[1],
            "drained_in_s": self.drained_in,
        }

    def lines(self) -> list[str]:
        def p99(values: list[float]) -> str:
            if not values:
                return "n/a (none)"
            ordered = sorted(values)
            at = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
            median = ordered[len(ordered) // 2]
            return f"{at * 1000:,.0f} ms (n={len(values)}, p50 {median * 1000:,.0f} ms)"

        asked = Counter(a.scenario for a in self.asks)
        acked = sum(1 for a in self.asks if a.acked)
        out = [
            f"chaos soak: seed {self.seed}, {self.seconds:.0f} s of load, "
            f"{self.workers} worker processes",
            f"questions asked: {len(self.asks)} ({acked} acked by the bot) — "
            + ", ".join(f"{k} {v}" for k, v in sorted(asked.items())),
            f"runs started: {self.runs_started}; ended: {self.runs_ended}; awaiting a decision: "
            f"{self.runs_waiting}; by status: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())),
            f"faults injected: {sum(self.injected.values())} — "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.injected.items())),
            f"invariant violations: {len(self.violations)}",
            *[f"  VIOLATION {v}" for v in self.violations],
            f"writes whose outcome is unknown (crash mid-call; not retried, said in the run): "
            f"{len(self.unknown_writes)}",
            *[f"  UNKNOWN {u}" for u in self.unknown_writes],
            f"click -> write start, p99: without faults {p99(self.click_to_write_calm)}; "
            f"with faults {p99(self.click_to_write_chaos)}",
            f"worst stall: {self.worst_stall[0]:.1f} s ({self.worst_stall[1]})",
            f"waited for in vain (the person gave up): {len(self.unseen)}",
            *[f"  UNSEEN {u}" for u in self.unseen],
            f"most starts of one read call: {self.read_starts_max} (bound {READ_RETRY_BOUND})",
            "queue drained after the faults stopped: "
            + (f"in {self.drained_in:.1f} s" if self.drained_in is not None else "NO"),
        ]
        out.append("wall time: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items()))
        if self.fault_errors:
            out.append(f"faults that could not be injected: {len(self.fault_errors)}")
            out += [f"  {e}" for e in self.fault_errors[:10]]
        return out


class ModelFaults:
    """The fake model's behaviour while a model fault window is open: each chat request
    gets the fault with probability `share` (drawn from its own seeded generator)."""

    def __init__(self, seed: int, share: float = 0.6) -> None:
        self.rng = random.Random(seed)
        self.share = share
        self.lock = threading.Lock()
        self.active: dict[str, int] = {}

    def open(self, kind: str) -> None:
        with self.lock:
            self.active[kind] = self.active.get(kind, 0) + 1

    def close(self, kind: str) -> None:
        with self.lock:
            self.active[kind] -= 1

    def pick(self) -> str | None:
        with self.lock:
            kinds = sorted(k for k, n in self.active.items() if n > 0)
            if not kinds or self.rng.random() > self.share:
                return None
            return self.rng.choice(kinds)

    def respond(self, body: dict[str, Any]) -> Any:
        found = QUESTION.search(conversation_key(body))
        if not found:
            return None
        tag, scenario = found["tag"], found["scenario"]
        turns = (
            [Turn(tool_calls=[("chaos_lookup", {"topic": tag})]), Turn(f"answer {tag}")]
            if scenario == "read"
            else [Turn(tool_calls=[("chaos_record", {"name": tag})]), Turn(f"done {tag}")]
        )
        index = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        turn = turns[min(index, len(turns) - 1)]
        kind = self.pick()
        if kind == "model_5xx":
            return Fault.server_error(503)
        if kind == "model_429":
            return Fault.rate_limit(retry_after=1.0)
        if kind == "model_reset":
            return Fault.dropped()
        if kind == "model_hang":
            return replace(turn, delay=MODEL_TIMEOUT + 2)
        if kind == "model_stall":
            if body.get("stream"):
                return replace(turn, stall_after=1, stall=MODEL_TIMEOUT + 2)
            return replace(turn, delay=MODEL_TIMEOUT + 2)
        return Script(turns)


class Stack:
    """Everything the soak runs, started and stopped together."""

    def __init__(self, folder: Path, workers: int, seed: int, approval_ttl: float) -> None:
        self.folder = folder
        self.effects = folder / "effects"
        self.effects.mkdir(parents=True, exist_ok=True)
        self.redis = sentinel_group.SentinelGroup(
            folder / "redis", sentinels=1, down_after_ms=30_000
        )
        self.model = FakeOpenAI(validate=False)
        self.model_faults = ModelFaults(seed)
        self.slack = FakeSlack()
        self.worker_count = workers
        self.approval_ttl = approval_ttl
        self.workers: list[WorkerProcess] = []
        self.spawned = itertools.count(1)
        self.bot: subprocess.Popen[bytes] | None = None
        self.bot_port = free_port()
        self.bot_lock = threading.Lock()
        self.bot_fault_lock = threading.Lock()
        self.workers_lock = threading.Lock()
        self.redis_lock = threading.Lock()

    @property
    def events_url(self) -> str:
        return f"http://127.0.0.1:{self.bot_port}/slack/events"

    def env(self) -> dict[str, str]:
        policy = self.folder / "policy.yaml"
        policy.write_text(POLICY)
        return worker_env(
            self.redis.url,
            self.model.url,
            self.folder,
            SWITCHBOARD_TOOLS="tests.support.chaos_tools",
            SWITCHBOARD_POLICY=str(policy),
            CHAOS_DIR=str(self.effects),
            SWITCHBOARD_LEASE_SECONDS="3",
            SWITCHBOARD_SWEEP_SECONDS="0.5",
            SWITCHBOARD_STOP_GRACE_SECONDS="5",
            SWITCHBOARD_MODEL_TIMEOUT=str(MODEL_TIMEOUT),
            SWITCHBOARD_WORKER_CONCURRENCY="8",
            SWITCHBOARD_APPROVAL_TTL=str(self.approval_ttl),
            SWITCHBOARD_USER_RUNS_PER_MINUTE="0",
            SWITCHBOARD_USER_RUNS_IN_FLIGHT="0",
            SWITCHBOARD_STREAM_ANSWERS="1",
            SLACK_BOT_TOKEN=TOKEN,
            SLACK_SIGNING_SECRET=SECRET,
            SLACK_API_URL=self.slack.url,
        )

    def start(self) -> Stack:
        self.redis.start()
        self.model.start()
        self.model.route(self.model_faults.respond)
        self.slack.start()
        self.environment = self.env()
        for _ in range(self.worker_count):
            self.spawn_worker()
        self.start_bot()
        return self

    def spawn_worker(self) -> None:
        log = self.folder / f"worker-{next(self.spawned)}.log"
        worker = WorkerProcess(self.environment, log)
        with self.workers_lock:
            self.workers.append(worker)

    def start_bot(self) -> None:
        with self.bot_lock, open(self.folder / "bot.log", "ab") as out:
            self.bot = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "switchboard",
                    "bot",
                    "--http",
                    "--port",
                    str(self.bot_port),
                ],
                env=self.environment,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.bot_port), 0.5),
            ):
                return
            time.sleep(0.1)
        raise RuntimeError("the bot did not start: see bot.log")

    def stop_bot(self, sig: int) -> None:
        with self.bot_lock:
            bot, self.bot = self.bot, None
        if bot is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bot.pid, sig)
        try:
            bot.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(bot.pid, signal.SIGKILL)
            bot.wait(5)

    def stop_worker(self, rng: random.Random, sig: int) -> None:
        with self.workers_lock:
            live = [w for w in self.workers if w.proc.poll() is None]
            if not live:
                return
            worker = rng.choice(live)
            self.workers.remove(worker)
        if sig == signal.SIGKILL:
            worker.kill9()
        else:
            worker.stop()  # SIGTERM, then the grace period
        worker.handle.close()

    def stop(self) -> None:
        self.stop_bot(signal.SIGTERM)
        with self.workers_lock:
            workers, self.workers = list(self.workers), []
        stopping = [threading.Thread(target=w.stop) for w in workers]  # each has its grace
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()
        self.model.stop()
        self.slack.stop()
        self.redis.stop()


class Injector:
    """Runs the schedule: one thread per fault, started at its time."""

    def __init__(self, stack: Stack, report: Report, seed: int) -> None:
        self.stack = stack
        self.report = report
        self.rng = random.Random(seed + 1)
        self.rng_lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.active = 0
        self.active_lock = threading.Lock()

    def run(self, faults: list[Planned], started: float) -> None:
        for fault in faults:
            delay = started + fault.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            thread = threading.Thread(target=self._inject, args=(fault,), daemon=True)
            thread.start()
            self.threads.append(thread)
        for thread in self.threads:
            thread.join(120)

    def _inject(self, fault: Planned) -> None:
        with self.active_lock:
            self.active += 1
        try:
            getattr(self, fault.kind)(fault.seconds)
            self.report.injected[fault.kind] += 1
        except Exception as exc:  # where it failed: redis-py's repr leaves out the message
            ours = [f for f in traceback.extract_tb(exc.__traceback__) if "tests" in f.filename]
            where = f" ({Path(ours[-1].filename).name}:{ours[-1].lineno})" if ours else ""
            self.report.fault_errors.append(f"{fault}: {exc!r} {exc}{where}")
        finally:
            with self.active_lock:
                self.active -= 1

    def _choice_rng(self) -> random.Random:
        with self.rng_lock:
            return random.Random(self.rng.random())

    # processes ---------------------------------------------------------------------------

    def worker_kill9(self, seconds: float) -> None:
        self.stack.stop_worker(self._choice_rng(), signal.SIGKILL)
        time.sleep(seconds)
        self.stack.spawn_worker()

    def worker_term(self, seconds: float) -> None:
        self.stack.stop_worker(self._choice_rng(), signal.SIGTERM)
        time.sleep(seconds)
        self.stack.spawn_worker()

    def bot_kill9(self, seconds: float) -> None:
        self._bot_down(signal.SIGKILL, seconds)

    def bot_term(self, seconds: float) -> None:
        self._bot_down(signal.SIGTERM, seconds)

    def _bot_down(self, sig: int, seconds: float) -> None:
        with self.stack.bot_fault_lock:  # one bot: its stops and restarts take turns
            self.stack.stop_bot(sig)
            time.sleep(seconds)
            self.stack.start_bot()

    # Redis -------------------------------------------------------------------------------

    def redis_pause(self, seconds: float) -> None:
        with self.stack.redis_lock:
            node = self.stack.redis.primary()
            node.client().execute_command("CLIENT", "PAUSE", str(int(seconds * 1000)), "ALL")
            time.sleep(seconds)

    def redis_sigstop(self, seconds: float) -> None:
        with self.stack.redis_lock:
            node = self.stack.redis.primary()
            os.kill(node.pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                os.kill(node.pid, signal.SIGCONT)

    def redis_debug_sleep(self, seconds: float) -> None:
        with self.stack.redis_lock:
            node = self.stack.redis.primary()
            client = redis.Redis(port=node.port, socket_timeout=seconds + 10)
            client.execute_command("DEBUG", "SLEEP", f"{seconds:.2f}")

    def redis_restart(self, seconds: float) -> None:
        with self.stack.redis_lock:
            self.stack.redis.restart_primary()

    def failover(self, seconds: float) -> None:
        with self.stack.redis_lock:
            self.stack.redis.failover()

    # the model and Slack -------------------------------------------------------------------

    def _model_window(self, kind: str, seconds: float) -> None:
        self.stack.model_faults.open(kind)
        try:
            time.sleep(seconds + 2)
        finally:
            self.stack.model_faults.close(kind)

    def model_5xx(self, seconds: float) -> None:
        self._model_window("model_5xx", seconds)

    def model_429(self, seconds: float) -> None:
        self._model_window("model_429", seconds)

    def model_hang(self, seconds: float) -> None:
        self._model_window("model_hang", seconds)

    def model_stall(self, seconds: float) -> None:
        self._model_window("model_stall", seconds)

    def model_reset(self, seconds: float) -> None:
        self._model_window("model_reset", seconds)

    def slack_ratelimited(self, seconds: float) -> None:
        for method in SLACK_METHODS:
            self.stack.slack.rate_limit(method, times=2, retry_after=1)

    def slack_5xx(self, seconds: float) -> None:
        for method in SLACK_METHODS:
            self.stack.slack.server_error(method, times=2)

    def slack_slow(self, seconds: float) -> None:
        for method in SLACK_METHODS:
            self.stack.slack.slow(method, seconds, times=3)


class Person:
    """Asks, waits for the card, decides (or leaves it to expire), waits for the answer."""

    def __init__(self, soak: Soak, number: int) -> None:
        self.soak = soak
        self.user = f"UCHAOS{number:02d}"
        self.channel = f"CCHAOS{number:02d}"
        self.rng = random.Random(soak.seed * 1000 + number)
        self.number = number
        self.count = itertools.count(1)

    def live(self) -> None:
        while time.monotonic() < self.soak.load_until:
            scenario = self.rng.choice(SCENARIOS)
            ask = Ask(
                f"p{self.number}-{next(self.count)}", scenario, self.user, self.channel, time.time()
            )
            ask.in_chaos = self.soak.in_chaos()
            self.soak.report.asks.append(ask)
            try:
                self.ask(ask)
            except TimeoutError as exc:
                self.soak.report.unseen.append(str(exc))
            time.sleep(self.rng.uniform(0.2, 1.0))

    def post(self, body: str | dict[str, Any], event: bool = False) -> bool:
        """Sent until the bot answers 200 (it may be down). An event is retried as Slack
        retries it (3 times, with its retry headers; at +1 and +5 min in Slack, compressed
        here to +2, +10 and +30 s); a click or a form, as a person does it again, every
        second for up to 30 s."""
        pauses = EVENT_RETRIES if event else [1.0] * 30
        for attempt in range(len(pauses) + 1):
            headers = {"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": "http_error"}
            try:
                answer = send_signed(
                    self.soak.stack.events_url,
                    SECRET,
                    body,
                    headers=headers if attempt and event else None,
                    timeout=5,
                )
                if answer.status == 200:
                    return True
            except OSError:
                pass
            if attempt < len(pauses):
                time.sleep(pauses[attempt])
        return False

    def ask(self, ask: Ask) -> None:
        mention = app_mention(
            f"<@UBOT> chaos {ask.tag} {ask.scenario}", user=self.user, channel=self.channel
        )
        ask.acked = self.post(event_callback(mention, f"Ev{ask.tag.replace('-', 'x')}"), event=True)
        if not ask.acked:
            return
        thread = mention["ts"]
        if ask.scenario == "read":
            self.wait_answer(ask, thread, f"answer {ask.tag}")
            return
        card = self.wait(lambda: self.card(thread), 90, f"{ask.tag}: the card")
        ask.card_seen = time.time()
        self.soak.note_wait(ask.card_seen - ask.asked, f"{ask.tag}: question -> card")
        ask.approval_id = buttons(card["blocks"])[APPROVE]
        if ask.scenario == "expire":
            return
        time.sleep(self.rng.uniform(0.1, 1.0))
        ask.in_chaos = self.soak.in_chaos()
        clicked = time.time()
        if ask.scenario == "approve":
            ok = self.click(APPROVE, ask, card, thread)
            ask.decided_as = "approved" if ok else ""
        elif ask.scenario == "reject":
            ok = self.modal(
                ask,
                card,
                thread,
                REJECT,
                REJECT_MODAL,
                lambda view: {
                    REJECT_REASON_BLOCK: {
                        REJECT_REASON_INPUT: {"type": "plain_text_input", "value": "not now"}
                    }
                },
            )
            ask.decided_as = "rejected" if ok else ""
        else:
            ok = self.modal(ask, card, thread, EDIT, EDIT_MODAL, self.edited)
            ask.decided_as = "approved" if ok else ""
        if not ok:
            return
        ask.clicked = clicked
        if ask.decided_as == "approved":
            self.wait_answer(ask, thread, f"done {ask.tag}")

    def edited(self, view: dict[str, Any]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for block in view["blocks"]:
            if block.get("type") != "input":
                continue
            element = block["element"]
            value = element.get("initial_value")
            if block.get("label", {}).get("text") == "name":
                value = f"{value}-edited"
            values[block["block_id"]] = {
                element["action_id"]: {"type": element["type"], "value": value}
            }
        return values

    def click(self, action: str, ask: Ask, card: dict[str, Any], thread: str) -> bool:
        """A signed click on one of the card's buttons, as Slack posts it."""
        body = block_actions(
            action,
            ask.approval_id,
            user_id=self.user,
            channel=self.channel,
            message_ts=card["ts"],
            thread_ts=thread,
        )
        return self.post(body)

    def modal(
        self, ask: Ask, card: dict[str, Any], thread: str, action: str, callback: str, values: Any
    ) -> bool:
        """Click `action`, find the modal the bot opened for it, submit it."""
        slack = self.soak.stack.slack
        for _ in range(3):
            before = len(slack.calls("views.open"))
            if not self.click(action, ask, card, thread):
                return False
            try:
                view = self.wait(
                    lambda before=before: self.opened(before, ask.approval_id),
                    10,
                    f"{ask.tag}: the {action} modal",
                )
            except TimeoutError:
                continue  # the trigger was lost (views.open failed): click again, as a person would
            body = view_submission(
                callback,
                values(view),
                user_id=self.user,
                private_metadata=view.get("private_metadata", ""),
            )
            return self.post(body)
        return False

    def opened(self, before: int, approval_id: str) -> dict[str, Any] | None:
        for call in self.soak.stack.slack.calls("views.open")[before:]:
            view = call.get("view") or {}
            if approval_id in str(view.get("private_metadata", "")):
                return view
        return None

    def card(self, thread: str) -> dict[str, Any] | None:
        for message in self.soak.stack.slack.thread(self.channel, thread):
            if APPROVE in buttons(message.get("blocks") or []):
                return message
        return None

    def wait_answer(self, ask: Ask, thread: str, text: str) -> None:
        def answered() -> bool:
            return any(
                text in json.dumps(m) for m in self.soak.stack.slack.thread(self.channel, thread)
            )

        start = ask.clicked or ask.asked
        self.wait(answered, 120, f"{ask.tag}: the answer")
        ask.answered = time.time()
        self.soak.note_wait(
            ask.answered - start, f"{ask.tag}: {'click' if ask.clicked else 'question'} -> answer"
        )

    def wait(self, check: Any, timeout: float, what: str) -> Any:
        started = time.monotonic()
        deadline = min(started + timeout, self.soak.give_up)
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {time.monotonic() - started:.0f} s")
            time.sleep(0.1)


class Soak:
    def __init__(
        self,
        folder: Path,
        *,
        seconds: float,
        seed: int,
        workers: int,
        people: int = 6,
        calm: float = 0.2,
        gap: float = 2.5,
    ) -> None:
        self.folder = folder
        self.seed = seed
        self.seconds = seconds
        self.people = people
        self.calm = max(5.0, seconds * calm)
        self.approval_ttl = 10.0 if seconds <= 120 else 30.0
        self.faults = schedule(seed, seconds - self.calm, gap)
        self.report = Report(seed, seconds, workers, self.faults)
        self.stack = Stack(folder, workers, seed, self.approval_ttl)
        self.load_until = math.inf
        self.give_up = math.inf  # people stop waiting for what they asked
        self.chaos_from = math.inf
        self.chaos_until = math.inf
        self.stall_lock = threading.Lock()

    def in_chaos(self) -> bool:
        now = time.monotonic()
        return self.chaos_from <= now <= self.chaos_until + MODEL_TIMEOUT

    def note_wait(self, seconds: float, what: str) -> None:
        with self.stall_lock:
            if seconds > self.report.worst_stall[0]:
                self.report.worst_stall = (seconds, what)

    def run(self, say: Any = print) -> Report:
        say(
            f"chaos soak: seed {self.seed}; fault schedule ({len(self.faults)} faults, "
            f"from +{self.calm:.0f} s):"
        )
        for fault in self.faults:
            say(f"  {fault}")
        phases = self.report.phases
        mark = time.monotonic()
        self.stack.start()
        try:
            phases["start"] = time.monotonic() - mark
            mark = time.monotonic()
            self._load_and_faults()
            phases["load and faults"] = time.monotonic() - mark
            mark = time.monotonic()
            self._drain()
            self._check()
            phases["drain and check"] = time.monotonic() - mark
        finally:
            mark = time.monotonic()
            self.stack.stop()
            phases["stop"] = time.monotonic() - mark
        return self.report

    def _load_and_faults(self) -> None:
        began = time.monotonic()
        self.load_until = began + self.seconds
        self.give_up = self.load_until + self.approval_ttl + 5
        self.chaos_from = began + self.calm
        people = [
            threading.Thread(target=Person(self, n).live, daemon=True) for n in range(self.people)
        ]
        for person in people:
            person.start()
        injector = Injector(self.stack, self.report, self.seed)
        time.sleep(self.calm)
        injector.run(self.faults, self.chaos_from)
        self.chaos_until = time.monotonic()
        for person in people:
            person.join(max(1.0, self.give_up - time.monotonic() + 5))
        self.report.load_seconds = time.monotonic() - began
        # every process back, whatever the schedule left stopped
        with self.stack.workers_lock:
            missing = self.stack.worker_count - sum(
                1 for w in self.stack.workers if w.proc.poll() is None
            )
        for _ in range(max(0, missing)):
            self.stack.spawn_worker()
        if self.stack.bot is None:
            self.stack.start_bot()

    def _reader(self) -> Any:
        from switchboard.redisconn import connect
        from tests.support.runtime import make_runtime

        return make_runtime(connect(self.stack.redis.url), self.stack.model.url)

    def _drain(self) -> None:
        """The faults have stopped: the queue empties and every run settles."""
        rt = self._reader()
        started = time.monotonic()
        deadline = started + max(60.0, self.approval_ttl + 30)
        while time.monotonic() < deadline:
            runs = rt.store.created_since(0)
            unsettled = [r for r in runs if r.status.value in ("queued", "running")]
            # pending approvals expire after the TTL and resume their runs: wait for those too,
            # and for the sweeper to redraw the cards of decisions whose decider was killed
            # (a decided approval's run sits in the due set until a worker has resumed it)
            owed = rt.approvals.owed_cards(older_than=0)
            due = rt.redis.zcard(rt.store.keys.due)
            if not (unsettled or rt.queue.count or rt.approvals.pending() or owed or due):
                self.report.drained_in = time.monotonic() - started
                return
            time.sleep(0.5)

    def _check(self) -> None:
        rt = self._reader()
        report = self.report
        runs = rt.store.created_since(0)
        report.runs_started = len(runs)
        report.statuses = Counter(
            r.status.value + (f" ({r.reason.value})" if r.reason else "") for r in runs
        )
        report.runs_ended = sum(1 for r in runs if r.status.terminal)
        report.runs_waiting = sum(1 for r in runs if r.status.value == "awaiting_approval")
        for run in runs:
            if run.status.terminal:
                continue
            if run.status.value == "awaiting_approval" and run.pending_approvals:
                continue
            lease = rt.redis.get(rt.store.keys.lease(run.id))
            report.violations.append(
                f"run {run.id} left {run.status.value} (lease held: {bool(lease)}): "
                f"{run.question[:60]!r}"
            )
        starts = chaos_tools.starts(self.stack.effects)
        finished = chaos_tools.finished(self.stack.effects)
        by_key = Counter(key for key, *_ in starts)
        unknown = {
            e.data.get("approval_id")
            for r in runs
            for e in rt.events.read(r.id)
            if e.kind == "write_unknown"
        }
        approvals = {}
        for key in rt.redis.scan_iter(match=rt.approvals.keys.approval("*"), count=500):
            approval_id = key.decode().rsplit(":", 1)[1]
            approvals[approval_id] = rt.approvals.get(approval_id)
        for approval_id, request in approvals.items():
            ran = by_key.get(approval_id, 0)
            status = request.status.value
            if status == "approved":
                if approval_id in unknown:
                    report.unknown_writes.append(
                        f"{approval_id} (run {request.run_id}): started {ran} time(s), "
                        f"finished: {approval_id in finished}"
                    )
                    if ran > 1:
                        report.violations.append(
                            f"approved write {approval_id} started {ran} times"
                        )
                elif ran != 1:
                    report.violations.append(f"approved write {approval_id} ran {ran} times")
            elif ran:
                report.violations.append(f"{status} write {approval_id} ran {ran} times")
        for key in by_key:
            if key not in approvals:
                report.violations.append(f"a write ran with key {key!r} that no approval has")
        self._check_cards(rt, approvals)
        self._check_asks(approvals)
        self._check_said(rt, runs)
        reads = Counter((run, call) for run, call, _, _ in chaos_tools.reads(self.stack.effects))
        report.read_starts_max = max(reads.values(), default=0)
        for (run, call), n in reads.items():
            if n > READ_RETRY_BOUND:
                report.violations.append(f"read {call} of run {run} started {n} times")
        if report.drained_in is None:
            report.violations.append("the queue did not drain after the faults stopped")
        started_at = {key: at for key, _, _, at in starts}
        for ask in report.asks:
            if (
                ask.clicked is None
                or ask.decided_as != "approved"
                or ask.approval_id not in started_at
            ):
                continue
            took = started_at[ask.approval_id] - ask.clicked
            (report.click_to_write_chaos if ask.in_chaos else report.click_to_write_calm).append(
                max(0.0, took)
            )
            self.note_wait(took, f"{ask.tag}: click -> write start")

    def _check_cards(self, rt: Any, approvals: dict[str, Any]) -> None:
        """Every decision is on its card: the card's last version says it."""
        said = {"approved": "Approved", "rejected": "Rejected by", "expired": "Expired"}
        for approval_id, request in approvals.items():
            status = request.status.value
            if not request.cards:
                self.report.violations.append(f"{status} {approval_id} never had a card")
            if status not in said:
                continue
            for card in request.cards:
                message = self.stack.slack.message(card.get("channel", ""), card.get("ts", ""))
                text = json.dumps(message) if message else ""
                if said[status] not in text:
                    self.report.violations.append(
                        f"the card of {status} {approval_id} does not say so"
                    )

    def _check_said(self, rt: Any, runs: list[Any]) -> None:
        """Every run that ended was said to have ended in its thread (the message with its
        View run button), and none is left marked as not yet said."""
        for run in runs:
            channel, thread = run.origin.get("channel", ""), run.origin.get("thread_ts", "")
            if not run.status.terminal or not channel or not thread:
                continue
            said = any(
                VIEW_RUN in text and run.id in text
                for text in map(json.dumps, self.stack.slack.thread(channel, thread))
            )
            if not said:
                self.report.violations.append(
                    f"run {run.id} ended {run.status.value} and its thread was never told"
                )
            elif rt.redis.exists(rt.store.keys.untold(run.id)):
                self.report.violations.append(f"run {run.id} is still marked as not yet said")

    def _check_asks(self, approvals: dict[str, Any]) -> None:
        """What a person decided is what was recorded (or it expired before the click)."""
        for ask in self.report.asks:
            request = approvals.get(ask.approval_id)
            if not ask.decided_as or request is None:
                continue
            status = request.status.value
            if status != ask.decided_as and status != "expired":
                self.report.violations.append(
                    f"{ask.tag}: decided {ask.decided_as}, recorded {status}"
                )


def available() -> str | None:
    """Why the soak cannot run here, or None."""
    return sentinel_group.missing()
