"""`/switchboard runs`, `/switchboard run ID` and App Home show each role what it may see
(its own runs; admins everyone's), and nothing more."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot.render.blocks import APPROVE, VIEW_RUN
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.support.runtime import requester
from tests.support.slack_bot import (
    ADMIN,
    ALICE,
    CHANNEL,
    SUPPORT,
    BotEnv,
    answered,
    buttons,
    texts,
)
from worker import service
from worker.run import Run

BOB = "UBOB"


@pytest.fixture
def runs(env: BotEnv, model_server: FakeOpenAI) -> dict[str, Run]:
    """Alice's and Bob's finished runs, and a run of Alice's waiting for support's approval."""
    model_server.route("SQL Basics", ["SQL Basics costs 2499."])
    model_server.route("salary", ["I cannot see salaries."])
    model_server.route(
        "VPN",
        [Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "VPN", "body": "down"})])],
    )
    made = {
        "alice": service.submit(env.rt, "What does SQL Basics cost?", requester(env.rt, ALICE)),
        "bob": service.submit(env.rt, "Bob's private salary question", requester(env.rt, BOB)),
        "waiting": service.submit(env.rt, "File a VPN ticket", requester(env.rt, ALICE)),
    }
    env.work()
    return {name: env.rt.store.load(run.id) for name, run in made.items()}


def listing(env: BotEnv, text: str, user: str) -> str:
    shown = answered(env, "chat.postEphemeral", lambda: env.command(text, user))
    assert shown["user"] == user and shown["channel"] == CHANNEL
    return texts(shown["blocks"])


def test_runs_lists_only_your_own_unless_you_are_an_admin(
    env: BotEnv, runs: dict[str, Run]
) -> None:
    alice, bob, waiting = runs["alice"].id, runs["bob"].id, runs["waiting"].id

    mine = listing(env, "runs", ALICE)
    assert alice in mine and waiting in mine and bob not in mine
    for text in ("runs all", f"runs <@{BOB}|bob>", f"runs {BOB} completed"):
        shown = listing(env, text, ALICE)
        assert bob not in shown and "Only admins" in shown
    only_waiting = listing(env, "runs awaiting_approval", ALICE)
    assert waiting in only_waiting and alice not in only_waiting

    everyone = listing(env, "runs all", ADMIN)
    assert alice in everyone and bob in everyone
    bobs = listing(env, f"runs <@{BOB}|bob>", ADMIN)
    assert bob in bobs and alice not in bobs

    assert (
        "doesn't look like a run id"
        in answered(env, "chat.postEphemeral", lambda: env.command("run ../../etc", ALICE))["text"]
    )
    assert (
        "/switchboard runs"
        in answered(env, "chat.postEphemeral", lambda: env.command("help", ALICE))["text"]
    )


def test_run_shows_the_trajectory_only_to_its_requester_and_admins(
    env: BotEnv, runs: dict[str, Run]
) -> None:
    alice, bob = runs["alice"], runs["bob"]

    refused = answered(env, "chat.postEphemeral", lambda: env.command(f"run {bob.id}", ALICE))
    assert "someone else's" in refused["text"]
    refused = answered(env, "chat.postEphemeral", lambda: env.click(VIEW_RUN, bob.id, ALICE))
    assert "someone else's" in refused["text"]
    assert env.slack.calls("views.open") == []

    opened = answered(env, "views.open", lambda: env.command(f"run {alice.id}", ALICE))
    shown = texts(opened["view"]["blocks"])
    for expected in (
        alice.id,
        "What does SQL Basics cost?",
        "model step 1",
        "Totals",
        "SQL Basics costs 2499.",
        "Demonstrations",
    ):
        assert expected in shown
    assert len(opened["view"]["blocks"]) <= 100

    opened = answered(env, "views.open", lambda: env.command(f"run {bob.id}", ADMIN))
    assert "Bob's private salary question" in texts(opened["view"]["blocks"])
    opened = answered(env, "views.open", lambda: env.click(VIEW_RUN, bob.id, ADMIN))
    assert bob.id in texts(opened["view"]["blocks"])


def test_app_home_shows_each_role_what_it_may_see(env: BotEnv, runs: dict[str, Run]) -> None:
    alice, bob, waiting = runs["alice"], runs["bob"], runs["waiting"]
    [approval_id] = waiting.pending_approvals

    def home(user: str) -> dict[str, Any]:
        event = {
            "type": "app_home_opened",
            "user": user,
            "channel": "D0HOME",
            "tab": "home",
            "event_ts": "1700000000.000001",
        }
        published = answered(env, "views.publish", lambda: env.event(event))
        assert published["user_id"] == user
        assert len(json.dumps(published["view"])) < 250_000
        return published["view"]

    view = home(ALICE)
    shown = texts(view["blocks"])
    assert alice.id in shown and waiting.id in shown and bob.id not in shown
    assert "Nothing is waiting for you" in shown  # she may not approve her own call
    assert "Today's spend" not in shown and "Recent runs (everyone)" not in shown

    view = home(SUPPORT)  # through the @support-team user group
    assert buttons(view["blocks"])[APPROVE] == approval_id
    assert alice.id not in texts(view["blocks"]) and bob.id not in texts(view["blocks"])

    view = home(ADMIN)
    shown = texts(view["blocks"])
    assert alice.id in shown and bob.id in shown and "Today's spend" in shown
    assert "All pending approvals" in shown and "create_ticket" in shown
    assert APPROVE not in buttons(view["blocks"])  # admins see it, support decides it
    assert len(view["blocks"]) <= 100
