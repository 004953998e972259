"""A question whose `submit` fails on Redis after Slack has its ack.

Before: `attach` had already claimed the event, so Slack's retry was dropped; the listener
boundary logged the error and nobody told the person, who waited for an answer that never
came. Now they are told nothing was started, the claim is given back (a retry of the same
event starts the run); a run stored though Redis answered with an error goes on, and
nobody is told to ask again.

Redis fails for real: the bot's connection is a Redis ACL user that an admin connection
changes while the bot runs (ACL changes apply to open connections at once).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from bot.render import messages as m
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_events import BOT_USER_ID
from tests.fakes.slack_server import (
    app_mention,
    assistant_thread_started,
    message,
    message_im,
    next_ts,
)
from tests.support.redis_server import RedisServer
from tests.support.runtime import make_runtime
from tests.support.slack_bot import ALICE, CHANNEL, BotEnv, bot_env
from worker import service
from worker.limits import Limits
from worker.run import Requester, RunStatus

USER, PASSWORD = "switchboard", "a-password-for-the-bot"
RETRY = {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
ALICE_IN_CHANNEL = Requester(user_id=ALICE, team_id="T0001", channel_id=CHANNEL, roles=["everyone"])


def let_the_bot(admin: redis.Redis, commands: list[str], keys: str = "*") -> None:
    admin.acl_setuser(
        USER,
        enabled=True,
        reset=True,
        passwords=[f"+{PASSWORD}"],
        keys=[keys],
        channels=["*"],
        commands=commands,
    )


def redis_works(admin: redis.Redis) -> None:
    let_the_bot(admin, ["+@all"])


def transactions_fail(admin: redis.Redis) -> None:
    """Every MULTI ... EXEC is refused (NOPERM), so `submit` cannot create its run, while
    the claim of the event (a plain SET NX) and every read still work. EXEC, not MULTI: a
    refused MULTI leaves the commands after it to run one by one (the run would be written
    outside any transaction); a refused EXEC discards the whole transaction (Redis 7)."""
    let_the_bot(admin, ["+@all", "-exec"])


def the_queue_fails(admin: redis.Redis) -> None:
    """The bot may touch only its own keys (`sb:*`), not RQ's (`rq:*`): a transaction that
    writes a run and its job is refused whole (EXECABORT)."""
    let_the_bot(admin, ["+@all"], keys="sb:*")


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[redis.Redis]:
    """A private Redis (its ACL users are this test's alone), as its default user."""
    server = RedisServer(tmp_path / "redis").start()
    conn = redis.Redis(unix_socket_path=server.socket)
    redis_works(conn)
    yield conn
    conn.close()
    server.stop()


@pytest.fixture
def conn(admin: redis.Redis) -> Iterator[redis.Redis]:
    """The bot's connection: the ACL user the admin changes."""
    socket = admin.connection_pool.connection_kwargs["path"]
    connection = redis.Redis(unix_socket_path=socket, username=USER, password=PASSWORD)
    yield connection
    connection.close()


@pytest.fixture
def bot(
    conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> Iterator[BotEnv]:
    with bot_env(conn, model_server.url, tmp_path) as env:
        yield env


def warnings_named(
    logs: list[MutableMapping[str, Any]], name: str
) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name and e["log_level"] == "warning"]


def told(bot: BotEnv, method: str) -> list[dict[str, Any]]:
    return [a for a in bot.slack.calls(method) if a.get("text") == m.QUESTION_NOT_STARTED]


def test_a_mention_that_cannot_be_submitted_is_told_nothing_started_and_a_retry_starts_it(
    bot: BotEnv, admin: redis.Redis, model_server: FakeOpenAI
) -> None:
    model_server.route("SQL", ["SQL Basics costs $499."])
    mention = app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE)
    transactions_fail(admin)
    with capture_logs() as logs:
        bot.event(mention, event_id="Ev0SUBMIT01")
        bot.settle()

    [said] = told(bot, "chat.postMessage")  # in the thread, as the other refusals of `ask`
    assert (said["channel"], said["thread_ts"]) == (CHANNEL, mention["ts"])
    assert told(bot, "chat.postEphemeral") == []
    assert bot.runs() == []
    [warning] = warnings_named(logs, "question_submit_failed")
    assert (warning["event_id"], warning["error"]) == ("Ev0SUBMIT01", "ExecAbortError")
    assert "SQL" not in repr(warning) and PASSWORD not in repr(warning)
    assert [e for e in logs if e["event"] == "listener_failed"] == []

    redis_works(admin)
    bot.event(mention, event_id="Ev0SUBMIT01", headers=RETRY)  # Slack's retry of that event
    [run] = bot.wait_for_runs(1)
    assert (run.question, run.origin["event_id"]) == ("what does SQL Basics cost?", "Ev0SUBMIT01")
    bot.work()
    assert bot.rt.store.load(run.id).status == RunStatus.COMPLETED
    bot.slack.wait_for_message(
        CHANNEL, lambda s: s.get("thread_ts") == mention["ts"] and "$499" in str(s)
    )


def test_an_overheard_reply_that_cannot_be_submitted_is_told_to_its_author_alone(
    bot: BotEnv, admin: redis.Redis, model_server: FakeOpenAI
) -> None:
    model_server.route("SQL", ["SQL Basics costs $499."])
    model_server.route("Django", ["Django Fundamentals costs $799."])
    mention = app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE)
    bot.event(mention)
    [first] = bot.wait_for_runs(1)
    bot.work()  # answered: the bot now follows replies in this thread

    reply = message("and Django?", user=ALICE, thread_ts=mention["ts"])
    transactions_fail(admin)
    with capture_logs() as logs:
        bot.event(reply, event_id="Ev0SUBMIT02")
        bot.settle()

    [said] = told(bot, "chat.postEphemeral")  # not posted to everyone in the thread
    assert (said["channel"], said["user"], said["thread_ts"]) == (CHANNEL, ALICE, mention["ts"])
    assert told(bot, "chat.postMessage") == []
    assert [r.id for r in bot.runs()] == [first.id]
    [warning] = warnings_named(logs, "question_submit_failed")
    assert warning["event_id"] == "Ev0SUBMIT02" and "Django" not in repr(warning)

    redis_works(admin)
    bot.event(reply, event_id="Ev0SUBMIT02", headers=RETRY)
    second = bot.wait_for_runs(2)[0]
    assert (second.question, second.parent_id) == ("and Django?", first.id)


def reads_fail(admin: redis.Redis) -> None:
    """GET is refused: the bot cannot look up which threads it answered in."""
    let_the_bot(admin, ["+@all", "-get"])


def test_a_reply_while_redis_cannot_say_which_threads_the_bot_answered_is_not_dropped(
    bot: BotEnv, admin: redis.Redis, model_server: FakeOpenAI
) -> None:
    """The thread lookup failing used to end the listener: the reply, claimed and acked, was
    dropped with nobody told. Slack's copy of the thread says whether the bot replied
    there: its author is told nothing was started; a reply in someone else's thread, or
    under a message the bot started a thread with, still gets nothing."""
    model_server.route("SQL", ["SQL Basics costs $499."])
    mention = app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE)
    bot.event(mention)
    bot.wait_for_runs(1)
    bot.work()  # answered: the bot follows replies in this thread
    chatter = bot.slack.add_message(CHANNEL, "lunch at noon?", user="UBOB")
    # a thread the bot started (a card in the approvals channel) but never answered in
    card = bot.slack.add_message(CHANNEL, "Approve?", user=BOT_USER_ID)

    reads_fail(admin)
    with capture_logs() as logs:
        for said in (  # one after another: Slack is read for one thread at a time
            message("and Django?", user=ALICE, thread_ts=mention["ts"]),
            message("sure", user="UCAROL", thread_ts=chatter),
            message("looks fine to me", user="UCAROL", thread_ts=card),
        ):
            bot.event(said)
            bot.settle()

    [said] = told(bot, "chat.postEphemeral")
    assert (said["channel"], said["user"], said["thread_ts"]) == (CHANNEL, ALICE, mention["ts"])
    assert told(bot, "chat.postMessage") == []
    assert len(bot.slack.calls("conversations.replies")) == 3  # one look at each thread
    assert len(warnings_named(logs, "thread_lookup_failed")) == 3
    assert len(bot.runs()) == 1  # nothing started from what Slack said
    assert [e for e in logs if e["event"] == "listener_failed"] == []


def test_an_assistant_thread_message_is_asked_though_redis_cannot_say_it_is_one(
    bot: BotEnv, admin: redis.Redis, model_server: FakeOpenAI
) -> None:
    """A DM thread's message is a question either way; the lookup of whether the thread is an
    assistant thread (for its status and title) failing used to drop it unheard."""
    model_server.route("SQL", ["SQL Basics costs $499."])
    thread_ts = next_ts()
    bot.event(assistant_thread_started(thread_ts, user=ALICE))
    bot.slack.wait_for_call("assistant.threads.setSuggestedPrompts")
    let_the_bot(admin, ["+@all", "-exists"])  # the assistant-thread mark cannot be read
    with capture_logs() as logs:
        bot.event(message_im("What does SQL Basics cost?", user=ALICE, thread_ts=thread_ts))
        [run] = bot.wait_for_runs(1)
    assert run.origin["thread_ts"] == thread_ts and run.origin["assistant"] == ""
    assert len(warnings_named(logs, "assistant_lookup_failed")) == 1
    redis_works(admin)
    bot.work()
    bot.slack.wait_for_message("D0001", lambda msg: "$499" in json.dumps(msg))


def test_a_question_whose_job_is_refused_stores_nothing_and_its_retry_starts_it(
    bot: BotEnv, admin: redis.Redis, model_server: FakeOpenAI
) -> None:
    """A run and its job are written in one transaction: a queue that refuses the job leaves
    no run behind (not one the sweeper would queue later), so the person is told nothing
    started, and Slack's retry of the event starts it once the queue works."""
    model_server.route("SQL", ["SQL Basics costs $499."])
    mention = app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE)
    the_queue_fails(admin)
    with capture_logs() as logs:
        bot.event(mention, event_id="Ev0SUBMIT03")
        bot.settle()

    assert bot.runs() == []
    [said] = told(bot, "chat.postMessage")
    assert (said["channel"], said["thread_ts"]) == (CHANNEL, mention["ts"])
    [warning] = warnings_named(logs, "question_submit_failed")
    assert (warning["event_id"], warning["error"]) == ("Ev0SUBMIT03", "NoPermissionError")
    assert admin.zcard(bot.rt.store.keys.due) == 0 and admin.keys("sb:run:*") == []

    redis_works(admin)
    bot.event(mention, event_id="Ev0SUBMIT03", headers=RETRY)
    [run] = bot.wait_for_runs(1)
    assert run.origin["event_id"] == "Ev0SUBMIT03"


def test_the_person_is_told_even_when_the_claim_cannot_be_given_back(
    bot: BotEnv, admin: redis.Redis
) -> None:
    mention = app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE)
    let_the_bot(admin, ["+@all", "-exec", "-del"])  # the claim's DEL is refused too
    with capture_logs() as logs:
        bot.event(mention, event_id="Ev0SUBMIT04")
        bot.settle()

    assert len(told(bot, "chat.postMessage")) == 1 and bot.runs() == []
    [kept] = warnings_named(logs, "event_claim_kept")
    assert (kept["event_id"], kept["error"]) == ("Ev0SUBMIT04", "NoPermissionError")
    assert [e for e in logs if e["event"] == "listener_failed"] == []


def test_a_question_not_started_gives_its_place_in_flight_back(
    admin: redis.Redis, conn: redis.Redis, model_server: FakeOpenAI
) -> None:
    """Admitted (one of the person's runs in flight) before the run could be stored: the
    place is given back, so the person's next question is not left waiting in line behind
    a run that does not exist until the place goes stale (the job timeout)."""

    rt = make_runtime(conn, model_server.url, limits=Limits(runs_in_flight=1))
    alice = ALICE_IN_CHANNEL
    transactions_fail(admin)
    with pytest.raises(service.QuestionNotStarted, match="ExecAbortError"):
        service.submit(rt, "what does SQL Basics cost?", alice)
    assert admin.zcard(rt.store.keys.person(ALICE, "active")) == 0

    redis_works(admin)
    run = service.submit(rt, "what does SQL Basics cost?", alice)
    assert rt.limits.waiting(ALICE) == 0  # admitted, not in line
    assert [e.kind for e in rt.events.read(run.id)] == ["run_created"]


def test_a_question_that_waited_in_line_and_was_not_started_leaves_the_line(
    admin: redis.Redis, conn: redis.Redis, model_server: FakeOpenAI
) -> None:
    """Its place in the person's line is given back too: left there, it would be admitted
    in place of the next real question (and hold a place in flight until stale)."""

    rt = make_runtime(conn, model_server.url, limits=Limits(runs_in_flight=1))
    alice = ALICE_IN_CHANNEL
    first = service.submit(rt, "what does SQL Basics cost?", alice)  # in flight
    transactions_fail(admin)
    with pytest.raises(service.QuestionNotStarted):
        service.submit(rt, "and Django?", alice)
    assert rt.limits.waiting(ALICE) == 0
    redis_works(admin)
    third = service.submit(rt, "and Python?", alice)  # waits in line, behind the first
    assert rt.limits.release(ALICE, first.id, rt.store.keys.due) == [third.id]


def test_a_run_stored_though_its_transaction_failed_goes_on_and_is_not_told_to_ask_again(
    admin: redis.Redis, conn: redis.Redis, model_server: FakeOpenAI
) -> None:
    """Redis runs the rest of a transaction when one of its commands fails (here the due
    entry: the key holds the wrong type): the run is there, so submit returns it, queued.
    Which command failed is not known, so its job is queued again: a run's second job finds
    it taken or done (worker/jobs.py)."""

    rt = make_runtime(conn, model_server.url)
    alice = ALICE_IN_CHANNEL
    admin.set(rt.store.keys.due, "not a sorted set")
    with capture_logs() as logs:
        run = service.submit(rt, "what does SQL Basics cost?", alice)
    assert rt.store.load(run.id).status == RunStatus.QUEUED
    assert rt.queue.count == 2  # queued all the same, in the transaction and after it
    assert warnings_named(logs, "run_created_despite_error")[0]["run_id"] == run.id


def test_a_mention_whose_thread_cannot_be_looked_up_is_told_nothing_started(
    bot: BotEnv, admin: redis.Redis, model_server: FakeOpenAI
) -> None:
    """Redis failing before the submit (here every GET: the thread's last run) is the same
    for the person: told, and the event given back for Slack's retry."""
    model_server.route("SQL", ["SQL Basics costs $499."])
    mention = app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE)
    let_the_bot(admin, ["+@all", "-get"])
    with capture_logs() as logs:
        bot.event(mention, event_id="Ev0SUBMIT05")
        bot.settle()

    [said] = told(bot, "chat.postMessage")
    assert (said["channel"], said["thread_ts"]) == (CHANNEL, mention["ts"])
    assert bot.runs() == []
    [warning] = warnings_named(logs, "question_submit_failed")
    assert (warning["event_id"], warning["error"]) == ("Ev0SUBMIT05", "NoPermissionError")
    assert [e for e in logs if e["event"] == "listener_failed"] == []

    redis_works(admin)
    bot.event(mention, event_id="Ev0SUBMIT05", headers=RETRY)
    [run] = bot.wait_for_runs(1)
    assert run.origin["event_id"] == "Ev0SUBMIT05"
