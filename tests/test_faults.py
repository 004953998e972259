"""Break things on purpose: kill -9 workers at each point of a run, restart Redis, race
decisions. No run may be lost and no approved write may run twice."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fakes.openai_server import Fault, Script, Turn
from tests.fakes.slack_server import FakeSlack
from tests.support import fault_tools
from tests.support.processes import WorkerProcess, worker_env
from tests.support.redis_server import RedisServer
from tests.support.runtime import (
    ALICE,
    approve_first,
    make_runtime,
    wait_for_path,
    wait_for_run,
    wait_until,
    work,
)
from tests.support.slack_bot import CHANNEL, TOKEN
from tools.builtin.tickets import TicketStore
from tools.registry import registry
from worker import service
from worker.run import RunStatus
from worker.runtime import Runtime
from worker.surface import SilentSurface

pytestmark = pytest.mark.slow

LEASE = 0.6
RECOVERY_BOUND = LEASE + 8.0  # "within the lease expiry plus a few seconds"
# The whole matrix in CI (20 rounds); a few rounds locally. SWITCHBOARD_KILL_ROUNDS overrides.
ROUNDS = int(os.environ.get("SWITCHBOARD_KILL_ROUNDS") or (20 if os.environ.get("CI") else 3))


# What a restarted Redis answers while it reads its data back.
LOADING = "return redis.error_reply('LOADING Redis is loading the dataset in memory')"


class Told(SilentSurface):
    """A surface that keeps which runs it was told have ended."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def finished(self, run: Any) -> None:
        self.runs.append(run.id)


# A step's save (Lua, of the save script's keys and arguments): the run stored `running` and
# saved `running`, not the save that makes it so.
STEP_SAVE = (
    "ARGV[8] == 'running' and "
    "string.match(redis.call('GETRANGE', KEYS[1], 0, 255), '\"status\"%s*:%s*\"running\"')"
)


def refused_when(conn: redis.Redis, script: str, condition: str) -> Any:
    """`script` as Redis runs it, but answered LOADING whenever `condition` (Lua) holds."""
    return conn.register_script(f"if {condition} then {LOADING} end\n" + script)


def refused_once(conn: redis.Redis, script: str, mark: str) -> Any:
    """`script` as Redis runs it, but answered LOADING the first time (counted at `mark`)."""
    return refused_when(conn, script, f"redis.call('INCR', '{mark}') == 1")


class Cluster:
    """Two worker processes; a killed one is replaced, as a supervisor would."""

    def __init__(self, env: dict[str, str], logs: Path, size: int = 2) -> None:
        self.env, self.logs = env, logs
        self.workers: dict[int, WorkerProcess] = {}
        self.started = 0
        for _ in range(size):
            self.spawn()

    def spawn(self) -> None:
        self.started += 1
        worker = WorkerProcess(self.env, self.logs / f"worker-{self.started}.log")
        self.workers[worker.pid] = worker

    def kill_holder(self, conn: redis.Redis, rt: Runtime, run_id: str) -> int:
        token = wait_until(lambda: conn.get(rt.store.keys.lease(run_id)), what="a lease holder")
        pid = int(token.decode().split("-")[0])
        self.workers.pop(pid).kill9()
        self.spawn()
        return pid

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop()


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "faults"
    folder.mkdir()
    monkeypatch.setenv("FAULT_DIR", str(folder))
    added = [t for t in fault_tools.TOOLS if t.name not in registry]
    for t in added:
        registry.register(t)
    yield folder
    for t in added:
        registry.unregister(t.name)


def fault_env(redis_url: str, model_url: str, tmp_path: Path, faults: Path) -> dict[str, str]:
    """Worker processes with the fault tools, a short lease and a fast sweeper."""
    return worker_env(
        redis_url,
        model_url,
        tmp_path,
        SWITCHBOARD_TOOLS="tests.support.fault_tools",
        FAULT_DIR=str(faults),
        SWITCHBOARD_LEASE_SECONDS=str(LEASE),
        SWITCHBOARD_SWEEP_SECONDS="0.1",
    )


@pytest.fixture
def cluster(redis_url, model_server, tmp_path, faults) -> Iterator[Cluster]:
    group = Cluster(fault_env(redis_url, model_server.url, tmp_path, faults), tmp_path)
    yield group
    (faults / "release").touch()
    group.stop()


def _ends(rt: Runtime, run_id: str, killed_at: float):
    run = wait_for_run(
        rt, run_id, timeout=RECOVERY_BOUND + 5, what=f"run {run_id} to end after the kill"
    )
    assert run.ended_at is not None and run.ended_at - killed_at < RECOVERY_BOUND, run.ended_at
    return run


def _released(faults: Path) -> None:
    (faults / "release").touch()


def _hold(faults: Path) -> None:
    (faults / "release").unlink(missing_ok=True)


def test_kill_minus_nine_matrix(redis_conn, model_server, cluster, faults, tmp_path):
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=LEASE)
    outcomes: dict[str, list[str]] = {"model": [], "read": [], "write": [], "approved": []}
    for n in range(ROUNDS):
        # 1. during a model call: the first call hangs; the worker dies; the call is made again
        question = f"model kill [{n}]"
        model_server.route(question, Script([f"answer {n}"], faults={0: [Fault.slow(30)]}))
        run = service.submit(rt, question, ALICE)
        model_server.wait_for(
            lambda q=question: any(q in str(r) for r in model_server.chat_requests)
        )
        cluster.kill_holder(redis_conn, rt, run.id)
        run = _ends(rt, run.id, time.time())
        assert run.status == RunStatus.COMPLETED and run.answer == f"answer {n}"
        outcomes["model"].append(run.status.value)

        # 2. during a read tool: the read is simply made again
        _hold(faults)
        question = f"read kill [{n}]"
        model_server.route(
            question, [Turn(tool_calls=[("slow_read", {"topic": f"t{n}"})]), "read ok"]
        )
        run = service.submit(rt, question, ALICE)
        wait_for_path(faults / f"read-t{n}", what="the read to start")
        cluster.kill_holder(redis_conn, rt, run.id)
        killed = time.time()
        _released(faults)
        run = _ends(rt, run.id, killed)
        assert run.status == RunStatus.COMPLETED, run.detail
        outcomes["read"].append(run.status.value)

        # 3. during a write tool: never run again; reconciled or reported as unknown
        _hold(faults)
        question = f"write kill [{n}]"
        name = f"w{n}"
        model_server.route(
            question, [Turn(tool_calls=[("slow_write", {"name": name})]), "write ok"]
        )
        run = service.submit(rt, question, ALICE)
        wait_for_run(rt, run.id, RunStatus.AWAITING_APPROVAL)
        approve_first(rt, run.id)
        wait_for_path(faults / f"write-{name}", what="the write to start")
        cluster.kill_holder(redis_conn, rt, run.id)
        killed = time.time()
        _released(faults)
        run = _ends(rt, run.id, killed)
        assert fault_tools.starts(faults, name) == 1
        kinds = [e.kind for e in rt.events.read(run.id)]
        assert "write_unknown" in kinds and "not retried" in (run.answer or "")
        outcomes["write"].append("unknown")

        # 4. between the approval and the start of its execution
        question = f"approved kill [{n}]"
        name = f"a{n}"
        model_server.route(question, [Turn(tool_calls=[("slow_write", {"name": name})]), "done"])
        run = service.submit(rt, question, ALICE)
        wait_for_run(rt, run.id, RunStatus.AWAITING_APPROVAL)
        _hold(faults)
        approve_first(rt, run.id)
        cluster.kill_holder(redis_conn, rt, run.id)  # as soon as a worker has taken the run
        killed = time.time()
        _released(faults)
        run = _ends(rt, run.id, killed)
        count = fault_tools.starts(faults, name)
        assert count <= 1
        kinds = [e.kind for e in rt.events.read(run.id)]
        if "write_unknown" in kinds:
            outcomes["approved"].append("killed-after-start")
        else:
            assert count == 1 and run.status == RunStatus.COMPLETED
            outcomes["approved"].append("executed-once-after-recovery")
    print("kill -9 outcomes:", {k: sorted(set(v)) for k, v in outcomes.items()})
    assert all(len(v) == ROUNDS for v in outcomes.values())


def slack_worker_env(redis_url: str, model_url: str, tmp_path: Path, slack: FakeSlack) -> dict:
    """Workers that post to `slack` (whole answers, not streamed), on short leases."""
    return worker_env(
        redis_url,
        model_url,
        tmp_path,
        SLACK_BOT_TOKEN=TOKEN,
        SLACK_API_URL=slack.url,
        SWITCHBOARD_STREAM_ANSWERS="false",
        SWITCHBOARD_LEASE_SECONDS=str(LEASE),
        SWITCHBOARD_SWEEP_SECONDS="0.1",
    )


def ended_unsaid(
    rt: Runtime, slack: FakeSlack, model_server: Any, env: dict, tmp_path: Path, question: str
) -> tuple[Any, str]:
    """`question` asked in a thread of its own (the model answers it after 0.5 s); the worker
    that ends its run killed while Slack is slow to take the answer: between the save and the
    telling (its log: first.log). The run, as stored, and its thread."""
    thread_ts = slack.add_message(CHANNEL, question)
    origin = {"surface": "slack", "channel": CHANNEL, "thread_ts": thread_ts, "team": "T0001"}
    run = service.submit(rt, question, ALICE, origin=origin)
    worker = WorkerProcess(env, tmp_path / "first.log")
    try:
        model_server.wait_for(lambda: any(question in str(r) for r in model_server.chat_requests))
        for method in ("chat.postMessage", "chat.update"):  # every post of the ending
            slack.slow(method, 60, times=40)
        wait_until(lambda: rt.store.load(run.id).status.terminal, what="the run saved ended")
        worker.kill9()
    finally:
        worker.stop()
    return rt.store.load(run.id), thread_ts


def posted(slack: FakeSlack, thread_ts: str, text: str) -> list[dict]:
    return [m for m in slack.thread(CHANNEL, thread_ts) if text in str(m)]


def test_a_worker_killed_between_saving_a_run_as_ended_and_saying_it_leaves_it_said_once(
    redis_conn, redis_url, model_server, tmp_path
):
    """The worker saves the run as ended, then tells the thread; killed in between (here:
    while Slack is slow to take the answer), the run was ended in Redis and never said: the
    worker that took it again found it ended and posted nothing. The next worker posts the
    answer, once."""
    question, answer = "Is the printer on floor 2 back?", "The printer on floor 2 is back."
    model_server.route("floor 2", [Turn(answer, delay=0.5)])
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=LEASE)
    with FakeSlack() as slack:
        env = slack_worker_env(redis_url, model_server.url, tmp_path, slack)
        run, thread_ts = ended_unsaid(rt, slack, model_server, env, tmp_path, question)
        assert run.status == RunStatus.COMPLETED
        assert not posted(slack, thread_ts, answer)
        slack.fast()
        second = WorkerProcess(env, tmp_path / "second.log")
        try:
            wait_until(
                lambda: posted(slack, thread_ts, answer),
                timeout=RECOVERY_BOUND,
                what="the answer in the thread",
            )
            wait_until(
                lambda: not redis_conn.exists(rt.store.keys.untold(run.id)),
                what="the run said",
            )
        finally:
            second.stop()
        answers = posted(slack, thread_ts, answer)
    assert len(answers) == 1  # before: none
    assert "run_said_late" in (tmp_path / "second.log").read_text()


def test_a_worker_killed_while_saying_a_run_late_leaves_it_to_the_next(
    redis_conn, redis_url, model_server, tmp_path
):
    """A worker that finds a run ended and not yet said takes the mark, so one worker says
    it however many find it. Killed before Slack took the answer, it took the mark with it:
    the next worker found nothing to say, and the thread was never told (the chaos soak,
    seed 51: a worker killed under a Redis failover). The mark is held for a while, not
    taken: once that lapses, the next worker says it, once."""
    question, answer = "Does the projector in room 4 work?", "The projector in room 4 works again."
    model_server.route("room 4", [Turn(answer, delay=0.5)])
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=LEASE)
    with FakeSlack() as slack:
        env = slack_worker_env(redis_url, model_server.url, tmp_path, slack)
        run, thread_ts = ended_unsaid(rt, slack, model_server, env, tmp_path, question)
        second = WorkerProcess(env, tmp_path / "second.log")  # the late teller
        try:
            said = tmp_path / "second.log"
            wait_until(lambda: "run_said_late" in said.read_text(), what="the run said late")
            second.kill9()  # before Slack took the answer
        finally:
            second.stop()
        assert not posted(slack, thread_ts, answer)
        slack.fast()
        third = WorkerProcess(env, tmp_path / "third.log")
        try:
            wait_until(
                lambda: posted(slack, thread_ts, answer),
                timeout=RECOVERY_BOUND + 2 * LEASE,
                what="the answer in the thread",
            )
            wait_until(lambda: not redis_conn.exists(rt.store.keys.untold(run.id)), what="said")
        finally:
            third.stop()
        answers = posted(slack, thread_ts, answer)
    assert len(answers) == 1  # before: none


def test_pending_approvals_survive_a_redis_restart_with_aof(model_server, tmp_path, tickets_db):
    server = RedisServer(tmp_path / "aof", appendonly=True).start()
    try:
        conn = redis.Redis.from_url(server.url)
        model_server.route(
            "restart",
            [Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Disk"})]), "filed"],
        )
        rt = make_runtime(conn, model_server.url)
        runs = [service.submit(rt, f"restart {i}", ALICE) for i in range(5)]
        work(rt)
        assert all(rt.store.load(r.id).status == RunStatus.AWAITING_APPROVAL for r in runs)

        server.stop()  # SIGTERM: Redis flushes its AOF and exits
        server.start()
        conn = redis.Redis.from_url(server.url)
        rt = make_runtime(conn, model_server.url)
        assert len(rt.approvals.pending()) == 5
        for r in runs:
            approve_first(rt, r.id)
        work(rt)
        assert all(rt.store.load(r.id).status == RunStatus.COMPLETED for r in runs)
        assert TicketStore(tickets_db).count_executions("create_ticket") == 5
    finally:
        server.stop()


def test_two_hundred_pairs_of_concurrent_decisions(redis_conn, model_server, tickets_db):
    model_server.route(
        "pair", [Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Pair"})]), "ok"]
    )
    rt = make_runtime(redis_conn, model_server.url)
    runs = [service.submit(rt, f"pair {i}", ALICE) for i in range(200)]
    work(rt)
    approvals = [rt.store.load(r.id).pending_approvals[0] for r in runs]
    roles = frozenset(ALICE.roles)

    def decide(job: tuple[str, bool]):
        approval_id, approve = job
        return service.decide(
            rt, approval_id, decider_id="UALICE", decider_roles=roles, approve=approve
        ).result

    # even requests: two approvals race; odd requests: an approval races a rejection
    jobs = [(a, n % 2 == 0 or i == 0) for n, a in enumerate(approvals) for i in range(2)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(decide, jobs))
    assert results.count(service.DecisionResult.DECIDED) == 200
    work(rt)
    approved = sum(1 for a in approvals if rt.approvals.get(a).status == "approved")
    assert all(rt.store.load(r.id).status == RunStatus.COMPLETED for r in runs)
    assert TicketStore(tickets_db).count_executions("create_ticket") == approved


def test_the_sweeper_leaves_queued_runs_alone_and_requeues_lost_ones(
    redis_conn, model_server, tickets_db
):
    from worker.sweeper import sweep

    model_server.route("backlog", ["fine"])
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=0.05)
    run = service.submit(rt, "backlog question", ALICE)
    wait_until(lambda: rt.store.overdue(older_than=0.05), what="the run to be overdue")
    assert sweep(rt) == 0 and rt.queue.count == 1  # waiting in the queue, not lost
    # the backlog has waited far longer than the grace period: still not lost
    wait_until(lambda: rt.store.overdue(older_than=0.5), what="a long wait in the queue")
    assert sweep(rt) == 0 and rt.queue.count == 1
    redis_conn.lpop(rt.queue.key)  # as if a worker took the job and died before leasing it
    assert sweep(rt) == 1 and rt.queue.count == 1
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    assert not rt.store.overdue(older_than=0)


def test_a_run_whose_lease_lapsed_while_redis_stalled_stays_due_for_the_sweeper(
    redis_conn, model_server
):
    from worker.sweeper import sweep

    model_server.route("stalled", ["fine"])
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=0.05)
    run = service.submit(rt, "stalled question", ALICE)
    redis_conn.lpop(rt.queue.key)  # the job a worker took
    lease = rt.leases.acquire(run.id)
    assert lease is not None
    due_seen = lease.due_seen
    redis_conn.delete(rt.store.keys.lease(run.id))  # lapsed: Redis did not answer the renewals
    assert lease.release(due_seen)  # the worker gives up on its next save and lets go
    wait_until(lambda: rt.store.overdue(older_than=0.05), what="the run to be overdue")
    assert sweep(rt) == 1  # before: not due any more, so never found again, `running` for good
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED


@pytest.mark.parametrize("refused", [("_wake",), ("_wake", "_append")])
def test_a_run_handed_back_stays_due_when_redis_refuses_the_wake(redis_conn, model_server, refused):
    """A stopping worker hands its run back: it makes the run due again, writes its last
    events, then lets go of the lease. When the wake fails (the chaos soak: a failover
    answered it NOSCRIPT twice, the script loaded on one server and run on the other), the
    run must stay due all the same: released as done, it was left `running`, with no lease
    and nothing to find it, for good. When writing the events fails too, the lease is let go
    all the same: kept, the process renewed it for the rest of its life (found by review)."""
    import threading

    from worker.jobs import advance_run
    from worker.sweeper import sweep

    first = Turn(tool_calls=[("calculate", {"expression": "6 * 7"})], delay=0.5)
    model_server.route("handed back", [first, "it is 42"])
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=LEASE)
    run = service.submit(rt, "handed back: what is 6 * 7?", ALICE)
    redis_conn.lpop(rt.queue.key)  # the job this worker took
    # Redis answers NOSCRIPT, whatever was loaded, as the soak's failover did
    refusing = redis_conn.register_script("return redis.error_reply('NOSCRIPT injected')")
    rt.store._wake = refusing
    if "_append" in refused:
        rt.events._append = refusing
    raised: list[BaseException] = []

    def advance() -> None:
        try:
            advance_run(rt, run.id)
        except BaseException as exc:  # the job's error, as RQ would record it
            raised.append(exc)

    worker = threading.Thread(target=advance, daemon=True)
    worker.start()
    wait_until(
        lambda: any("handed back" in str(body) for body in model_server.chat_requests),
        what="the model call in flight",
    )
    rt.stopping.set()  # SIGTERM: the run goes back to the queue after this step
    worker.join(15)
    assert not worker.is_alive() and isinstance(raised[0], redis.exceptions.NoScriptError)
    assert not redis_conn.exists(rt.store.keys.lease(run.id)) and not rt.leases.held()
    assert rt.store.load(run.id).status == RunStatus.RUNNING
    rt.stopping.clear()
    wait_until(lambda: rt.store.overdue(older_than=LEASE), what="the run to be overdue")
    assert sweep(rt) == 1  # before: not due, never found again
    work(rt)
    done = rt.store.load(run.id)
    assert done.status == RunStatus.COMPLETED and done.answer == "it is 42"
    assert done.usage.steps == 2  # the step before the hand-back kept, not made again


def test_a_retry_whose_live_events_redis_refuses_for_now_goes_on_and_they_come_with_the_save(
    redis_conn, model_server
):
    """A model attempt fails and is retried: the failure and the retry's start are written
    at once, for those watching. A Redis that refuses that write for now (restarted, still
    loading its data: LOADING) failed the run with an internal error (the chaos soak). The
    step goes on, the events stay kept and come with the step's save."""
    model_server.route("loading", Script(["fine"], faults={0: [Fault(status=500)]}))
    rt = make_runtime(redis_conn, model_server.url)
    run = service.submit(rt, "loading question", ALICE)
    # Redis answers the live writes LOADING, as a restarted one does while it loads its data
    rt.events._append = redis_conn.register_script(LOADING)
    work(rt)
    done = rt.store.load(run.id)
    assert done.status == RunStatus.COMPLETED and done.answer == "fine"
    kinds = [e.kind for e in rt.events.read(run.id)]
    assert kinds.count("model_attempt_failed") == 1 and kinds.count("model_call_started") == 2


def test_a_save_that_redis_refuses_for_now_does_not_fail_the_run_it_goes_on_from_its_last_save(
    redis_conn, model_server
):
    """Redis restarting under a step (it answers LOADING while it reads its data back) is a
    crash to the run, not its failure: it stays due as last saved and the sweeper queues it
    again. Ended as failed, the failure's own save going through once Redis was back, a blip
    of Redis failed the person's run (the chaos soak: 1 run in 487)."""
    from worker import store
    from worker.sweeper import sweep

    model_server.route("blip", ["fine"])
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=LEASE)
    run = service.submit(rt, "blip question", ALICE)
    mark = f"sb:test:refused:{run.id}"
    rt.store._save = refused_once(redis_conn, store._SAVE, mark)  # its first save refused
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.QUEUED  # as last saved, not failed
    assert not redis_conn.exists(rt.store.keys.lease(run.id))
    wait_until(lambda: rt.store.overdue(older_than=LEASE), what="the run to be overdue")
    assert sweep(rt) == 1
    work(rt)
    done = rt.store.load(run.id)
    assert done.status == RunStatus.COMPLETED and done.answer == "fine"


def test_a_step_that_redis_keeps_interrupting_ends_once_the_sweeper_took_it_up_too_often(
    redis_conn, model_server
):
    """A step Redis interrupts every time (here: every save of a step, refused LOADING) is a
    crash to its run every time, and the sweeper queues it again, each time with its model
    call made again. Without a bound it went on for good; it ends, failed and said, once it
    was taken up more than MAX_RECOVERIES times."""
    from worker import store
    from worker.loop import MAX_RECOVERIES
    from worker.run import EndReason
    from worker.sweeper import sweep

    told = Told()
    calc = Turn(tool_calls=[("calculate", {"expression": "6 * 7"})])
    model_server.route("again and again", [calc] * (MAX_RECOVERIES + 5))
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=LEASE, surfaces={"told": told})
    run = service.submit(rt, "again and again", ALICE, origin={"surface": "told"})
    # the save that makes the run `running` goes through; a step's (the run stored running)
    # is refused: the step is never kept
    rt.store._save = refused_when(redis_conn, store._SAVE, STEP_SAVE)
    work(rt)
    for _ in range(MAX_RECOVERIES + 1):
        assert rt.store.load(run.id).status == RunStatus.RUNNING and told.runs == []
        wait_until(lambda: sweep(rt) == 1, what="the sweeper to queue the run again")
        work(rt)
    done = rt.store.load(run.id)
    assert done.status == RunStatus.FAILED and done.reason == EndReason.INTERNAL_ERROR
    assert f"taken up again {MAX_RECOVERIES + 1} times" in (done.detail or "")
    assert told.runs == [run.id]
    asked = [r for r in model_server.chat_requests if "again and again" in str(r)]
    assert len(asked) == MAX_RECOVERIES + 1  # before: one more at every sweep, for good


def test_a_run_interrupted_once_at_every_step_goes_on_for_more_than_the_bound_of_recoveries(
    redis_conn, model_server
):
    """The bound is of recoveries with no step saved in between: a run that Redis
    interrupts once at each of its steps (a flaky Redis, a failover a step) makes progress
    at every recovery and ends as it would have (found by review: the count was of the
    run's whole life, and such a run was failed after its tenth step)."""
    from worker import store
    from worker.loop import MAX_RECOVERIES
    from worker.run import Budgets
    from worker.sweeper import sweep

    steps = MAX_RECOVERIES + 2
    calls = [Turn(tool_calls=[("calculate", {"expression": f"{n} * 7"})]) for n in range(steps)]
    model_server.route("once a step", [*calls, "done at last"])
    rt = make_runtime(
        redis_conn, model_server.url, lease_seconds=LEASE, budgets=Budgets(max_steps=20)
    )
    run = service.submit(rt, "once a step", ALICE)
    mark = f"sb:test:once-a-step:{run.id}"
    # a step's save (the run stored running) is refused the first time, done the second
    odd = f"redis.call('INCR', '{mark}') % 2 == 1"
    rt.store._save = refused_when(redis_conn, store._SAVE, f"{STEP_SAVE} and {odd}")
    work(rt)
    recoveries = 0
    while not rt.store.load(run.id).status.terminal and recoveries <= steps:
        wait_until(lambda: sweep(rt) == 1, what="the sweeper to queue the run again")
        recoveries += 1
        work(rt)
    done = rt.store.load(run.id)
    assert recoveries == steps > MAX_RECOVERIES
    assert done.status == RunStatus.COMPLETED and done.answer == "done at last", done.detail
    assert done.usage.steps == steps + 1


def test_a_run_whose_admitted_successor_redis_does_not_queue_for_now_is_answered_all_the_same(
    redis_conn, model_server
):
    """The save that ends the run gives its place in flight back and admits who waits in
    line (marked due), then queues it and says the run is done. A Redis that refuses the
    queueing for now must not keep the answer from the person (interrupted there, the run
    stayed ended in Redis and was never said: found by review); the run admitted stays due,
    and the sweeper queues it."""
    from structlog.testing import capture_logs

    from worker.limits import Limits
    from worker.sweeper import sweep

    told = Told()
    model_server.route("place", ["answered", "answered too"])
    rt = make_runtime(
        redis_conn,
        model_server.url,
        lease_seconds=LEASE,
        limits=Limits(runs_in_flight=1),
        surfaces={"told": told},
    )
    first = service.submit(rt, "place question", ALICE, origin={"surface": "told"})
    second = service.submit(rt, "place question too", ALICE, origin={"surface": "told"})
    assert rt.limits.waiting(ALICE.user_id) == 1
    queueing = rt.enqueue_advance

    def refused_once(run_id: str) -> None:  # Redis gone for a moment as the run is queued
        rt.enqueue_advance = queueing  # type: ignore[method-assign]
        raise redis.ConnectionError("Connection closed by server.")

    rt.enqueue_advance = refused_once  # type: ignore[method-assign]
    with capture_logs() as logs:
        work(rt)
    assert rt.store.load(first.id).status == RunStatus.COMPLETED and told.runs == [first.id]
    assert "run_admission_later" in [e["event"] for e in logs]
    assert rt.limits.waiting(ALICE.user_id) == 0  # admitted by the save that ended the first
    assert rt.store.load(second.id).status == RunStatus.QUEUED
    wait_until(lambda: sweep(rt) == 1, what="the sweeper to queue the admitted run")
    work(rt)
    assert rt.store.load(second.id).status == RunStatus.COMPLETED
    assert told.runs == [first.id, second.id]


def test_a_run_whose_surface_lost_redis_while_saying_it_ended_is_said_again(
    redis_conn, model_server
):
    """A surface reads Redis as it says a run ended (whether the thread is gone, who
    cancelled, a streamed message left over). Redis failing there for now was swallowed
    with the surface's other errors and the run taken as said: never said (found by review).
    It stays due and marked; the next worker says it."""
    from worker.sweeper import sweep

    class RedisBlip(Told):
        def finished(self, run: Any) -> None:
            if not self.runs:
                self.runs.append("")  # tried once
                raise redis.ConnectionError("Connection closed by server.")
            super().finished(run)

    told = RedisBlip()
    model_server.route("blip at the end", ["answered"])
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=LEASE, surfaces={"told": told})
    run = service.submit(rt, "blip at the end", ALICE, origin={"surface": "told"})
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED and told.runs == [""]
    assert redis_conn.exists(rt.store.keys.untold(run.id))
    wait_until(lambda: sweep(rt) == 1, what="the sweeper to queue the run again")
    work(rt)
    assert told.runs == ["", run.id]


def test_a_run_ended_more_than_a_day_ago_and_never_said_is_given_up_not_said_out_of_the_blue(
    redis_conn, model_server
):
    """A run still marked as not yet said a day after it ended (Slack down all day, or an
    older worker of a mixed fleet that left the mark) is not said any more: out of the blue
    a day late, it would read as a new answer. Logged as `run_never_said`."""
    from structlog.testing import capture_logs

    from worker.jobs import advance_run
    from worker.store import UNTOLD_SECONDS

    told = Told()
    rt = make_runtime(redis_conn, model_server.url, surfaces={"told": told})
    run = service.submit(rt, "long ago", ALICE, origin={"surface": "told"})
    run.status, run.answer = RunStatus.COMPLETED, "long ago"
    run.ended_at = time.time() - UNTOLD_SECONDS - 60
    rt.store.save(run)  # saved as ended (marked as not yet said), a day and a minute ago
    assert redis_conn.exists(rt.store.keys.untold(run.id))
    with capture_logs() as logs:
        assert advance_run(rt, run.id) == "completed"
    assert told.runs == [] and not redis_conn.exists(rt.store.keys.untold(run.id))
    assert [e["run_id"] for e in logs if e["event"] == "run_never_said"] == [run.id]


def test_a_run_a_late_teller_holds_is_left_to_it_until_it_lets_go_or_its_hold_lapses(
    redis_conn, model_server
):
    """A worker that finds a run ended and not yet said holds its mark while it says it.
    Another that finds the run meanwhile (the teller's lease lapsed, or it was killed) says
    nothing and leaves the run due: said once the hold lapses. A teller that cannot say it
    for now lets go at once, so the next try need not wait out its hold, and keeps the mark
    a day longer: the try past the day since the run ended finds it and says it gave up
    (`run_never_said`), rather than finding nothing and settling the run in silence (found
    by review). A hold that lapsed and was taken by another is not let go by the first."""
    from worker.jobs import UNSAID, advance_run
    from worker.store import UNTOLD_SECONDS, Untold
    from worker.surface import TellLater

    class SlackDownOnce(Told):
        def finished(self, run: Any) -> None:
            if run.answer == "let go" and "" not in self.runs:
                self.runs.append("")  # tried
                raise TellLater("ratelimited")
            super().finished(run)

    told = SlackDownOnce()
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=LEASE, surfaces={"told": told})
    held, let_go = (
        service.submit(rt, question, ALICE, origin={"surface": "told"})
        for question in ("held", "let go")
    )
    for run in (held, let_go):
        run.status, run.answer = RunStatus.COMPLETED, run.question
        rt.store.save(run)  # saved as ended: marked as not yet said
    mark, hold = rt.store.keys.untold(held.id), rt.store.keys.untold_hold(held.id)
    assert rt.store.claim_untold(held.id, "killed", 1.0) is Untold.TO_SAY  # a teller, killed
    assert rt.store.claim_untold(held.id, "other", 1.0) is Untold.BEING_SAID
    assert advance_run(rt, held.id) == UNSAID and told.runs == []
    assert redis_conn.exists(mark) and redis_conn.zscore(rt.store.keys.due, held.id)  # due
    rt.store.unhold_untold(held.id, "other")  # not its hold: kept
    assert redis_conn.get(hold) == b"killed"
    wait_until(lambda: not redis_conn.exists(hold), what="the teller's hold to lapse")
    assert advance_run(rt, held.id) == "completed" and told.runs == [held.id]
    assert not redis_conn.exists(mark) and not redis_conn.exists(hold)
    assert rt.store.claim_untold(held.id, "late", 1.0) is Untold.SAID
    # cannot be said for now: let go, the mark kept a day from now; said by the next try,
    # however soon
    mark = rt.store.keys.untold(let_go.id)
    redis_conn.expire(mark, 60)  # the day since the run ended nearly over
    assert advance_run(rt, let_go.id) == UNSAID and told.runs == [held.id, ""]
    assert redis_conn.ttl(mark) > UNTOLD_SECONDS - 60
    assert advance_run(rt, let_go.id) == "completed"
    assert told.runs == [held.id, "", let_go.id] and not redis_conn.exists(mark)


def test_a_run_whose_last_save_lost_its_answer_is_said_to_have_ended_once(redis_conn, model_server):
    """Redis saves the run as ended, and the save's answer is lost (the connection dropped,
    a restart: LOADING). The worker takes it for an interruption and stops there, so the run
    was ended in Redis and never said: a worker that took it again found it ended and said
    nothing (found by review). It stays due; the worker the sweeper gives it to says it; and
    when that one's release is refused too, the next finds it said (the chaos soak: Slack and
    Redis failing together had three workers say one run)."""
    from worker import lease as lease_module
    from worker import store
    from worker.jobs import advance_run
    from worker.sweeper import sweep

    told = Told()
    model_server.route("lost answer", ["answered"])
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=LEASE, surfaces={"told": told})
    run = service.submit(rt, "lost answer question", ALICE, origin={"surface": "told"})
    mark = f"sb:test:lost:{run.id}"
    # the save is done, then answered LOADING: the first time the run is saved as ended
    rt.store._save = redis_conn.register_script(
        f"local function save()\n{store._SAVE}\nend\nlocal answer = save()\n"
        f"if ARGV[8] == 'completed' and redis.call('INCR', '{mark}') == 1 then {LOADING} end\n"
        "return answer\n"
    )
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED and told.runs == []
    assert redis_conn.exists(rt.store.keys.untold(run.id))
    # the late teller's release is refused as well (LOADING): the run stays due
    release = lease_module._RELEASE
    rt.leases._release = refused_once(redis_conn, release, f"sb:test:release:{run.id}")
    wait_until(lambda: rt.store.overdue(older_than=LEASE), what="the run to be overdue")
    assert sweep(rt) == 1
    work(rt)
    assert told.runs == [run.id]  # before: never said
    assert not redis_conn.exists(rt.store.keys.untold(run.id))
    wait_until(lambda: sweep(rt) == 1, what="the sweeper to queue the run again")
    work(rt)
    assert advance_run(rt, run.id) == "completed"
    assert told.runs == [run.id]  # said once: one late teller, however many find the run


def test_one_beat_renews_every_lease_held_and_lets_go_of_those_taken_over(redis_conn):
    """The keeper renews all of a process's leases in one script per RENEW_CHUNK of them (a
    process with 1,000 runs in flight renewed them one command each, too slowly for its busy
    GIL: leases lapsed and runs were queued again while their worker went on)."""
    from worker.lease import RENEW_CHUNK, LeaseKeeper
    from worker.store import RunStore

    store = RunStore(redis_conn)
    keeper = LeaseKeeper(store, seconds=5.0)
    leases = [keeper.acquire(f"r{n}") for n in range(RENEW_CHUNK + 3)]  # two scripts
    held = [(lease.run_id, lease.token) for lease in leases if lease is not None]
    assert len(held) == RENEW_CHUNK + 3
    for run_id, _ in held:
        redis_conn.pexpire(store.keys.lease(run_id), 2000)  # about to lapse
    redis_conn.set(store.keys.lease("r7"), "another-worker")  # lapsed and taken over
    redis_conn.delete(store.keys.lease(f"r{RENEW_CHUNK + 1}"))  # lapsed, in the second chunk
    redis_conn.delete(store.keys.lease("r3"))
    redis_conn.rpush(store.keys.lease("r3"), "not a lease")  # unreadable: only its own 0
    keeper.renew(held)
    gone = {"r3", "r7", f"r{RENEW_CHUNK + 1}"}
    for run_id, _ in held:
        if run_id not in gone:
            assert redis_conn.pttl(store.keys.lease(run_id)) > 4000, run_id
    assert redis_conn.get(store.keys.lease("r7")) == b"another-worker"  # not touched
    assert not redis_conn.exists(store.keys.lease(f"r{RENEW_CHUNK + 1}"))  # not made again
    assert set(keeper.held()) == {run_id for run_id, _ in held} - gone
    redis_conn.delete(store.keys.lease("r3"))
    for lease in leases:
        if lease is not None:
            lease.release("")


def test_a_save_renews_its_lease_when_the_keeper_is_late(redis_conn):
    """A run that is saving keeps its lease however late its process's keeper thread beats
    (one process with 1,000 runs in flight is starved of the GIL): once the keeper's last beat
    is more than a beat old, each save that goes through gives the lease a full term again.
    While the keeper keeps up, a save leaves the lease to it (a command fewer a save). A save
    fenced off renews nothing."""
    from worker.run import Requester, Run
    from worker.store import LeaseLost

    # beats every second; the keeper is stalled below by holding its lock, as a thread that
    # does not get the GIL would be
    rt = make_runtime(redis_conn, "http://127.0.0.1:9/v1", lease_seconds=3.0)
    run = Run(id="r-renewed", question="q", requester=Requester(user_id="U1"))
    rt.store.create(run)
    lease = rt.leases.acquire(run.id)
    assert lease is not None
    key = rt.store.keys.lease(run.id)
    with rt.leases._lock:  # the keeper cannot list the leases to renew: it falls behind
        redis_conn.pexpire(key, 2500)
        rt.save(run, lease.token)  # just taken: a full term from then, nothing to renew
        assert 0 < redis_conn.pttl(key) <= 2500
        wait_until(lambda: rt.leases.save_term() > 0, what="the keeper to be a beat late")
        redis_conn.pexpire(key, 500)  # about to lapse
        rt.save(run, lease.token)
        assert redis_conn.pttl(key) > 2000
        redis_conn.pexpire(key, 500)
        with pytest.raises(LeaseLost):
            rt.store.save(run, "another-worker", lease_ms=rt.leases.ms)
        assert 0 < redis_conn.pttl(key) <= 500 and redis_conn.get(key) == lease.token.encode()
    # the keeper beats again: saves leave the lease to it
    wait_until(lambda: rt.leases.save_term() == 0, what="the keeper to beat again")
    assert redis_conn.pttl(key) > 2000
    lease.release("")


def test_a_lease_taken_as_a_beat_ends_is_counted_from_when_it_was_asked_for(redis_conn):
    """A lease set in Redis and then kept waiting for the keeper's lock (the GIL given to
    other threads) while a beat that did not list it ends: the keeper must not take it for
    fresher than it is, or a save would not renew it when the keeper falls behind. The beat
    is played here by what it does last, moving the time every held lease is fresh from."""
    import threading
    import time

    from worker.lease import Lease, LeaseKeeper
    from worker.store import RunStore

    keeper = LeaseKeeper(RunStore(redis_conn), seconds=60.0)
    first = keeper.acquire("r-held")
    assert first is not None
    taken: list[Lease | None] = []
    with keeper._lock:  # the second acquire sets its lease, then waits here
        late = threading.Thread(target=lambda: taken.append(keeper.acquire("r-late")))
        late.start()
        wait_until(lambda: redis_conn.exists(keeper.store.keys.lease("r-late")), what="the SET")
        ended = keeper._fresh_since = time.monotonic()  # a beat that listed only r-held ends
    late.join(10)
    [second] = taken
    assert second is not None
    assert keeper._fresh_since < ended  # r-late's term began before that beat ended
    for lease in (first, second):
        lease.release("")


def test_kill_minus_nine_of_a_process_with_eight_runs_in_flight_loses_none_and_repeats_no_write(
    redis_conn, redis_url, model_server, faults, tmp_path
):
    env = fault_env(redis_url, model_server.url, tmp_path, faults)
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=LEASE)
    worker = WorkerProcess(env, tmp_path / "w1.log", "--concurrency", "8")
    replacement = None
    try:
        _hold(faults)
        # four runs in an approved write, four in a model call that hangs: eight at once
        writes = []
        for n in range(4):
            question = f"octet write [{n}]"
            model_server.route(
                question, [Turn(tool_calls=[("slow_write", {"name": f"o{n}"})]), "ok"]
            )
            writes.append(service.submit(rt, question, ALICE))
        for run in writes:
            wait_for_run(rt, run.id, RunStatus.AWAITING_APPROVAL)
            approve_first(rt, run.id)
        models = []
        for n in range(4):
            question = f"octet model [{n}]"
            model_server.route(question, Script([f"answer {n}"], faults={0: [Fault.slow(30)]}))
            models.append(service.submit(rt, question, ALICE))
        for n in range(4):
            wait_for_path(faults / f"write-o{n}", what="the writes to start")
            model_server.wait_for(
                lambda n=n: any(f"octet model [{n}]" in str(r) for r in model_server.chat_requests)
            )
        runs = writes + models

        def holders() -> set[str]:
            tokens = [redis_conn.get(rt.store.keys.lease(r.id)) for r in runs]
            return {t.decode().split("-")[0] for t in tokens if t}

        wait_until(
            lambda: len([r for r in runs if redis_conn.exists(rt.store.keys.lease(r.id))]) == 8,
            what="eight runs leased at once",
        )
        assert holders() == {str(worker.pid)}  # one process carries all eight

        worker.kill9()
        killed = time.time()
        replacement = WorkerProcess(env, tmp_path / "w2.log", "--concurrency", "8")
        _released(faults)
        ended = [_ends(rt, r.id, killed) for r in runs]
        for n, run in enumerate(ended[:4]):
            assert fault_tools.starts(faults, f"o{n}") == 1  # never run twice
            assert "write_unknown" in [e.kind for e in rt.events.read(run.id)]
        for n, run in enumerate(ended[4:]):
            assert run.status == RunStatus.COMPLETED and run.answer == f"answer {n}"
    finally:
        _released(faults)
        worker.stop()
        if replacement is not None:
            replacement.stop()
