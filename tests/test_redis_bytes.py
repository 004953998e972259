"""Redis bytes per request and per thread, measured with MEMORY USAGE (issue 21, not yet
tried). Whatever a model server sends back (a turn of 200 tool calls of 64 KiB each, a
5 MB answer) and however long a Slack thread grows, what one question leaves in Redis stays
under a bound that follows from the limits in the code. Real Redis, RQ, FakeOpenAI; the
thread over the real bot (Bolt over signed HTTP) and FakeSlack."""

from __future__ import annotations

from pathlib import Path

import redis

from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_events import app_mention, message
from tests.support.runtime import ALICE, make_runtime, work
from tests.support.slack_bot import ALICE as ALICE_ID
from tests.support.slack_bot import CHANNEL, BotEnv
from tools.registry import registry
from worker import service
from worker.run import Budgets, EndReason, RunStatus
from worker.service.asking import MAX_HISTORY_CHARS, MAX_QUESTION_CHARS
from worker.turns import MAX_ARGUMENTS_KEPT, MAX_CONTENT

UTF8 = 4  # bytes a character may take
OVERHEAD = 256 * 1024  # keys, indexes, RQ's job, event envelopes: measured at ~11 KB


def question_bound(budgets: Budgets) -> int:
    """What one question may leave in Redis, from the limits in the code: its text and the
    thread's history, every step's reply (and the answer kept again), every tool call's
    arguments and result, at 4 bytes a character, plus the fixed overhead."""
    output_cap = max(tool.output_cap for tool in registry)
    chars = (
        MAX_QUESTION_CHARS
        + MAX_HISTORY_CHARS
        + (budgets.max_steps + 1) * MAX_CONTENT
        + budgets.max_tool_calls * (MAX_ARGUMENTS_KEPT + output_cap)
    )
    return chars * UTF8 + OVERHEAD


def redis_bytes(conn: redis.Redis, match: str = "*") -> int:
    """What every key matching `match` takes in Redis, by MEMORY USAGE (SAMPLES 0: exact)."""
    return sum(
        int(conn.memory_usage(key, samples=0) or 0)
        for key in conn.scan_iter(match=match, count=1000)
    )


def ask(conn: redis.Redis, model_server: FakeOpenAI, turns: list[Turn | str]) -> tuple[int, str]:
    model_server.route("question", turns)
    rt = make_runtime(conn, model_server.url)
    run = service.submit(rt, "a question", ALICE)
    work(rt)
    return redis_bytes(conn), rt.store.load(run.id).reason or ""


def test_a_turn_of_200_huge_tool_calls_leaves_a_small_run_in_redis(
    redis_conn: redis.Redis, model_server: FakeOpenAI
) -> None:
    calls = [("calculate", "1" * 65_000) for _ in range(200)]  # 13 MB of arguments
    used, reason = ask(redis_conn, model_server, [Turn(tool_calls=calls)])
    assert reason == EndReason.TOOL_CALLS
    assert used < 256 * 1024, f"{used} bytes"  # measured before the fix: 13,443,615


def test_a_five_megabyte_answer_is_not_stored(
    redis_conn: redis.Redis, model_server: FakeOpenAI
) -> None:
    used, reason = ask(redis_conn, model_server, [Turn(text="y" * 5_000_000)])
    assert reason == EndReason.LENGTH  # past MAX_CONTENT, as a streamed reply
    assert used < 256 * 1024, f"{used} bytes"  # measured before the fix: 10,015,474


def test_the_largest_answer_kept_stays_within_the_bound(
    redis_conn: redis.Redis, model_server: FakeOpenAI
) -> None:
    used, reason = ask(redis_conn, model_server, [Turn(text="😀" * MAX_CONTENT)])
    assert reason == ""  # completed
    assert used <= question_bound(Budgets()), f"{used} bytes"
    assert used <= 3 * MAX_CONTENT * UTF8, f"{used} bytes"  # the answer twice, little else


def test_a_thread_of_many_replies_costs_each_reply_no_more_than_its_history(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    long = "w" * 3000
    model_server.route("tell me", [long + " (answer)"])
    mention = app_mention(f"<@UBOT> tell me {long}", user=ALICE_ID)
    env.event(mention)
    env.wait_for_runs(1)
    env.work()
    sizes = []
    for n in range(1, 12):  # each reply carries the thread so far, up to MAX_HISTORY_CHARS
        reply = message(f"tell me more {n} {long}", user=ALICE_ID, thread_ts=mention["ts"])
        env.event(reply)
        env.wait_for_runs(n + 1)
        env.work()
        newest = max(env.runs(), key=lambda r: r.created_at)
        assert env.rt.store.load(newest.id).status == RunStatus.COMPLETED
        sizes.append(redis_bytes(env.rt.redis, f"sb:run:{newest.id}*"))
    history_bytes = (MAX_HISTORY_CHARS + MAX_QUESTION_CHARS + 2 * len(long)) * UTF8
    assert max(sizes) <= sizes[0] + history_bytes, sizes
    assert max(sizes[-4:]) - min(sizes[-4:]) < 4 * 1024, sizes  # capped: it stopped growing
    # the bot keeps one key per thread, however many replies it has
    assert len(list(env.rt.redis.scan_iter("sb:slack:thread:*"))) == 1
    assert len(list(env.rt.redis.scan_iter(f"sb:slack:thread:{CHANNEL}:{mention['ts']}"))) == 1
