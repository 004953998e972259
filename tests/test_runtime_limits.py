"""Per-person limits: one person's burst waits in their own line; rate and spend are capped."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.backoff import NoBackoff
from redis.retry import Retry
from structlog.testing import capture_logs

from bot.render.blocks import answer_messages
from switchboard.settings import Config
from switchboard.wiring import build_runtime
from tests.fakes.openai_server import FakeOpenAI, Fault, Script, Turn
from tests.support.redis_server import free_port
from tests.support.runtime import ALICE, make_runtime, work
from tests.support.slack_bot import texts
from tools.exceptions import PolicyError
from tools.policy import Policy
from tools.registry import ToolRegistry
from worker import service
from worker.budgets import PriceTable
from worker.events import EventKind
from worker.limits import CallStart, Limits, PersonLimits
from worker.model import ModelError, Spent
from worker.model_watch import StepWatch
from worker.process import make_worker
from worker.run import EndReason, Requester, Run, RunStatus
from worker.runtime import Runtime
from worker.surface import SilentSurface
from worker.sweeper import sweep

MALLORY = Requester(user_id="UMALLORY", team_id="T0001", channel_id="C0001", roles=["everyone"])


def test_a_burst_from_one_person_waits_in_their_line_not_ahead_of_others(redis_conn, model_server):
    model_server.route("burst", ["ok"])
    model_server.route("mine", ["yours"])
    rt = make_runtime(redis_conn, model_server.url, limits=Limits(runs_in_flight=2))
    burst = [service.submit(rt, f"burst {n}", MALLORY) for n in range(5)]
    alice = service.submit(rt, "mine, please", ALICE)
    # two of Mallory's five are queued; Alice's is next in the shared queue, not sixth
    queued = [job.args[0] for job in rt.queue.get_jobs()]
    assert queued == [burst[0].id, burst[1].id, alice.id]
    assert rt.limits.waiting(MALLORY.user_id) == 3
    assert "waiting_in_line" in [e.kind for e in rt.events.read(burst[4].id)]
    work(rt)  # each run that ends admits the next in its owner's line
    for run in [*burst, alice]:
        assert rt.store.load(run.id).status == RunStatus.COMPLETED
    assert rt.limits.waiting(MALLORY.user_id) == 0


def test_questions_nothing_else_would_admit_leave_their_line_at_the_sweep(redis_conn, model_server):
    """A person's line moves when a run of theirs ends. The sweeper moves it when nothing
    else would: a policy reload that removed the limit (a release then reads no line), and
    places held by runs whose workers died, once they are stale; a person whose line is
    empty is no longer looked at."""
    model_server.route("burst", ["ok"])
    rt = make_runtime(redis_conn, model_server.url, limits=Limits(runs_in_flight=1))
    first, *waiting = [service.submit(rt, f"burst {n}", ALICE) for n in range(4)]
    assert [job.args[0] for job in rt.queue.get_jobs()] == [first.id]
    assert rt.limits.lines() == [ALICE.user_id]
    assert sweep(rt) == 0 and rt.limits.waiting(ALICE.user_id) == 3  # no room: they wait

    active = rt.limits.keys.person(ALICE.user_id, "active")
    redis_conn.zadd(active, {first.id: time.time() - rt.limits.stale - 1})  # its worker died
    sweep(rt)
    assert [job.args[0] for job in rt.queue.get_jobs()] == [first.id, waiting[0].id]
    assert redis_conn.zscore(rt.store.keys.due, waiting[0].id) is not None

    rt.limits.limits = Limits()  # a policy reload removes the limit: the rest go
    sweep(rt)
    assert [job.args[0] for job in rt.queue.get_jobs()][1:] == [r.id for r in waiting]
    assert rt.limits.waiting(ALICE.user_id) == 0
    assert redis_conn.zrange(active, 0, -1) == [waiting[0].id.encode()]  # none without a limit
    assert rt.limits.lines() == [ALICE.user_id]  # unlisted by the next pass, which finds none
    sweep(rt)
    assert rt.limits.lines() == []
    work(rt)
    assert {rt.store.load(r.id).status for r in [first, *waiting]} == {RunStatus.COMPLETED}


def test_asking_faster_than_the_rate_is_refused_with_the_limit(redis_conn, model_server):
    rt = make_runtime(redis_conn, model_server.url, limits=Limits(runs_per_minute=3))
    for n in range(3):
        service.submit(rt, f"quick {n}", ALICE)
    with pytest.raises(service.QuestionRejected, match="limit is 3 a minute"):
        service.submit(rt, "one too many", ALICE)
    service.submit(rt, "someone else may still ask", MALLORY)


def test_the_days_spend_is_capped_per_person(redis_conn, model_server):
    model_server.route("pricey", ["expensive answer"])
    rt = make_runtime(redis_conn, model_server.url, limits=Limits(cost_per_day=0.01))
    rt.prices = PriceTable({"gpt-fake": (100_000.0, 100_000.0)})  # every call costs dollars
    run = service.submit(rt, "pricey question", ALICE)
    work(rt)
    assert rt.store.load(run.id).usage.cost > 0.01
    with pytest.raises(service.QuestionRejected, match="a day"):
        service.submit(rt, "pricey again", ALICE)
    service.submit(rt, "pricey for someone else", MALLORY)


# -- the day's spend, checked before every model call (issue 21, item 4) ----------------------

CALL_COST = 0.02  # every scripted call below: 1,000 prompt tokens at $20 per million
PRICED = PriceTable({"gpt-fake": (20.0, 0.0)})


def priced(text: str | None = None, **fields: object) -> Turn:
    return Turn(text=text, usage=(1000, 0), **fields)  # type: ignore[arg-type]


def spent_today(rt: Runtime, user_id: str) -> float:
    return float(rt.redis.get(rt.limits._cost_key(user_id)) or 0)


def test_five_quick_questions_spend_at_most_the_cap_and_one_call(redis_conn, model_server):
    model_server.route("quick", [priced("a quick answer")])
    limits = Limits(cost_per_day=0.05, runs_in_flight=2)  # three of five wait in the line
    rt = make_runtime(redis_conn, model_server.url, limits=limits)
    rt.prices = PRICED
    runs = [service.submit(rt, f"quick question {n}", ALICE) for n in range(5)]  # all accepted
    work(rt)
    assert spent_today(rt, ALICE.user_id) <= 0.05 + CALL_COST
    assert len(model_server.chat_requests) == 3  # 0.02, 0.04, then 0.06 crosses the cap
    ended = [rt.store.load(r.id) for r in runs]
    stopped = [r for r in ended if r.status == RunStatus.PARTIAL]
    assert len(stopped) == 2 and all(r.usage.steps == 0 for r in stopped)
    for run in stopped:  # the asker is told why, in the answer's words
        assert run.reason == EndReason.COST and "limit is $0.05 a day" in run.detail
        assert "limit is $0.05 a day" in texts([m.blocks for m in answer_messages(run)])


def test_a_long_run_stops_before_the_call_that_would_go_past_the_days_cap(redis_conn, model_server):
    sums = [priced(tool_calls=[("calculate", {"expression": f"{n} + {n}"})]) for n in range(6)]
    model_server.route("add up", [*sums, priced("all added")])
    rt = make_runtime(redis_conn, model_server.url, limits=Limits(cost_per_day=0.05))
    rt.prices = PRICED
    run = service.submit(rt, "add up these numbers", ALICE)
    work(rt)
    ended = rt.store.load(run.id)
    assert (ended.status, ended.reason) == (RunStatus.PARTIAL, EndReason.COST)
    assert ended.usage.steps == 3 and "your questions today have used $0.06" in ended.detail
    assert spent_today(rt, ALICE.user_id) <= 0.05 + CALL_COST


class Streamed(SilentSurface):
    """A surface the answer is streamed to (so a stream cut midway has an estimated cost)."""

    def answer_stream(self, run: Run) -> Streamed:
        return self

    def text(self, delta: str) -> None:
        return None

    def reset(self) -> None:
        return None


def test_a_steps_cost_is_spent_as_it_stops_counting_in_flight_its_failed_attempts_too(
    redis_conn, model_server
):
    """The first attempt's stream is cut after some text (its cost estimated), the second is
    answered: the day's spend is what the run was charged, both attempts (the failed one as
    it failed, the answer as the step ended); nothing of the run is left in flight."""
    model_server.route("cut", Script([priced("It is 5.")], faults={0: Fault(cut_after=3)}))
    rt = make_runtime(
        redis_conn, model_server.url, limits=Limits(cost_per_day=5.0), surfaces={"s": Streamed()}
    )
    rt.prices = PRICED
    run = service.submit(rt, "cut, then 2 + 3", ALICE, origin={"surface": "s"})
    work(rt)
    ended = rt.store.load(run.id)
    assert ended.status == RunStatus.COMPLETED and len(model_server.chat_requests) == 2
    [failed] = [e for e in rt.events.read(run.id) if e.kind == "model_attempt_failed"]
    assert failed.data["tokens"] == "estimated" and failed.data["cost"] > 0
    assert ended.usage.cost == pytest.approx(failed.data["cost"] + CALL_COST)
    assert spent_today(rt, ALICE.user_id) == pytest.approx(ended.usage.cost)
    largest = float(redis_conn.get(rt.limits._cost_key(ALICE.user_id, "largest")))
    assert largest == pytest.approx(max(failed.data["cost"], CALL_COST))  # one attempt's
    assert not redis_conn.exists(rt.limits._cost_key(ALICE.user_id, "calls"))


@pytest.mark.parametrize("capped", [True, False])
def test_a_call_is_on_record_as_started_only_once_it_may_start(
    redis_conn, model_server, capped: bool
):
    """`StepWatch.begin` writes what the step held and the first attempt's start with the
    call's reservation (cap or no cap, one script); a call refused at the cap, or whose write
    failed, leaves what was held held, for the run's next save, and no start."""
    limits = Limits(cost_per_day=0.05) if capped else Limits()
    rt = make_runtime(redis_conn, model_server.url, limits=limits)
    calls = rt.limits._cost_key(ALICE.user_id, "calls")
    redis_conn.set(rt.limits._cost_key(ALICE.user_id, "largest"), "0.01")  # a priced call today
    run = service.submit(rt, "anything", ALICE)
    before = [e.kind for e in rt.events.read(run.id)]
    rt.events.hold(run.id)
    rt.events.append(run.id, EventKind.POLICY_CHANGED, before="a", after="b")
    watch = StepWatch(rt, run, step=1, timeout=10.0, max_tokens=100, attempts=3)
    assert watch.begin() is None
    [held, started] = rt.events.read(run.id)[len(before) :]
    assert (held.kind, started.kind) == ("policy_changed", "model_call_started")
    assert (started.data["attempt"], started.data["attempts"], started.data["step"]) == (1, 3, 1)
    assert redis_conn.hkeys(calls) == ([run.id.encode()] if capped else [])  # reserved
    watch.end()
    assert not redis_conn.exists(calls)

    # Redis cannot be reached: what was held is held again, ahead of what came since
    rt.events.append(run.id, EventKind.POLICY_CHANGED, before="b", after="c")
    working = rt.limits
    unreachable = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    rt.limits = PersonLimits(unreachable, "sb:", limits, stale=600)
    with pytest.raises(redis.ConnectionError):
        StepWatch(rt, run, step=2, timeout=10.0, max_tokens=100, attempts=3).begin()
    rt.limits = working
    rt.events.append(run.id, EventKind.POLICY_CHANGED, before="c", after="d")
    if capped:  # the cap is reached: the call does not start, and nothing is written
        redis_conn.set(rt.limits._cost_key(ALICE.user_id), "0.05")
        watch = StepWatch(rt, run, step=2, timeout=10.0, max_tokens=100, attempts=3)
        assert "limit is $0.05 a day" in (watch.begin() or "")
        assert not redis_conn.exists(calls)
    assert len(rt.events.read(run.id)) == len(before) + 2
    kept = [json.loads(body)["after"] for body in rt.events.take(run.id)]
    assert kept == ["c", "d"]


@pytest.mark.slow  # three worker loops in threads, 2 s model calls
def test_concurrent_runs_of_one_person_spend_at_most_one_call_past_the_cap(
    redis_conn, model_server
):
    """Three runs of one person ask the model at the same moment, with $0.02 of $0.05 spent:
    checked only against what is spent, all three would start (and spend $0.08); the calls
    in flight count, so the third does not."""
    model_server.route("warm", [priced("first answer")])
    model_server.route("together", [priced("slow answer", delay=2.0)])
    limits = Limits(cost_per_day=0.05, runs_in_flight=3)
    rt = make_runtime(redis_conn, model_server.url, limits=limits)
    rt.prices = PRICED
    service.submit(rt, "warm up", ALICE)
    work(rt)  # $0.02 spent; the largest call so far costs $0.02
    runs = [service.submit(rt, f"together {n}", ALICE) for n in range(3)]
    slots = [make_worker(rt, slot=n) for n in range(3)]
    threads = [threading.Thread(target=w.work, kwargs={"burst": True}) for w in slots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads)
    assert spent_today(rt, ALICE.user_id) <= 0.05 + CALL_COST + 1e-9
    ended = [rt.store.load(r.id) for r in runs]
    stopped = [r for r in ended if r.status == RunStatus.PARTIAL]
    assert len(stopped) == 1 and stopped[0].reason == EndReason.COST
    assert "expected to use the rest of today's $0.05" in stopped[0].detail


# -- limits in the policy file ----------------------------------------------------------------

POLICY_LIMITS = """\
limits:
  runs_per_minute: 2
  cost_per_day: 0.5
defaults:
  read: {allow: [everyone]}
"""


def test_the_policy_files_limits_override_the_settings(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY_LIMITS)
    config = Config(
        SWITCHBOARD_POLICY=str(policy),
        SWITCHBOARD_USER_RUNS_PER_MINUTE=50,
        SWITCHBOARD_USER_RUNS_IN_FLIGHT=4,
        OPENAI_BASE_URL=model_server.url,
        OPENAI_API_KEY="test",
        SWITCHBOARD_MODEL="gpt-fake",
    )
    rt = build_runtime(config, redis_conn)
    # the file's figures win; what it leaves out comes from the settings
    assert rt.settings.limits == Limits(runs_in_flight=4, runs_per_minute=2, cost_per_day=0.5)
    service.submit(rt, "one", ALICE)
    service.submit(rt, "two", ALICE)
    with pytest.raises(service.QuestionRejected, match="limit is 2 a minute"):
        service.submit(rt, "three", ALICE)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("limits: {runs_in_flight: -1}", "line 1: limits.runs_in_flight must be a whole number"),
        ("limits: {runs_per_minute: 2.5}", "line 1: limits.runs_per_minute must be a whole"),
        ("limits: {runs_per_minute: true}", "limits.runs_per_minute must be a whole number"),
        ("limits:\n  cost_per_day: .nan", "line 2: limits.cost_per_day must be a number"),
        ("limits:\n  cost_per_day: [1]", "line 2: limits.cost_per_day must be a number"),
        ("limits: {runs_in_flight: 5000}", "0 (no limit) to 1000"),
        ("limits: {runs_in_flite: 3}", "unknown key 'runs_in_flite' (did you mean"),
        ("limits: [3]", "limits must be a mapping"),
    ],
)
def test_bad_limits_are_named_with_their_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        Policy.parse(text, ToolRegistry(), source="policy.yaml")
    assert message in str(caught.value)


@given(
    st.dictionaries(
        st.sampled_from(["runs_in_flight", "runs_per_minute", "cost_per_day"]),
        st.one_of(
            st.integers(-(10**6), 10**7),
            st.floats(allow_nan=True, allow_infinity=True),
            st.booleans(),
            st.text(max_size=5),
            st.none(),
        ),
    )
)
def test_any_limits_section_loads_within_bounds_or_is_refused(values: dict) -> None:
    text = "limits:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in values.items())
    try:
        policy = Policy.parse(text, ToolRegistry(), source="policy.yaml")
    except PolicyError as error:
        assert "policy.yaml line" in str(error)
        return
    for name, value in policy.limits.items():
        assert 0 <= value <= {"runs_in_flight": 1000, "runs_per_minute": 10_000}.get(name, 1e6)
        Limits(**{name: value})  # type: ignore[arg-type]


def test_the_calls_in_flight_keep_a_time_to_live_however_their_entries_come_and_go(redis_conn):
    # The hash's time to live is set only when a call finds it empty (issue 28: one command
    # less per model call); a hash whose entries all went stale is such a hash too.
    limits = PersonLimits(redis_conn, "sb:", Limits(cost_per_day=5.0), stale=600)
    calls = limits._call_keys("U1")[1]
    redis_conn.set(limits._call_keys("U1")[2], "0.5")  # the day's largest call: a place costs it
    assert limits.begin_call("U1", "r1").over is None
    assert 0 < redis_conn.ttl(calls) <= 172800
    redis_conn.expire(calls, 60)
    assert limits.begin_call("U1", "r2").over is None  # another entry is kept: its TTL stays
    assert 0 < redis_conn.ttl(calls) <= 60
    redis_conn.persist(calls)
    redis_conn.hset(calls, mapping={"r1": "1|0", "r2": "1|0"})  # stale long ago
    assert limits.begin_call("U1", "r3").over is None
    assert redis_conn.hkeys(calls) == [b"r3"] and 0 < redis_conn.ttl(calls) <= 172800
    limits.end_call("U1", "r3", 0.0, reserved=True, held=True)
    assert not redis_conn.exists(calls)


def test_a_call_reserved_under_a_cap_is_ended_after_a_reload_removed_the_cap(redis_conn):
    limits = PersonLimits(redis_conn, "sb:", Limits(cost_per_day=5.0), stale=600)
    calls = limits._call_keys("U1")[1]
    redis_conn.set(limits._call_keys("U1")[2], "0.5")  # the day's largest call
    started = limits.begin_call("U1", "r1")
    assert started == CallStart(None, True, True) and redis_conn.hkeys(calls) == [b"r1"]
    limits.limits = Limits()  # the policy reloaded without a cap, mid-call
    limits.end_call("U1", "r1", 0.0, reserved=started.reserved, held=started.held)
    assert not redis_conn.exists(calls)
    # without a cap, nothing is reserved, and ending the call writes nothing
    assert limits.begin_call("U1", "r2") == (None, False, False)
    limits.end_call("U1", "r2", 0.0, reserved=False, held=False)
    assert not redis_conn.exists(calls)


def test_with_no_priced_call_today_a_call_holds_no_place_and_ending_it_writes_nothing(
    redis_conn,
):
    """A place in flight is held at the day's largest call; while that is nothing (an
    unpriced model, or no priced call yet), none can be held (the largest call only grows
    within its day), so none is read, written or ended (issue 28: four commands a model
    call). What the call costs is still charged, cap reloaded away or not, and the next call
    holds a place at that cost."""
    limits = PersonLimits(redis_conn, "sb:", Limits(cost_per_day=5.0), stale=600)
    spent, calls, largest = limits._call_keys("U1")
    limits.begin_call("U0", "r0")  # the script loaded
    redis_conn.config_resetstat()
    started = limits.begin_call("U1", "r1")
    assert started == CallStart(None, True, False)
    assert commands_run(redis_conn) == {"evalsha": 1, "mget": 1}
    assert not redis_conn.exists(calls)
    redis_conn.config_resetstat()
    limits.end_call("U1", "r1", 0.0, reserved=started.reserved, held=started.held)
    assert commands_run(redis_conn) == {}  # nothing to end
    limits.limits = Limits()  # a reload drops the cap mid-call: the answer is charged all the same
    limits.end_call("U1", "r1", 0.25, reserved=started.reserved, held=started.held)
    assert float(redis_conn.get(spent)) == 0.25 and float(redis_conn.get(largest)) == 0.25
    assert not redis_conn.exists(calls)
    limits.limits = Limits(cost_per_day=5.0)
    assert limits.begin_call("U1", "r2") == CallStart(None, True, True)  # at $0.25
    assert redis_conn.hkeys(calls) == [b"r2"]


def test_a_step_reserved_under_a_cap_is_charged_and_ended_after_a_reload_removed_it(
    redis_conn, model_server
):
    """A policy reload drops the cap while the model works: the step's failed attempt and
    its answer still count against the day, and its place in flight still ends."""
    rt = make_runtime(redis_conn, model_server.url, limits=Limits(cost_per_day=5.0))
    rt.prices = PRICED
    calls = rt.limits._cost_key(ALICE.user_id, "calls")
    redis_conn.set(rt.limits._cost_key(ALICE.user_id, "largest"), "0.01")  # a priced call today
    run = service.submit(rt, "anything", ALICE)
    watch = StepWatch(rt, run, step=1, timeout=10.0, max_tokens=100, attempts=3)
    assert watch.begin() is None and redis_conn.hkeys(calls) == [run.id.encode()]
    rt.limits.limits = Limits()  # the reload, mid-call
    watch.attempt_failed(1, 3, ModelError("cut"), Spent(1000, 0, "estimated"), 1.0)
    assert spent_today(rt, ALICE.user_id) == pytest.approx(CALL_COST)
    watch.charge(1000, 0)
    watch.end()
    assert spent_today(rt, ALICE.user_id) == pytest.approx(2 * CALL_COST) == run.usage.cost
    assert not redis_conn.exists(calls)


def commands_run(conn: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT, scripts' own commands included."""
    stats = conn.info("commandstats")
    counts = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    return {k: n for k, n in counts.items() if not k.startswith("config")}


def test_asking_and_ending_under_the_default_limits_cost_what_they_need_and_no_more(redis_conn):
    """issue 28: the minute's count with the day's spend in one script, its time to live set
    once; an admission that does not look for stale places while there is room; a release
    that does not look in the line for a run that held a place in flight; and, while the
    person has no priced call today, a model call's start that reads no places in flight."""
    limits = PersonLimits(redis_conn, "sb:", Limits(3, 10, 10.0), stale=600)
    log = "sb:run:r0:events"
    limits.check("U0")  # the scripts loaded (each a NOSCRIPT, a SCRIPT LOAD and an EVALSHA more)
    limits.admit("U0", "r0")
    limits.begin_call("U0", "r0", log, ['{"k": "model_call_started"}'], 60)
    limits.release("U0", "r0", "sb:runs:due")
    for i in (1, 2):
        minute = int(time.time() // 60)
        redis_conn.config_resetstat()
        limits.check("U1")
        assert limits.admit("U1", f"r{i}")
        started = ['{"k": "model_call_started"}']
        assert limits.begin_call("U1", f"r{i}", f"sb:run:r{i}:events", started, 60).over is None
        counts = commands_run(redis_conn)
        if int(time.time() // 60) != minute:
            continue  # a new minute began meanwhile: which one counted the question is unknown
        count = int(redis_conn.get(limits.keys.person("U1", f"minute:{minute}")) or 0)
        assert counts == {
            "evalsha": 3,
            "incr": 1,
            "get": 1,
            "zcard": 1,
            "zadd": 1,
            "mget": 1,
            "rpush": 1,
            "expire": 2 if count == 1 else 1,  # the minute's count (its first question), the log's
        }
        assert redis_conn.ttl(limits.keys.person("U1", f"minute:{minute}")) > 0
    redis_conn.config_resetstat()
    assert limits.release("U1", "r1", "sb:runs:due") == []
    assert commands_run(redis_conn) == {"evalsha": 1, "zrem": 1, "llen": 1}  # nobody in line


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    limit=st.integers(1, 4),
    places=st.lists(st.booleans(), max_size=6),  # each place in flight: stale or not
    in_line=st.integers(0, 3),  # runs already waiting in the person's line
)
def test_runs_are_admitted_exactly_while_fewer_than_the_limit_hold_fresh_places(
    redis_conn, limit, places, in_line
):
    """Stale places (a worker that died holding one) are dropped only when they would keep a
    run out, by an admission or by a release that admits from the line: asking and ending,
    the decisions count the fresh places alone. A run taken out of the line (it never held a
    place) leaves it."""
    redis_conn.flushall()
    limits = PersonLimits(redis_conn, "sb:", Limits(runs_in_flight=limit), stale=600)
    active, line = limits.keys.person("U1", "active"), limits.keys.person("U1", "waiting")
    now = time.time()
    for i, stale in enumerate(places):
        redis_conn.zadd(active, {f"p{i}": now - 601 if stale else now})
    waiting = [f"w{i}" for i in range(in_line)]
    if waiting:
        redis_conn.rpush(line, *waiting)
    fresh = [f"p{i}" for i, stale in enumerate(places) if not stale]

    admitted = limits.admit("U1", "r")
    assert admitted == (len(fresh) < limit)
    fresh, waiting = ([*fresh, "r"], waiting) if admitted else (fresh, [*waiting, "r"])
    if fresh:  # one ends: as many from the line as the fresh places left leave room for
        ended = fresh.pop()
        room = max(0, limit - len(fresh))
        assert limits.release("U1", ended, "sb:runs:due") == waiting[:room]
        fresh, waiting = fresh + waiting[:room], waiting[room:]
    assert {m.decode() for m in redis_conn.zrange(active, 0, -1)} >= set(fresh)
    if waiting:  # the last in line is cancelled: it leaves the line
        limits.release("U1", waiting[-1], "sb:runs:due")
        assert waiting[-1].encode() not in redis_conn.lrange(line, 0, -1)


@given(costs=st.lists(st.floats(1e-9, 100.0, allow_nan=False), min_size=1, max_size=5))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_days_spend_gets_its_time_to_live_from_the_spend_that_begins_it(redis_conn, costs):
    """Not from every spend (issue 28: a command less a priced call): whatever the costs,
    the day's spend always has a time to live, set once."""
    redis_conn.flushall()
    limits = PersonLimits(redis_conn, "sb:", Limits(cost_per_day=500.0), stale=600)
    spent = limits._call_keys("U1")[0]
    limits.spend("U0", 1.0, reserved=True)  # the script loaded
    redis_conn.config_resetstat()
    for cost in costs:
        limits.spend("U1", cost, reserved=True)
        assert 0 < redis_conn.ttl(spent) <= 172800
    assert commands_run(redis_conn).get("expire") == 1
    assert float(redis_conn.get(spent)) == pytest.approx(sum(costs))
    redis_conn.delete(spent)  # an admin clears the day's spend; its largest call stays
    limits.spend("U1", costs[0], reserved=True)
    assert 0 < redis_conn.ttl(spent) <= 172800
    redis_conn.delete(spent)
    limits.spend("U1", 1e-300, reserved=True)  # Redis keeps 17 decimals: the total reads 0
    assert 0 < redis_conn.ttl(spent) <= 172800


def test_a_steps_charge_is_written_by_its_save_fenced_off_or_not(redis_conn):
    """issue 28: a model call's cost and the end of its place in flight go with the step's
    save, in its script (one round trip a call fewer), written before the fence is looked
    at: a worker that lost the run had still made the call."""
    from worker.store import LeaseLost, RunStore

    limits = PersonLimits(redis_conn, "sb:", Limits(cost_per_day=5.0), stale=600)
    store = RunStore(redis_conn, retention=3600)
    spent, calls, largest = limits._call_keys("U1")
    run = Run(id="r-charged", question="q", requester=Requester(user_id="U1"))
    store.create(run)
    redis_conn.set(largest, "0.01")  # a priced call today: the call holds a place
    limits.hold_charges(run.id)
    started = limits.begin_call("U1", run.id)
    assert started.held and redis_conn.hkeys(calls) == [run.id.encode()]
    limits.end_call("U1", run.id, 0.25, reserved=started.reserved, held=started.held)
    assert not redis_conn.exists(spent) and redis_conn.hkeys(calls) == [run.id.encode()]
    store.save(run)  # the script loaded
    redis_conn.config_resetstat()
    store.save(run, charge=limits.take_charge(run.id))
    assert commands_run(redis_conn)["evalsha"] == 1  # the save alone
    assert float(redis_conn.get(spent)) == 0.25 and float(redis_conn.get(largest)) == 0.25
    assert not redis_conn.exists(calls)
    assert limits.take_charge(run.id) is None  # written once
    # a worker fenced off (another holds the lease now) still charges the call it made
    redis_conn.set(store.keys.lease(run.id), "another-worker")
    started = limits.begin_call("U1", run.id)
    limits.end_call("U1", run.id, 0.5, reserved=started.reserved, held=started.held)
    with pytest.raises(LeaseLost):
        store.save(run, "this-worker", charge=limits.take_charge(run.id))
    assert float(redis_conn.get(spent)) == 0.75 and float(redis_conn.get(largest)) == 0.5
    assert not redis_conn.exists(calls)


def test_a_charge_no_save_wrote_is_written_when_the_run_is_let_go(redis_conn, model_server):
    """A save Redis refused before running it (loading its data after a restart) leaves the
    step's charge to be written alone when the worker lets go of the run (`settle`), as a
    step that failed between its call and its save does; a process that does not hold the
    run's charges writes each at once, as before."""
    from tests.test_faults import LOADING

    rt = make_runtime(redis_conn, model_server.url, limits=Limits(cost_per_day=5.0))
    run = service.submit(rt, "anything", ALICE)
    spent = rt.limits._call_keys(ALICE.user_id)[0]
    rt.limits.hold_charges(run.id)
    rt.limits.end_call(ALICE.user_id, run.id, 0.25, reserved=True, held=False)
    saving = rt.store._save
    rt.store._save = redis_conn.register_script(LOADING)
    with pytest.raises(redis.exceptions.BusyLoadingError):
        rt.save(run, "")
    rt.store._save = saving
    assert not redis_conn.exists(spent)
    rt.limits.settle(run.id)
    assert float(redis_conn.get(spent)) == 0.25
    rt.limits.settle(run.id)  # nothing more to write
    assert float(redis_conn.get(spent)) == 0.25
    rt.limits.end_call(ALICE.user_id, run.id, 0.25, reserved=True, held=False)  # not held
    assert float(redis_conn.get(spent)) == 0.5
    # refused again as the worker lets go: said, and the job's end goes on
    rt.limits.hold_charges(run.id)
    rt.limits.end_call(ALICE.user_id, run.id, 0.25, reserved=True, held=False)
    rt.limits._spend = redis_conn.register_script(LOADING)
    with capture_logs() as logs:
        rt.limits.settle(run.id)
    assert [e["event"] for e in logs] == ["run_charge_unwritten"]
    assert float(redis_conn.get(spent)) == 0.5


def test_only_what_redis_says_it_did_not_run_gives_a_charge_back():
    """A failure after which the save's script may have run (its charge written) must not
    give the charge back: written again, it would count twice."""
    from switchboard.redisconn import PrimaryMoved
    from worker.runtime import not_run

    assert not_run(PrimaryMoved("READONLY You can't write against a read only replica."))
    assert not_run(redis.exceptions.BusyLoadingError("LOADING"))
    assert not_run(redis.exceptions.ReadOnlyError("READONLY"))
    assert not not_run(redis.ConnectionError("Connection closed by server."))
    assert not not_run(redis.TimeoutError("Timeout reading from socket"))
    assert not not_run(redis.ResponseError("ERR Error running script"))


def test_the_save_that_ends_a_run_gives_its_place_back_in_its_round_trip(redis_conn):
    """issue 28: the place in flight of a run that ended (or waits for people) is given back,
    and who waits in line admitted, by the save that says so: one script, not two. A worker
    fenced off gives back nothing (the run is not its to end)."""
    from worker.store import LeaseLost, RunStore

    limits = PersonLimits(redis_conn, "sb:", Limits(runs_in_flight=1), stale=600)
    store = RunStore(redis_conn, retention=3600)
    active, waiting = limits._line_keys("U1")
    run = Run(id="r-ends", question="q", requester=Requester(user_id="U1"))
    store.create(run)
    assert limits.admit("U1", run.id) and not limits.admit("U1", "r-waits")
    run.status = RunStatus.COMPLETED
    redis_conn.set(store.keys.lease(run.id), "another-worker")
    with pytest.raises(LeaseLost):
        store.save(run, "this-worker", release=limits.releasing("U1", run.id, "d"))
    assert redis_conn.zrange(active, 0, -1) == [run.id.encode()]
    assert redis_conn.lrange(waiting, 0, -1) == [b"r-waits"]
    redis_conn.delete(store.keys.lease(run.id))
    store.save(run)  # the script loaded
    redis_conn.config_resetstat()
    release = limits.releasing("U1", run.id, store.keys.due)
    assert store.save(run, release=release) == (None, ["r-waits"])
    assert commands_run(redis_conn)["evalsha"] == 1
    assert redis_conn.zrange(active, 0, -1) == [b"r-waits"]
    assert redis_conn.llen(waiting) == 0
    assert redis_conn.zscore(store.keys.due, "r-waits") is not None
    assert limits.releasing("U1", run.id, store.keys.due) is not None
    limits.limits = Limits()  # no limit: nothing to give back
    assert limits.releasing("U1", run.id, store.keys.due) is None
