"""SlackSurface on its own: throttled progress, assistant status upkeep, cards in the thread
and the approvals channel, and Slack failures that never reach the run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from slack_sdk import WebClient

from approvals import ApprovalRequest
from bot.outbound.slack_surface import SlackSurface
from bot.render.blocks import APPROVE, CANCEL
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import FakeSlack, next_ts
from tests.support.runtime import make_runtime, requester, wait_until, work
from tests.support.slack_bot import ALICE, CHANNEL, POLICY, TOKEN, buttons, texts
from tools.registry import Tool
from worker import jobs, service, sweeper
from worker.run import EndReason, Run, RunStatus
from worker.runtime import Runtime
from worker.surface import Guarded

APPROVALS = "C0APPROVALS"


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


@pytest.fixture
def rt(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> Runtime:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY + f"approvals_channel: {APPROVALS}\n")
    return make_runtime(redis_conn, model_server.url, policy_file=policy)


def running(rt: Runtime, **origin: str) -> Run:
    thread_ts = next_ts()
    run = service.submit(
        rt,
        "a question",
        requester(rt, ALICE),
        origin={"surface": "slack", "channel": CHANNEL, "thread_ts": thread_ts, **origin},
    )
    run.status = RunStatus.RUNNING
    rt.store.save(run)
    return run


def registered_surface(rt: Runtime, slack: FakeSlack) -> SlackSurface:
    """The Slack surface as the runtime's: the sweeper's and the expiry's redraws reach it."""
    surface = SlackSurface(WebClient(token=TOKEN, base_url=slack.url), rt)
    rt.surfaces["slack"] = surface
    return surface


def assert_both_cards_expired(updates: list[dict]) -> None:
    """The card in the thread and the one in the approvals channel say Expired, no buttons."""
    assert {u["channel"] for u in updates} == {CHANNEL, APPROVALS}
    assert all("Expired" in texts(u["blocks"]) and not buttons(u["blocks"]) for u in updates)


def ticket_request(rt: Runtime) -> tuple[Run, ApprovalRequest, Tool]:
    """A running run's create_ticket request, with no card yet."""
    run = running(rt)
    tool = rt.registry.get("create_ticket")
    assert tool is not None
    request = rt.approvals.create(
        run_id=run.id,
        call_id="c1",
        tool="create_ticket",
        args={"project": "IT", "title": "VPN", "body": "down"},
        requester=ALICE,
        team_id="T0001",
        channel_id=CHANNEL,
        policy_version=rt.policy.version,
        ttl=60,
    )
    return run, request, tool


def card_request(rt: Runtime, surface: SlackSurface) -> tuple[Run, str]:
    """A run with a create_ticket card in its thread and in the approvals channel."""
    run, request, tool = ticket_request(rt)
    surface.approval_requested(run, request, tool)
    return run, request.id


def test_progress_is_one_message_updated_at_most_once_per_interval(
    rt: Runtime, slack: FakeSlack
) -> None:
    surface = SlackSurface(WebClient(token=TOKEN, base_url=slack.url), rt, update_interval=0.3)
    run = running(rt)
    for step in range(1, 21):
        surface.progress(run, f"Thinking (step {step} of 20)")
    assert len(slack.calls("chat.postMessage")) == 1
    assert slack.calls("chat.update") == []  # all held back: the message was just posted
    update = slack.wait_for_call("chat.update")
    assert "step 20 of 20" in texts(update["blocks"])  # the latest word, not the first
    assert CANCEL in buttons(update["blocks"]) and run.origin["status_ts"] == update["ts"]

    surface.progress(run, "Running calculate")  # held back again ...
    run.status, run.reason = RunStatus.PARTIAL, EndReason.DEADLINE
    surface.finished(run)  # ... and dropped: the final state wins
    final = slack.calls("chat.update")[-1]
    assert "ran out of time" in texts(final["blocks"]) and CANCEL not in buttons(final["blocks"])
    surface.close()
    assert len(slack.calls("chat.update")) == 2


def test_assistant_status_is_refreshed_while_the_run_works(rt: Runtime, slack: FakeSlack) -> None:
    surface = SlackSurface(
        WebClient(token=TOKEN, base_url=slack.url), rt, update_interval=0.0, status_refresh=0.05
    )
    run = running(rt, assistant="1")
    surface.progress(run, "Thinking (step 1 of 8)")
    slack.wait_for(lambda: len(slack.calls("assistant.threads.setStatus")) >= 3)
    assert slack.calls("chat.postMessage") == []  # no status message in assistant threads

    run.status = RunStatus.COMPLETED
    run.answer = "Done."
    rt.store.save(run)
    surface.finished(run)
    assert slack.calls("assistant.threads.setStatus")[-1]["status"] == ""
    answer = slack.last("chat.postMessage")
    assert answer["thread_ts"] == run.origin["thread_ts"] and "Done." in texts(answer["blocks"])
    surface.close()


def test_cards_go_to_the_thread_and_the_approvals_channel_and_expire_in_both(
    rt: Runtime, slack: FakeSlack, redis_conn: redis.Redis
) -> None:
    surface = registered_surface(rt, slack)
    run, approval_id = card_request(rt, surface)
    cards = rt.approvals.get(approval_id).cards
    assert [c["channel"] for c in cards] == [CHANNEL, APPROVALS]
    assert slack.calls("chat.postMessage")[0]["thread_ts"] == run.origin["thread_ts"]
    assert "<#C0001>" in texts(slack.calls("chat.postMessage")[1]["blocks"])

    assert jobs.expire(rt, approval_id) == "expired"  # the worker's expiry calls the surface
    updates = slack.calls("chat.update")
    assert_both_cards_expired(updates)
    assert rt.approvals.owed_cards(older_than=0) == []  # nothing left for the sweeper
    surface.close()


def test_a_decision_whose_decider_died_before_redrawing_its_cards_is_redrawn_by_the_sweeper(
    rt: Runtime, slack: FakeSlack
) -> None:
    surface = registered_surface(rt, slack)
    _, approval_id = card_request(rt, surface)
    assert rt.approvals.expire(approval_id).won  # the expiry job won, then was killed
    assert slack.calls("chat.update") == []  # both cards still offer Approve
    assert sweeper.redraw_owed_cards(rt) == 0  # within the decider's own grace: not yet

    assert sweeper.redraw_owed_cards(rt, grace=0) == 1
    updates = slack.calls("chat.update")
    assert_both_cards_expired(updates)
    assert rt.approvals.owed_cards(older_than=0) == []  # drawn once: the debt is paid
    assert len(slack.calls("chat.update")) == 2
    surface.close()


def test_a_card_slack_cannot_take_now_stays_owed_and_a_deleted_one_does_not(
    rt: Runtime, slack: FakeSlack
) -> None:
    surface = registered_surface(rt, slack)
    _, first = card_request(rt, surface)
    slack.fail("chat.update", "internal_error", times=1)  # Slack's trouble: try again later
    assert jobs.expire(rt, first) == "expired"
    assert rt.approvals.owed_cards(older_than=0) == [first]
    assert sweeper.redraw_owed_cards(rt, grace=0) == 1
    assert rt.approvals.owed_cards(older_than=0) == []
    assert "Expired" in texts(slack.calls("chat.update")[-1]["blocks"])

    _, second = card_request(rt, surface)
    slack.fail("chat.update", "message_not_found", times=2)  # someone deleted both cards
    assert jobs.expire(rt, second) == "expired"
    assert rt.approvals.owed_cards(older_than=0) == []  # nothing to redraw them on
    surface.close()


def test_a_card_posted_after_its_request_was_decided_shows_the_outcome(
    rt: Runtime, slack: FakeSlack
) -> None:
    """A run driven again after its lease lapsed posts the card it asked for while the expiry
    decides: the expiry redrew the cards it knew of, not this one (found by the chaos soak)."""
    surface = registered_surface(rt, slack)

    def decided_before_its_card() -> str:
        run, request, tool = ticket_request(rt)
        assert jobs.expire(rt, request.id) == "expired"  # no card yet: nothing to redraw
        surface.approval_requested(run, request, tool)  # the card, as asked while pending
        return request.id

    def cards_say_expired(approval_id: str) -> bool:
        cards = rt.approvals.get(approval_id).cards
        messages = [slack.message(c["channel"], c["ts"]) for c in cards]
        assert {c["channel"] for c in cards} == {CHANNEL, APPROVALS}
        return all(
            m is not None and "Expired" in texts(m["blocks"]) and not buttons(m["blocks"])
            for m in messages
        )

    first = decided_before_its_card()
    assert cards_say_expired(first)
    assert rt.approvals.owed_cards(older_than=0) == []

    slack.fail("chat.update", "internal_error", times=2)  # the redraw fails: still owed
    second = decided_before_its_card()
    assert not cards_say_expired(second)
    assert rt.approvals.owed_cards(older_than=0) == [second]
    assert sweeper.redraw_owed_cards(rt, grace=0) == 1
    assert cards_say_expired(second)
    assert rt.approvals.owed_cards(older_than=0) == []
    surface.close()


def test_a_run_driven_again_before_its_save_does_not_post_its_cards_twice(
    rt: Runtime, slack: FakeSlack, model_server: FakeOpenAI
) -> None:
    """A worker that stopped after posting a turn's cards but before saving asked again for
    the same (still pending) request when the run was driven again, and posted its cards a
    second time (seen in the chaos soak's Slack)."""
    registered_surface(rt, slack)
    create = {"project": "IT", "title": "VPN", "body": "down"}
    model_server.route("VPN", [Turn(tool_calls=[("create_ticket", create)]), "Filed."])
    origin = {"surface": "slack", "channel": CHANNEL, "thread_ts": next_ts()}
    run = service.submit(rt, "file a ticket: VPN is down", requester(rt, ALICE), origin=origin)
    work(rt)

    def cards() -> list[dict]:
        return [c for c in slack.calls("chat.postMessage") if APPROVE in buttons(c["blocks"])]

    assert len(cards()) == 2  # the thread and the approvals channel
    stored = rt.store.load(run.id)
    assert stored.status == RunStatus.AWAITING_APPROVAL
    [call] = stored.turn
    request = rt.approvals.get(call.approval_id or "")
    stored.status, call.approval_id = RunStatus.RUNNING, None  # as saved before it asked
    rt.store.save(stored)
    rt.enqueue_advance(run.id)
    work(rt)

    again = rt.store.load(run.id)
    assert again.status == RunStatus.AWAITING_APPROVAL and again.turn[0].approval_id == request.id
    assert len(cards()) == 2  # the cards out already still stand for it
    assert rt.approvals.get(request.id).status.value == "pending"


def test_slack_failures_never_reach_the_run(rt: Runtime, slack: FakeSlack) -> None:
    slack_surface = SlackSurface(WebClient(token=TOKEN, base_url=slack.url), rt)
    surface = Guarded(slack_surface)  # as the runtime calls every surface
    run = running(rt)
    slack.fail("chat.postMessage", "channel_not_found", times=10)
    surface.progress(run, "Thinking")
    tool = rt.registry.get("create_ticket")
    assert tool is not None
    request = rt.approvals.create(
        run_id=run.id,
        call_id="c1",
        tool="create_ticket",
        args={"title": "x"},
        requester=ALICE,
        team_id="T0001",
        channel_id=CHANNEL,
        policy_version=rt.policy.version,
        ttl=60,
    )
    surface.approval_requested(run, request, tool)
    run.status, run.answer = RunStatus.COMPLETED, "ok"
    surface.finished(run)
    slack.stop()  # Slack unreachable altogether
    surface.progress(run, "Thinking")
    surface.approval_resolved(run, request)
    assert "status_ts" not in run.origin
    slack_surface.close()


def test_a_slack_outage_answering_5xx_is_retried_rather_than_losing_the_card(slack: FakeSlack):
    from bot.outbound.slack_surface import with_rate_limit_retries

    client = with_rate_limit_retries(WebClient(token=TOKEN, base_url=slack.url))
    posted = client.chat_postMessage(channel=CHANNEL, text="card")
    slack.server_error("chat.update", times=2)  # Slack's 503s, then it answers again
    client.chat_update(channel=CHANNEL, ts=posted["ts"], text="Approved by <@U1>")
    assert len(slack.calls("chat.update")) == 3
    updated = slack.message(CHANNEL, posted["ts"])
    assert updated is not None and updated["text"] == "Approved by <@U1>"


def asked_in_a_thread(
    rt: Runtime, slack: FakeSlack, model_server: FakeOpenAI, question: str, answer: str
) -> tuple[Run, str]:
    """`question` asked in a new thread whose status message exists already (progress
    updates it: the answer is the run's first chat.postMessage), the model to answer
    `answer`; the Slack surface registered as the runtime's."""
    registered_surface(rt, slack)
    model_server.route(question, [Turn(answer)])
    thread_ts = next_ts()
    status_ts = slack.add_message(CHANNEL, "Working", thread_ts=thread_ts)
    origin = {"surface": "slack", "channel": CHANNEL, "thread_ts": thread_ts}
    run = service.submit(
        rt, question, requester(rt, ALICE), origin={**origin, "status_ts": status_ts}
    )
    return run, thread_ts


@pytest.mark.parametrize(("error", "later"), [("ratelimited", True), ("channel_not_found", False)])
def test_an_answer_slack_cannot_take_for_now_is_posted_later_and_one_it_refuses_is_not(
    redis_conn: redis.Redis,
    model_server: FakeOpenAI,
    slack: FakeSlack,
    tickets_db: Path,
    error: str,
    later: bool,
) -> None:
    """Slack limiting the bot's rate past the client's retries, or down, as the answer is
    posted: the answer was lost for good (the chaos soak: `ratelimited` three times in a
    row). The run, saved as ended, stays due and marked as not yet said; the worker the
    sweeper gives it to posts it, or marks it again for the next. A refusal for good (the
    channel is gone) is not tried again."""
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=0.6, stream_answers=False)
    run, thread_ts = asked_in_a_thread(
        rt, slack, model_server, "said later", "Posted when Slack took it."
    )
    # the answer's posts (progress updates the status): the first, and when it is posted
    # later, the first late try too
    slack.fail("chat.postMessage", error, times=2 if later else 1)

    def answers() -> list[dict]:
        return [m for m in slack.thread(CHANNEL, thread_ts) if "Posted when" in str(m)]

    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED and answers() == []
    assert bool(redis_conn.exists(rt.store.keys.untold(run.id))) is later
    if not later:  # said as well as it can be: not due, nothing to try again
        assert not rt.store.overdue(older_than=0)
        return
    # due two leases from now: behind runs whose worker died, which the sweeper takes first
    due = redis_conn.zscore(rt.store.keys.due, run.id)
    assert due is not None and due > time.time() * 1000
    wait_until(lambda: sweeper.sweep(rt) == 1, what="the sweeper to queue the run again")
    work(rt)
    assert answers() == [] and redis_conn.exists(rt.store.keys.untold(run.id))  # still to say
    wait_until(lambda: sweeper.sweep(rt) == 1, what="the sweeper to queue the run again")
    work(rt)
    assert len(answers()) == 1  # before: never posted
    assert not redis_conn.exists(rt.store.keys.untold(run.id))


def test_a_long_answer_slack_refuses_part_way_is_not_posted_again_whole(
    redis_conn: redis.Redis, model_server: FakeOpenAI, slack: FakeSlack, tickets_db: Path
) -> None:
    """An answer of two messages whose second Slack refuses for now: posted again whole, its
    first message showed twice at every try (found by review). It is not tried again."""
    rt = make_runtime(redis_conn, model_server.url, lease_seconds=0.6, stream_answers=False)
    long_answer = " ".join(f"Line {n} of a long answer." for n in range(500))  # > 8,700 chars
    run, thread_ts = asked_in_a_thread(rt, slack, model_server, "a long one", long_answer)
    slack.fail("chat.postMessage", "ratelimited", after=1)  # the answer's second message
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    # the first message posted, once; the refused second lost (logged: surface_failed)
    thread = [str(m) for m in slack.thread(CHANNEL, thread_ts)]
    assert len([m for m in thread if "Line 1 of" in m]) == 1
    assert not [m for m in thread if "Line 499 of" in m]
    assert not redis_conn.exists(rt.store.keys.untold(run.id))
    assert not rt.store.overdue(older_than=-60)  # not due, at any time: not tried again


def test_a_card_posted_as_redis_restarts_is_recorded_once_it_answers(
    rt: Runtime, slack: FakeSlack, redis_conn: redis.Redis
) -> None:
    """The card is in Slack; its record failed on a Redis restart, so the decision made on
    it was never drawn there (found by the chaos soak, seed 62). It is recorded once Redis
    answers, and only once."""
    from approvals import store as approval_store
    from tests.test_faults import refused_once

    surface = registered_surface(rt, slack)
    mark = "sb:test:refused:card"
    rt.approvals._add_card = refused_once(redis_conn, approval_store._ADD_CARD, mark)
    _, approval_id = card_request(rt, surface)
    assert int(redis_conn.get(mark) or 0) >= 2  # refused (LOADING) once, then recorded
    cards = rt.approvals.get(approval_id).cards
    assert [c["channel"] for c in cards] == [CHANNEL, APPROVALS]
    rt.approvals._add_card = redis_conn.register_script(approval_store._ADD_CARD)
    assert rt.approvals.add_card(approval_id, cards[0]) is True  # recorded again: kept once
    assert rt.approvals.get(approval_id).cards == cards
    assert jobs.expire(rt, approval_id) == "expired"  # nothing left pending for later tests
    assert_both_cards_expired(slack.calls("chat.update"))  # drawn on both cards
    surface.close()
