"""A per-user tool in a real run: the real loop on an RQ SimpleWorker, the fake model over
HTTP, and a tool that calls a real MCP server (behind the `mcp` SDK's OAuth server) with the
asking person's own token."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.support.oauth_server import OAuthMcpServer, whoami
from tests.support.runtime import ALICE, make_runtime, tool_messages, work
from tests.test_connections import TEAM, connect, with_connections
from tools import ToolContext, tool
from tools.registry import registry
from worker import metrics, service
from worker.run import Requester, RunStatus
from worker.runtime import Runtime
from worker.service import connections

GO_ON = "I have connected my People account — please go on."  # what the continuation says
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
        self.more_access: list[tuple[str, ...]] = []  # what each offer asked for besides

    def connect_needed(
        self, run: object, provider: str, label: str, more_access: tuple[str, ...] = ()
    ) -> None:
        self.offered.append((run.requester.user_id, provider, label))  # type: ignore[attr-defined]
        self.more_access.append(more_access)

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
    model_server.route(GO_ON, [Turn(tool_calls=[(people_tool, {})]), "Done."])
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

    done = connections.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
    [again] = done.resumed  # the run goes on by itself, now that she is connected
    work(rt)
    assert rt.store.load(again.id).status == RunStatus.COMPLETED
    assert tool_messages(model_server.last_chat_request)[-1] == "acting as alice"

    connections.confirm(rt, TEAM, "UBOB", connect(rt, "UBOB").code)
    bobs = service.submit(rt, "who am I at People? (bob)", BOB, origin={"surface": "test"})
    work(rt)
    assert rt.store.load(bobs.id).status == RunStatus.COMPLETED
    assert tool_messages(model_server.last_chat_request)[-1] == "acting as bob"
    # nothing a run recorded, and nothing the process exports as metrics, holds a token
    recorded = repr([e.data for run in (first, again, bobs) for e in rt.events.read(run.id)])
    exported = metrics.render(rt)[0].decode()
    assert provider_server.people.issued and "tool" in exported
    assert not [t for t in provider_server.people.issued if t in recorded or t in exported]


def test_once_alice_connects_the_run_that_waited_goes_on_by_itself_as_her_and_only_once(
    redis_conn: redis.Redis,
    model_server: FakeOpenAI,
    provider_server: OAuthMcpServer,
    people_tool: str,
) -> None:
    model_server.route(
        "my People profile",
        [Turn(tool_calls=[(people_tool, {})]), "Connect People first, then I can look."],
    )
    model_server.route(GO_ON, [Turn(tool_calls=[(people_tool, {})]), "You are alice at People."])
    rt = runtime(redis_conn, model_server.url, provider_server, Offers())
    first = service.submit(rt, "show my People profile", ALICE, origin={"surface": "test"})
    work(rt)
    assert rt.store.load(first.id).answer == "Connect People first, then I can look."

    bobs = connections.confirm(rt, TEAM, "UBOB", connect(rt, "UBOB").code)
    assert bobs.resumed == ()  # Bob connecting does not resume Alice's run
    assert [r.id for r in rt.store.recent(limit=10)] == [first.id]

    before = len(model_server.chat_requests)
    done = connections.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
    [going_on] = done.resumed
    assert going_on.parent_id == first.id and going_on.requester == ALICE
    assert going_on.origin == {"surface": "test"} and going_on.question == GO_ON
    work(rt)  # nobody asked again: the continuation was queued by the confirm
    finished = rt.store.load(going_on.id)
    assert finished.status == RunStatus.COMPLETED and finished.answer == "You are alice at People."
    resumed_request = model_server.chat_requests[before]
    assert resumed_request["messages"][-1] == {"role": "user", "content": GO_ON}
    assert "has not connected their People account" in tool_messages(resumed_request)[0]
    assert tool_messages(model_server.last_chat_request)[-1] == "acting as alice"

    again = connections.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
    assert again.resumed == ()  # a second connection does not resume the same run again
    work(rt)
    assert {r.id for r in rt.store.recent(limit=10)} == {first.id, going_on.id}


def test_confirms_at_the_same_moment_resume_the_run_that_waited_once(
    redis_conn: redis.Redis,
    model_server: FakeOpenAI,
    provider_server: OAuthMcpServer,
    people_tool: str,
) -> None:
    model_server.route("People title", [Turn(tool_calls=[(people_tool, {})]), "Connect first."])
    rt = runtime(redis_conn, model_server.url, provider_server, Offers())
    first = service.submit(rt, "my People title?", ALICE, origin={"surface": "test"})
    work(rt)
    codes = [connect(rt, "UALICE").code for _ in range(4)]  # four flows she finished
    start = threading.Barrier(len(codes))

    def confirm(code: str) -> tuple[str, ...]:
        start.wait(10)
        return tuple(r.id for r in connections.confirm(rt, TEAM, "UALICE", code).resumed)

    with ThreadPoolExecutor(len(codes)) as pool:
        resumed = [run for found in pool.map(confirm, codes) for run in found]
    assert len(resumed) == 1
    assert [r.parent_id for r in rt.store.recent(limit=10) if r.id != first.id] == [first.id]


def test_a_run_the_person_already_went_on_from_is_not_resumed(
    redis_conn: redis.Redis,
    model_server: FakeOpenAI,
    provider_server: OAuthMcpServer,
    people_tool: str,
) -> None:
    model_server.route("People team", [Turn(tool_calls=[(people_tool, {})]), "Connect first."])
    model_server.route("never mind", ["All right."])
    rt = runtime(redis_conn, model_server.url, provider_server, Offers())
    first = service.submit(rt, "my People team?", ALICE, origin={"surface": "test"})
    work(rt)
    reply = service.submit(rt, "never mind", ALICE, origin={"surface": "test"}, parent=first)
    work(rt)
    assert rt.store.load(reply.id).answer == "All right."
    # going on from `first` now would fork the conversation she continued
    assert connections.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code).resumed == ()
