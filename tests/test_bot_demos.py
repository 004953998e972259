"""Issue 4: in Slack, admins get a "Save as demonstration" button on completed runs. The click
adds a candidate to the task library (never shown to the model until accepted); everyone
else's click, forged or not, is refused and stores nothing."""

from __future__ import annotations

import pytest

from bot.render.blocks import SAVE_DEMO
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.support.runtime import event_kinds, requester
from tests.support.slack_bot import (
    ADMIN,
    ALICE,
    CHANNEL,
    STRANGER,
    BotEnv,
    answered,
    buttons,
    shown_view,
    texts,
)
from worker import service
from worker.library import Selector, TaskLibrary
from worker.run import Run, RunStatus

QUESTION = "What does Django Fundamentals cost?"
REVIEW = "it is not shown to the model until accepted with `switchboard demos review`"


def finished(env: BotEnv, question: str) -> Run:
    run = service.submit(env.rt, question, requester(env.rt, ALICE))
    env.work()
    return env.rt.store.load(run.id)


@pytest.fixture
def looked_up(env: BotEnv, model_server: FakeOpenAI) -> Run:
    """Alice's completed run with one successful tool call."""
    model_server.route(
        "Django",
        [
            Turn(tool_calls=[("knowledge_lookup", {"name": "Django Fundamentals"})]),
            "Django Fundamentals costs INR 2999.",
        ],
    )
    run = finished(env, QUESTION)
    assert run.status == RunStatus.COMPLETED and run.usage.tool_calls == 1
    return run


def modal_of(env: BotEnv, user: str, run: Run) -> dict:
    return answered(env, "views.open", lambda: env.command(f"run {run.id}", user))["view"]


def library(env: BotEnv) -> TaskLibrary:
    return TaskLibrary(env.rt.redis, namespace=env.rt.settings.namespace)


def test_an_admin_saves_a_completed_run_from_its_modal_as_a_candidate(
    env: BotEnv, looked_up: Run
) -> None:
    assert SAVE_DEMO not in buttons(modal_of(env, ALICE, looked_up)["blocks"])  # not an admin
    shown = modal_of(env, ADMIN, looked_up)
    assert buttons(shown["blocks"])[SAVE_DEMO] == looked_up.id
    assert "switchboard demos review" in texts(shown["blocks"])

    view = shown_view(env.slack, SAVE_DEMO, looked_up.id)
    update = answered(
        env,
        "views.update",
        lambda: env.click(SAVE_DEMO, looked_up.id, ADMIN, view={"id": view["id"], "type": "modal"}),
    )
    assert update["view_id"] == view["id"]
    said = texts(update["view"]["blocks"])
    assert f"Saved as candidate `run-{looked_up.id}`; {REVIEW}." in said
    assert SAVE_DEMO not in buttons(update["view"]["blocks"])
    assert "saved as candidate demonstration" in said  # the run's own record says who

    [candidate] = library(env).candidates()
    assert (candidate.id, candidate.status, candidate.source_run) == (
        f"run-{looked_up.id}",
        "candidate",
        looked_up.id,
    )
    assert candidate.question == QUESTION and "2999" in candidate.answer
    assert [call.tool for step in candidate.steps for call in step] == ["knowledge_lookup"]
    assert candidate.id not in {d.id for d in library(env).accepted()}  # the model never sees it
    assert "demo_candidate_saved" in event_kinds(env.rt, looked_up)

    again = answered(
        env,
        "views.update",
        lambda: env.click(SAVE_DEMO, looked_up.id, ADMIN, view={"id": view["id"], "type": "modal"}),
    )
    assert "already saved as demonstration" in texts(again["view"]["blocks"])
    reopened = modal_of(env, ADMIN, looked_up)
    assert SAVE_DEMO not in buttons(reopened["blocks"])
    assert "already saved" in texts(reopened["blocks"]) and "candidate" in texts(reopened["blocks"])
    assert len(library(env).candidates()) == 1


def test_a_click_from_anyone_but_an_admin_is_refused_and_stores_nothing(
    env: BotEnv, looked_up: Run
) -> None:
    refused = answered(
        env,
        "chat.postEphemeral",
        lambda: env.click(SAVE_DEMO, looked_up.id, ALICE, channel=CHANNEL),  # her own run
    )
    assert (
        refused["user"] == ALICE
        and refused["text"] == "Only admins can save runs as demonstrations."
    )
    pushed = answered(
        env,
        "views.push",
        lambda: env.click(
            SAVE_DEMO, looked_up.id, STRANGER, view={"id": "V0FORGED", "type": "modal"}
        ),
    )
    assert "Only admins" in texts(pushed["view"]["blocks"])

    assert library(env).candidates() == []
    assert env.rt.redis.keys("sb:demos:*") == []
    assert env.slack.calls("views.update") == []
    assert "demo_candidate_saved" not in event_kinds(env.rt, looked_up)


def test_runs_that_cannot_be_demonstrations_get_no_button_and_a_clear_answer(
    env: BotEnv, model_server: FakeOpenAI
) -> None:
    model_server.route("SQL Basics", ["SQL Basics costs 2499."])
    model_server.route(
        "VPN",
        [Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "VPN", "body": "down"})])],
    )
    no_tools = finished(env, "What does SQL Basics cost?")
    waiting = finished(env, "File a VPN ticket")
    assert waiting.status == RunStatus.AWAITING_APPROVAL

    for run in (no_tools, waiting):
        assert SAVE_DEMO not in buttons(modal_of(env, ADMIN, run)["blocks"])

    told = answered(
        env, "chat.postEphemeral", lambda: env.click(SAVE_DEMO, no_tools.id, ADMIN, channel=CHANNEL)
    )
    assert told["text"].startswith("Not saved:") and "no successful tool call" in told["text"]
    told = answered(
        env, "chat.postEphemeral", lambda: env.click(SAVE_DEMO, waiting.id, ADMIN, channel=CHANNEL)
    )
    assert "only completed runs can be promoted" in told["text"]
    told = answered(
        env, "chat.postEphemeral", lambda: env.click(SAVE_DEMO, "r0123456789abcdef", ADMIN)
    )
    assert "can't find run" in told["text"]
    assert env.rt.redis.keys("sb:demos:*") == []


def test_with_demonstrations_on_the_candidate_goes_to_the_runtimes_library(
    env: BotEnv, looked_up: Run
) -> None:
    own = TaskLibrary(env.rt.redis, namespace="sb:library:")
    env.rt.demos = Selector(own)
    told = answered(
        env,
        "chat.postEphemeral",
        lambda: env.click(SAVE_DEMO, looked_up.id, ADMIN, channel=CHANNEL),
    )
    assert told["text"] == f"Saved as candidate `run-{looked_up.id}`; {REVIEW}."
    assert [d.id for d in own.candidates()] == [f"run-{looked_up.id}"]
    assert library(env).candidates() == []
