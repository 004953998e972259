"""A per-user tool in a real run: the real loop on an RQ SimpleWorker, the fake model over
HTTP, and a tool that calls a real MCP server (behind the `mcp` SDK's OAuth server) with the
asking person's own token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.support.oauth_server import OAuthMcpServer, whoami
from tests.support.runtime import ALICE, make_runtime, tool_messages, work
from tests.test_connections import TEAM, connect, with_connections
from tools import ToolContext, tool
from tools.registry import registry
from worker import service
from worker.run import Requester, RunStatus
from worker.runtime import Runtime
from worker.service import connections

BOB = Requester(user_id="UBOB", team_id=TEAM, channel_id="C0001", roles=["everyone"])


@pytest.fixture
def people_tool(provider_server: OAuthMcpServer) -> Iterator[str]:
    url = provider_server.url

    @tool(effect="read", connection="mcp:people", name="people_whoami")
    def people_whoami(ctx: ToolContext) -> str:
        """Say whom the People service acts for."""
        return whoami(url, ctx.access_token())

    yield "people_whoami"
    registry.unregister("people_whoami")


class Offers:
    """Records the Connect offers a run makes (the Surface protocol; Slack's is tested with
    the bot)."""

    def __init__(self) -> None:
        self.offered: list[tuple[str, str, str]] = []

    def connect_needed(self, run: object, provider: str, label: str) -> None:
        self.offered.append((run.requester.user_id, provider, label))  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:  # every other Surface call: nothing to show
        return lambda *args, **kwargs: None


def runtime(conn: redis.Redis, url: str, server: OAuthMcpServer, offers: Offers) -> Runtime:
    rt = make_runtime(conn, url, surfaces={"test": offers})  # type: ignore[dict-item]
    return with_connections(rt, server)


def test_alice_is_asked_to_connect_then_the_tool_acts_as_her_and_bobs_as_bob(
    redis_conn: redis.Redis,
    model_server: FakeOpenAI,
    provider_server: OAuthMcpServer,
    people_tool: str,
) -> None:
    model_server.route(
        "who am I at People",
        [Turn(tool_calls=[(people_tool, {})]), "Done."],
    )
    offers = Offers()
    rt = runtime(redis_conn, model_server.url, provider_server, offers)
    first = service.submit(rt, "who am I at People?", ALICE, origin={"surface": "test"})
    work(rt)
    assert rt.store.load(first.id).status == RunStatus.COMPLETED
    assert (
        "has not connected their People account"
        in tool_messages(model_server.last_chat_request)[-1]
    )
    assert offers.offered == [("UALICE", "mcp:people", "People")]
    assert "connection_needed" in [e.kind for e in rt.events.read(first.id)]

    connections.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
    again = service.submit(rt, "who am I at People? (again)", ALICE, origin={"surface": "test"})
    work(rt)
    assert rt.store.load(again.id).status == RunStatus.COMPLETED
    assert tool_messages(model_server.last_chat_request)[-1] == "acting as alice"

    connections.confirm(rt, TEAM, "UBOB", connect(rt, "UBOB").code)
    bobs = service.submit(rt, "who am I at People? (bob)", BOB, origin={"surface": "test"})
    work(rt)
    assert rt.store.load(bobs.id).status == RunStatus.COMPLETED
    assert tool_messages(model_server.last_chat_request)[-1] == "acting as bob"
    # nothing a run recorded holds a token
    recorded = repr([e.data for run in (first, again, bobs) for e in rt.events.read(run.id)])
    assert not [t for t in provider_server.people.issued if t in recorded]
