"""Profiles in Slack, end to end: a mention in a profile's channel reaches the model with that
profile's instructions, model and tools, and its answer and run view name the profile; a
mention elsewhere gets the defaults; a DM gets the `dm` profile. Signed requests to the
real Bolt app, FakeSlack, FakeOpenAI, a real Redis and RQ worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.render.blocks import VIEW_RUN
from tests.fakes.openai_server import FakeOpenAI, conversation_key
from tests.fakes.slack_server import app_mention, message_im
from tests.support.slack_bot import ALICE, POLICY, answered, bot_env, buttons, texts

IT_TEXT = "You are Acme's IT help desk."
DM_TEXT = "In DMs, answer in one sentence."
PROFILES = f"""\
profiles:
  it-help:
    channels: [C0ITHELP]
    instructions: "{IT_TEXT}"
    tools: [search_tickets, create_ticket]
    model: gpt-it
  dm:
    instructions: "{DM_TEXT}"
    tools: [knowledge_lookup]
"""


BUILT_IN = {
    "calculate",
    "knowledge_lookup",
    "search_tickets",
    "create_ticket",
    "update_ticket",
    "close_ticket",
}


def request_for(server: FakeOpenAI, question: str) -> dict[str, Any]:
    [request] = [r for r in server.chat_requests if conversation_key(r) == question]
    return request


def offered(request: dict[str, Any]) -> set[str]:
    return {spec["function"]["name"] for spec in request.get("tools", [])}


def footer_of(slack: Any, channel: str, thread_ts: str) -> tuple[dict[str, Any], str]:
    answer = slack.wait_for_message(
        channel,
        lambda m: m.get("thread_ts") == thread_ts and VIEW_RUN in buttons(m.get("blocks", [])),
    )
    return answer, texts([b for b in answer["blocks"] if b["type"] == "context"])


def test_a_mention_in_a_profiles_channel_uses_its_agent_and_elsewhere_the_defaults(
    redis_conn, model_server: FakeOpenAI, tickets_db: Path, tmp_path: Path
) -> None:
    model_server.route("VPN", ["Your VPN ticket is open."])
    model_server.route("lunch", ["Noon."])
    model_server.route("fees", ["Ask finance."])
    with bot_env(redis_conn, model_server.url, tmp_path, policy=POLICY + PROFILES) as env:
        it = app_mention("<@UBOT> is my VPN ticket open?", user=ALICE, channel="C0ITHELP")
        general = app_mention("<@UBOT> when is lunch?", user=ALICE, channel="C0001")
        dm = message_im("what are the course fees?", user=ALICE, channel="D0ALICE")
        for event in (it, general, dm):
            env.event(event)
        env.wait_for_runs(3)
        env.work()

        it_request = request_for(model_server, "is my VPN ticket open?")
        assert it_request["model"] == "gpt-it"
        assert offered(it_request) == {"search_tickets", "create_ticket"}
        assert IT_TEXT in it_request["messages"][0]["content"]
        general_request = request_for(model_server, "when is lunch?")
        assert general_request["model"] == "gpt-fake"
        assert offered(general_request) >= BUILT_IN  # (and any tool other tests registered)
        assert IT_TEXT not in general_request["messages"][0]["content"]
        dm_request = request_for(model_server, "what are the course fees?")
        assert offered(dm_request) == {"knowledge_lookup"}
        assert DM_TEXT in dm_request["messages"][0]["content"]

        answer, footer = footer_of(env.slack, "C0ITHELP", it["ts"])
        assert footer.startswith("profile: it-help · ")
        _, general_footer = footer_of(env.slack, "C0001", general["ts"])
        assert "profile" not in general_footer

        run_id = buttons(answer["blocks"])[VIEW_RUN]
        opened = answered(env, "views.open", lambda: env.click(VIEW_RUN, run_id, ALICE))
        assert "*Profile:* it-help · *model:* gpt-it" in texts(opened["view"]["blocks"])
