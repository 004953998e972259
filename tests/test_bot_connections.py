"""Per-user connections in Slack: App Home's "Your connections" (Connect, Enter code,
Disconnect) and a run that waited for a connection going on in its thread. Signed requests
to the real Bolt app, FakeSlack as the Web API, the `mcp` SDK's OAuth server as the provider
(tests/support/oauth_server.py), the real loop on RQ's SimpleWorker and a real Redis."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlparse

from bot.render.connections import (
    CODE_BLOCK,
    CODE_INPUT,
    CODE_MODAL,
    CONNECT_LINK,
    CONNECT_START,
    DISCONNECT,
    ENTER_CODE,
)
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.fakes.slack_server import app_mention, view_submission
from tests.support.oauth_server import OAuthMcpServer
from tests.support.slack_bot import ALICE, CHANNEL, BotEnv, buttons, texts
from tests.test_connections import TEAM, connect, sign_in, with_connections
from tests.test_connections_runs import GO_ON, people_tool  # noqa: F401 (a fixture)
from tools import ToolContext, tool
from tools.exceptions import NeedsMoreAccess
from tools.registry import registry
from worker.service import connections

BOB = "UBOB"
HOME = {"id": "VHOME00001", "type": "home", "private_metadata": "{}"}


def home_of(env: BotEnv, user: str, send: Any = None) -> dict[str, Any]:
    """Open (or, with `send`, act in) `user`'s App Home: the Home the bot publishes next."""
    before = len([c for c in env.slack.calls("views.publish") if c["user_id"] == user])
    if send is None:
        env.event({"type": "app_home_opened", "user": user, "tab": "home", "channel": "D0001"})
    else:
        send()

    def published() -> dict[str, Any] | None:
        mine = [c for c in env.slack.calls("views.publish") if c["user_id"] == user]
        return mine[-1]["view"] if len(mine) > before else None

    return env.slack.wait_for(published)


def url_buttons(blocks: list[dict[str, Any]]) -> list[str]:
    return [
        e["url"]
        for b in blocks
        for e in b.get("elements") or []
        if isinstance(e, dict) and "url" in e
    ]


def enter_code(env: BotEnv, user: str, code: str) -> dict[str, Any]:
    values = {CODE_BLOCK: {CODE_INPUT: {"type": "plain_text_input", "value": code}}}
    response = env.post(view_submission(CODE_MODAL, values, user, private_metadata="mcp:people"))
    assert response.status == 200, response
    return response.json()


def test_app_home_offers_connect_and_then_disconnect_and_none_without_connections(
    env: BotEnv, provider_server: OAuthMcpServer
) -> None:
    assert "Your connections" not in texts(home_of(env, ALICE)["blocks"])  # not set up here

    with_connections(env.rt, provider_server)
    home = home_of(env, ALICE)
    assert "Your connections" in texts(home["blocks"]) and "not connected" in texts(home["blocks"])
    shown = buttons(home["blocks"])
    assert shown[CONNECT_START] == "mcp:people" and shown[ENTER_CODE] == "mcp:people"
    assert DISCONNECT not in shown
    assert url_buttons(home["blocks"]) == []  # no flow is started by drawing the Home

    env.click(CONNECT_START, "mcp:people", ALICE, view=HOME)
    updated = env.slack.wait_for_call(
        "views.update", lambda a: CONNECT_LINK in buttons(a["view"]["blocks"])
    )
    [url] = url_buttons(updated["view"]["blocks"])
    assert updated["view"]["callback_id"] == CODE_MODAL  # the link and the code box, one modal
    query = sign_in(url, "alice")
    finished = connections.complete(env.rt, query["state"], query["code"])
    answer = enter_code(env, ALICE, finished.code)
    assert answer["response_action"] == "update" and "connected" in texts(answer["view"])

    home = home_of(env, ALICE)
    assert "connected since" in texts(home["blocks"])
    shown = buttons(home["blocks"])
    assert shown[DISCONNECT] == "mcp:people" and CONNECT_START not in shown


def test_disconnect_in_app_home_drops_only_the_clickers_grant_and_revokes_it(
    env: BotEnv, provider_server: OAuthMcpServer
) -> None:
    with_connections(env.rt, provider_server)
    for user in (ALICE, BOB):
        connections.confirm(env.rt, TEAM, user, connect(env.rt, user).code)
    alices = connections.token_for(env.rt, TEAM, ALICE, "mcp:people")

    for forged in (f"{ALICE}:mcp:people", "mcp:people " + ALICE, "x" * 5000):  # not a provider
        env.click(DISCONNECT, forged, BOB, view=HOME)
    env.settle()
    assert [c.provider for c in connections.listing(env.rt, TEAM, BOB)] == ["mcp:people"]

    revocations = provider_server.people.revocations
    home = home_of(env, BOB, lambda: env.click(DISCONNECT, "mcp:people", BOB, view=HOME))
    assert connections.listing(env.rt, TEAM, BOB) == []  # Bob's own, by Slack's signature
    assert [c.provider for c in connections.listing(env.rt, TEAM, ALICE)] == ["mcp:people"]
    assert provider_server.people.revocations == revocations + 1
    assert alices in provider_server.people.access  # Alice's token still works at People
    assert buttons(home["blocks"])[CONNECT_START] == "mcp:people"

    home = home_of(env, ALICE, lambda: env.click(DISCONNECT, "mcp:people", ALICE, view=HOME))
    assert alices not in provider_server.people.access
    assert provider_server.people.revocations == revocations + 2
    assert buttons(home["blocks"])[CONNECT_START] == "mcp:people"


def test_a_run_that_waited_for_a_connection_goes_on_in_its_thread_once_she_confirms(
    env: BotEnv,
    model_server: FakeOpenAI,
    provider_server: OAuthMcpServer,
    people_tool: str,  # noqa: F811
) -> None:
    with_connections(env.rt, provider_server)
    model_server.route(
        "my People name",
        [Turn(tool_calls=[(people_tool, {})]), "Please connect People first."],
    )
    model_server.route(GO_ON, [Turn(tool_calls=[(people_tool, {})]), "You are alice at People."])
    mention = app_mention("<@UBOT> what is my People name?", user=ALICE, channel=CHANNEL)
    env.event(mention)
    [first] = env.wait_for_runs(1)
    env.work()
    prompt = env.slack.wait_for_call(
        "chat.postEphemeral", lambda a: ENTER_CODE in buttons(a.get("blocks") or [])
    )
    assert prompt["user"] == ALICE and prompt["thread_ts"] == mention["ts"]
    [url] = url_buttons(prompt["blocks"])

    query = sign_in(url, "alice")
    finished = connections.complete(env.rt, query["state"], query["code"])
    answer = enter_code(env, ALICE, finished.code)
    assert "going on with what you asked" in texts(answer["view"])
    env.settle()
    going_on = next(r for r in env.runs() if r.id != first.id)
    assert going_on.parent_id == first.id
    assert going_on.origin["thread_ts"] == mention["ts"]
    env.work()
    env.slack.wait_for_message(
        CHANNEL, lambda msg: "You are alice at People." in msg.get("text", "")
    )
    said = [
        m
        for m in env.slack.thread(CHANNEL, mention["ts"])
        if "alice at People" in m.get("text", "")
    ]
    assert said  # the answer is in the thread she asked in
    # a reply in the thread now continues the continuation (the bot's thread memory)
    assert env.rt.redis.get(env.rt.store.keys.slack_thread(CHANNEL, mention["ts"])) == (
        going_on.id.encode()
    )


def test_a_tool_short_of_access_asks_her_in_the_thread_to_connect_again_for_more(
    env: BotEnv, model_server: FakeOpenAI, provider_server: OAuthMcpServer
) -> None:
    with_connections(env.rt, provider_server)
    connections.confirm(env.rt, TEAM, ALICE, connect(env.rt, ALICE).code)

    @tool(effect="read", connection="mcp:people", name="people_payroll")
    def people_payroll(ctx: ToolContext) -> str:
        """Read the person's payroll."""
        ctx.access_token()  # she is connected, but the service wants more (and a bad token)
        raise NeedsMoreAccess("mcp:people", "People", 'payroll "quoted"')

    try:
        model_server.route(
            "my payroll", [Turn(tool_calls=[("people_payroll", {})]), "Connect again."]
        )
        mention = app_mention("<@UBOT> what is my payroll?", user=ALICE, channel=CHANNEL)
        env.event(mention)
        env.wait_for_runs(1)
        env.work()
        prompt = env.slack.wait_for_call(
            "chat.postEphemeral", lambda a: ENTER_CODE in buttons(a.get("blocks") or [])
        )
    finally:
        registry.unregister("people_payroll")
    assert prompt["user"] == ALICE and prompt["thread_ts"] == mention["ts"]
    assert "needs more access than the connection gives (`payroll`)" in prompt["text"]
    [url] = url_buttons(prompt["blocks"])
    assert parse_qs(urlparse(url).query)["scope"] == ["payroll"]
    assert [c.provider for c in connections.listing(env.rt, TEAM, ALICE)] == ["mcp:people"]
