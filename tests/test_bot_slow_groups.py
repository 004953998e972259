"""A slow (not failing) Slack `usergroups.list` (issue 21, not yet tried): every question,
click, command and App Home needs the person's user groups, and Slack takes seconds to list
them. The acknowledgements must still come within Slack's 3 s, and no question may be lost.
Bolt over signed HTTP, FakeSlack answering `usergroups.list` late, Redis, RQ."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bot.render.blocks import APPROVE
from bot.transport.serve import LISTENER_THREADS
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_events import app_mention
from tests.support.slack_bot import ALICE, SUPPORT, BotEnv

SLOW = 6.0  # Slack takes this long to list the groups, every time it is asked
ACK = 3.0
MORE = LISTENER_THREADS + 4  # more requests than the bot has listener threads


def timed(send: Callable[[], object]) -> float:
    started = time.monotonic()
    send()
    return time.monotonic() - started


def timed_event(env: BotEnv, event: dict[str, Any]) -> float:
    started = time.monotonic()
    env.event(event)
    return time.monotonic() - started


def too_slow(acks: dict[str, float]) -> dict[str, float]:
    return {what: round(took, 2) for what, took in acks.items() if took >= ACK}


def click_and_command(env: BotEnv) -> dict[str, float]:
    return {
        "click": timed(lambda: env.click(APPROVE, "ap_" + "0" * 20, SUPPORT)),
        "command": timed(lambda: env.command("runs", ALICE)),
    }


def test_questions_while_slack_lists_groups_slowly_leave_acks_within_3_s_and_none_is_lost(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    model_server.route("question", ["an answer"])
    env.slack.slow("usergroups.list", SLOW, times=50)
    askers = [f"UASKER{n}" for n in range(MORE)]
    acks: dict[str, float] = {}
    for user in askers:
        mention = app_mention(f"<@UBOT> question from {user}", user=user)
        acks[user] = timed_event(env, mention)
    acks |= click_and_command(env)
    assert not too_slow(acks), f"acknowledged after {ACK} s: {too_slow(acks)}"
    runs = env.wait_for_runs(len(askers))  # every question became a run
    assert {r.requester.user_id for r in runs} == set(askers)
    env.work()  # each run asks for its asker's groups before its first step, and answers
    assert all(env.rt.store.load(r.id).answer == "an answer" for r in runs)


def test_app_home_opened_by_many_while_slack_is_slow_leaves_clicks_acked_within_3_s(
    env: BotEnv, model_server: FakeOpenAI, tickets_db: Path
) -> None:
    env.slack.slow("usergroups.list", SLOW, times=50)
    acks: dict[str, float] = {}
    for n in range(MORE):
        opened = {"type": "app_home_opened", "user": f"UHOME{n}", "tab": "home", "channel": "D0"}
        acks[f"home {n}"] = timed_event(env, opened)
    acks |= click_and_command(env)
    assert not too_slow(acks), f"acknowledged after {ACK} s: {too_slow(acks)}"
