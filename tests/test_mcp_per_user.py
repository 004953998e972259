"""A remote MCP server that requires OAuth, declared `auth: per_user` in SWITCHBOARD_MCP: its
tools are listed at start-up with the operator's listing token, and every call carries the
asking person's own token. Everything is real: the runtime every process builds
(`build_runtime`), the real loop on an RQ SimpleWorker, the fake model over HTTP, and the
`mcp` SDK's OAuth 2.1 server in front of an MCP server that records whom each call acted
as (tests/support/oauth_server.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import redis
import structlog
from cryptography.fernet import Fernet

import tools.mcp
from switchboard.settings import Config
from switchboard.wiring import build_runtime
from tests.fakes.openai_server import FakeOpenAI, Turn
from tests.support.mcp_servers import write_config
from tests.support.oauth_server import OAuthMcpServer
from tests.support.runtime import ALICE, approve_first, tool_messages, work
from tests.test_connections import PUBLIC, TEAM, connect, redis_dump, sign_in
from tests.test_connections import _callback as callback
from tests.test_connections_runs import BOB, Offers
from tools.exceptions import McpConfigError
from worker import service
from worker.run import Requester, RunStatus
from worker.runtime import Runtime
from worker.service import connections
from worker.service.resuming import GO_ON

Build = Callable[..., Runtime]
LIST_VARIABLE = "PEOPLE_LIST_TOKEN"
# Bob approves the people_note writes Alice asks for (and may not approve his own)
POLICY = """\
roles:
  support: [UBOB]
tools:
  people_note:
    allow: [everyone]
    approvers: [support]
    self_approval: false
defaults:
  read: {allow: [everyone]}
  write: {allow: [everyone]}
"""
SUPPORT_BOB = Requester(user_id="UBOB", team_id=TEAM, channel_id="C0001", roles=["support"])


@pytest.fixture
def listing_token(provider_server: OAuthMcpServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The operator's token, for listing the tools only (`headers:` of the server entry)."""
    token = provider_server.people.mint("operator")
    monkeypatch.setenv(LIST_VARIABLE, token)
    return token


@pytest.fixture
def people_file(tmp_path: Path, provider_server: OAuthMcpServer, listing_token: str) -> Path:
    return write_config(
        tmp_path / "mcp.yaml",
        {
            "people": {
                "url": provider_server.url,
                "auth": "per_user",
                "label": "People",
                "headers": {"Authorization": "Bearer ${" + LIST_VARIABLE + "}"},
            }
        },
    )


@pytest.fixture
def build(redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path) -> Iterator[Build]:
    """The runtime every process builds from its configuration: SWITCHBOARD_MCP, and
    per-user connections (a fresh key) unless `keys=""`."""
    files: list[Path] = []

    def build_from(mcp_file: Path, *, keys: str | None = None, policy: str = "") -> Runtime:
        policy_file = ""
        if policy:
            (tmp_path / "policy.yaml").write_text(policy)
            policy_file = str(tmp_path / "policy.yaml")
        config = Config(
            SWITCHBOARD_MCP=str(mcp_file),
            SWITCHBOARD_CONNECTION_KEYS=Fernet.generate_key().decode() if keys is None else keys,
            SWITCHBOARD_PUBLIC_URL=PUBLIC,
            OPENAI_BASE_URL=model_server.url,
            OPENAI_API_KEY="test",
            SWITCHBOARD_MODEL="gpt-fake",
            SWITCHBOARD_POLICY=policy_file,
        )
        runtime = build_runtime(config, redis_conn, surfaces={"test": Offers()})  # type: ignore[dict-item]
        files.append(mcp_file)
        return runtime

    yield build_from
    for path in files:
        tools.mcp.unload(tools.mcp.load(path))  # their tools leave the registry


def own_server_config(tmp_path: Path, server: OAuthMcpServer, **entry: object) -> Path:
    """SWITCHBOARD_MCP naming `server` (a test's own) as `people`, per user, listed with an
    operator's token of its own; `entry`: more of the server's entry."""
    listing = server.people.mint("operator")
    people: dict[str, object] = {"url": server.url, "auth": "per_user", "label": "People"}
    people |= {"headers": {"Authorization": f"Bearer {listing}"}, **entry}
    return write_config(tmp_path / "mcp.yaml", {"people": people})


def ask(rt: Runtime, question: str, who: Requester = ALICE) -> str:
    run = service.submit(rt, question, who, origin={"surface": "test"})
    work(rt)
    return run.id


def offers(rt: Runtime) -> list[tuple[str, str, str]]:
    surface = rt.surfaces["test"]
    assert isinstance(surface, Offers)
    return surface.offered


def test_each_call_acts_as_the_person_asking_never_with_the_listing_token(
    build: Build,
    people_file: Path,
    model_server: FakeOpenAI,
    provider_server: OAuthMcpServer,
    listing_token: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # the SDK's and httpx's own logging too
    acted = provider_server.people.acted  # the module's server: other tests' calls are in it
    before = len(acted)
    model_server.route("who am I at People", [Turn(tool_calls=[("people_whoami", {})]), "Done."])
    with structlog.testing.capture_logs() as logged:
        rt = build(people_file)
        tool = rt.registry.get("people_whoami")
        assert tool is not None and tool.connection == "mcp:people" and tool.effect == "read"
        assert acted[before:] == []  # listed with the operator's token, nothing called

        first = ask(rt, "who am I at People?")
        assert rt.store.load(first).status == RunStatus.COMPLETED
        told = tool_messages(model_server.last_chat_request)[-1]
        assert "has not connected their People account" in told
        assert offers(rt) == [("UALICE", "mcp:people", "People")]
        assert "connection_needed" in [e.kind for e in rt.events.read(first)]
        assert acted[before:] == []  # no token of hers: nothing was sent

        connections.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
        again = ask(rt, "who am I at People? (again)")
        assert rt.store.load(again).status == RunStatus.COMPLETED
        assert tool_messages(model_server.last_chat_request)[-1] == "acting as alice"

        connections.confirm(rt, TEAM, "UBOB", connect(rt, "UBOB").code)
        bobs = ask(rt, "who am I at People? (bob)", BOB)
        assert tool_messages(model_server.last_chat_request)[-1] == "acting as bob"
    # the server's own record: each call acted as its requester, never as the operator
    assert acted[before:] == ["alice", "bob"]
    tokens = [listing_token, *provider_server.people.issued]
    recorded = repr([e.data for run in (first, again, bobs) for e in rt.events.read(run)])
    assert not [t for t in tokens if t in recorded]
    assert not [t for t in tokens if t in repr(logged) or t in caplog.text]
    dump = redis_dump(rt.redis)
    assert not [t for t in tokens if t.encode() in dump]


def test_a_token_the_server_refuses_is_refreshed_once_and_a_revoked_one_asks_to_connect_again(
    build: Build, people_file: Path, model_server: FakeOpenAI, provider_server: OAuthMcpServer
) -> None:
    model_server.route("who am I at People", [Turn(tool_calls=[("people_whoami", {})]), "Done."])
    rt = build(people_file)
    before = len(provider_server.people.acted)
    connections.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
    # the server ends her access token early: as far as Switchboard knew, it had an hour
    provider_server.people.expire_access()
    refreshes = provider_server.people.refreshes
    ask(rt, "who am I at People?")
    assert tool_messages(model_server.last_chat_request)[-1] == "acting as alice"
    assert provider_server.people.refreshes == refreshes + 1
    # she revoked the app at the provider: the 401 cannot be refreshed away
    provider_server.people.revoke_everything("alice")
    run = ask(rt, "who am I at People? (revoked)")
    told = tool_messages(model_server.last_chat_request)[-1]
    assert "has not connected their People account" in told and "no longer accepts" not in told
    assert "revoked or expired" in told
    assert offers(rt) == [("UALICE", "mcp:people", "People")]
    assert connections.listing(rt, TEAM, "UALICE") == []  # the dead grant is dropped
    assert rt.store.load(run).status == RunStatus.COMPLETED
    assert provider_server.people.acted[before:] == ["alice"]


def test_a_per_user_write_approved_by_someone_else_acts_as_the_requester(
    build: Build, people_file: Path, model_server: FakeOpenAI, provider_server: OAuthMcpServer
) -> None:
    model_server.route(
        "note it", [Turn(tool_calls=[("people_note", {"text": "Q3 plan"})]), "Noted."]
    )
    rt = build(people_file, policy=POLICY)
    assert rt.registry.get("people_note").connection == "mcp:people"  # type: ignore[union-attr]
    for user in ("UALICE", "UBOB"):
        connections.confirm(rt, TEAM, user, connect(rt, user).code)
    before = len(provider_server.people.acted)
    run = ask(rt, "note it: Q3 plan")
    assert rt.store.load(run).status == RunStatus.AWAITING_APPROVAL
    approve_first(rt, run, SUPPORT_BOB)
    work(rt)
    assert rt.store.load(run).status == RunStatus.COMPLETED
    assert tool_messages(model_server.last_chat_request)[-1] == "noted 'Q3 plan' as alice"
    assert provider_server.people.acted[before:] == ["alice"]


def test_a_per_user_server_without_connections_stops_the_start_naming_it(
    build: Build, tmp_path: Path
) -> None:
    # nothing listens there: the start stops on the configuration, before connecting
    path = write_config(
        tmp_path / "dead.yaml",
        {"git": {"command": "true"}, "docs": {"url": "http://127.0.0.1:9/mcp", "auth": "per_user"}},
    )
    with pytest.raises(McpConfigError) as raised:
        build(path, keys="")
    message = str(raised.value)
    assert message.startswith(f"{path} line 4: servers.docs.auth is per_user")
    assert "SWITCHBOARD_CONNECTION_KEYS" in message and "git" not in message


def test_switchboard_tools_says_who_a_per_user_tool_acts_as_and_check_names_missing_keys(
    cli_env: None,
    people_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from switchboard.cli import main

    monkeypatch.setenv("SWITCHBOARD_MCP", str(people_file))
    monkeypatch.setenv("SWITCHBOARD_CONNECTION_KEYS", Fernet.generate_key().decode())
    try:
        assert main(["tools"]) == 0
        rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
        assert "acts as the person asking (mcp:people)" in rows["people_whoami"]
        assert "acts as the person asking (mcp:people)" in rows["people_note"]
    finally:
        tools.mcp.unload(tools.mcp.load(people_file))
    monkeypatch.delenv("SWITCHBOARD_CONNECTION_KEYS")
    assert main(["tools", "check"]) == 1
    out = capsys.readouterr().out
    assert f"{people_file} line 2: servers.people.auth is per_user" in out


def test_a_per_user_server_that_went_down_fails_the_call_as_not_run(
    build: Build, tmp_path: Path, model_server: FakeOpenAI
) -> None:
    server = OAuthMcpServer()  # its own, to stop: the module's serves the other tests
    try:
        rt = build(own_server_config(tmp_path, server, timeout=5))
        connections.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
    finally:
        server.stop()
    model_server.route(
        "who am I while it is down", [Turn(tool_calls=[("people_whoami", {})]), "It is down."]
    )
    run = ask(rt, "who am I while it is down")
    told = tool_messages(model_server.last_chat_request)[-1]
    assert told.startswith("Error: people_whoami was not run: MCP server 'people' is unavailable")
    assert rt.store.load(run).status == RunStatus.COMPLETED
    assert [c.provider for c in connections.listing(rt, TEAM, "UALICE")] == ["mcp:people"]


def test_a_call_short_of_a_scope_keeps_the_connection_and_connecting_again_asks_for_more(
    build: Build, tmp_path: Path, model_server: FakeOpenAI
) -> None:
    """A per-user server's 403 `insufficient_scope` (the MCP authorization spec's step-up):
    nothing runs, the person keeps their connection, and is offered to connect again; that
    Connect asks for what they had and what the server named; once they have, the run goes
    on and the call acts as them."""
    server = OAuthMcpServer(scopes={"payroll": "payroll"})
    try:
        rt = build(own_server_config(tmp_path, server, scopes=["people"]))
        first_url = connections.connect_url(rt, TEAM, "UALICE", "mcp:people")
        assert parse_qs(urlparse(first_url).query)["scope"] == ["people"]
        connections.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
        model_server.route("my payroll", [Turn(tool_calls=[("people_payroll", {})]), "Later."])
        going = GO_ON.format(label="People")
        model_server.route(going, [Turn(tool_calls=[("people_payroll", {})]), "Here it is."])

        run = ask(rt, "what is my payroll?")
        told = tool_messages(model_server.last_chat_request)[-1]
        assert "does not give the access this call needs (payroll)" in told, told
        assert server.people.acted == []  # refused before any tool ran
        surface = rt.surfaces["test"]
        assert isinstance(surface, Offers)
        assert surface.offered == [("UALICE", "mcp:people", "People")]
        assert surface.more_access == [("payroll",)]
        [needed] = [e for e in rt.events.read(run) if e.kind == "connection_needed"]
        assert needed.data["more_access"] == ["payroll"]
        [kept] = connections.listing(rt, TEAM, "UALICE")  # her connection stays as it was
        assert kept.scope == "people"
        assert rt.store.load(run).status == RunStatus.COMPLETED

        # Connect again asks for both; Bob's Connect is not changed by what Alice was asked
        again_url = connections.connect_url(rt, TEAM, "UALICE", "mcp:people")
        assert parse_qs(urlparse(again_url).query)["scope"] == ["people payroll"]
        bobs_url = connections.connect_url(rt, TEAM, "UBOB", "mcp:people")
        assert parse_qs(urlparse(bobs_url).query)["scope"] == ["people"]
        finished = connections.complete(rt, **callback(sign_in(again_url, "alice")))
        done = connections.confirm(rt, TEAM, "UALICE", finished.code)
        [going_on] = done.resumed
        work(rt)
        assert rt.store.load(going_on.id).status == RunStatus.COMPLETED
        assert tool_messages(model_server.last_chat_request)[-1] == "read as alice"
        assert server.people.acted == ["alice"]
        [now] = connections.listing(rt, TEAM, "UALICE")
        assert now.scope == "people payroll"
        # a later Connect (from App Home, say) asks for what her connection gives
        later_url = connections.connect_url(rt, TEAM, "UALICE", "mcp:people")
        assert parse_qs(urlparse(later_url).query)["scope"] == ["people payroll"]
    finally:
        server.stop()


def test_a_second_step_up_keeps_the_first_when_the_provider_names_no_scope_in_its_answer(
    build: Build, tmp_path: Path, model_server: FakeOpenAI
) -> None:
    """RFC 6749 5.1: a token answer may leave `scope` out when it granted what was asked;
    the grant then has what the Connect asked for, so asking for more keeps it."""
    server = OAuthMcpServer(scopes={"payroll": "payroll", "benefits": "benefits"})
    server.people.names_scope = False
    try:
        rt = build(own_server_config(tmp_path, server, scopes=["people"]))
        connections.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
        model_server.route(GO_ON.format(label="People"), ["Done."])  # the continuations
        for tool, asked in (("payroll", "people payroll"), ("benefits", "people benefits payroll")):
            model_server.route(f"my {tool}", [Turn(tool_calls=[(f"people_{tool}", {})]), "Later."])
            ask(rt, f"what is my {tool}?")
            url = connections.connect_url(rt, TEAM, "UALICE", "mcp:people")
            assert parse_qs(urlparse(url).query)["scope"] == [asked]
            finished = connections.complete(rt, **callback(sign_in(url, "alice")))
            connections.confirm(rt, TEAM, "UALICE", finished.code)
            [held] = connections.listing(rt, TEAM, "UALICE")
            assert held.scope == asked
        held_token = server.people.access[connections.token_for(rt, TEAM, "UALICE", "mcp:people")]
        assert sorted(held_token.scopes) == ["benefits", "payroll", "people"]  # at the provider too
    finally:
        server.stop()


def test_a_403_that_names_no_scope_is_a_tool_error_with_no_connect_offer(
    build: Build, tmp_path: Path, model_server: FakeOpenAI
) -> None:
    """Connecting again would ask for what she has: she is not offered it, and the model is
    told why the call was not run."""
    server = OAuthMcpServer(scopes={"payroll": "payroll"}, names_scope=False)
    try:
        rt = build(own_server_config(tmp_path, server, scopes=["people"]))
        connections.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
        model_server.route("my payroll", [Turn(tool_calls=[("people_payroll", {})]), "Sorry."])
        run = ask(rt, "what is my payroll?")
        told = tool_messages(model_server.last_chat_request)[-1]
        assert "for want of access it did not name" in told, told
        assert offers(rt) == []
        assert "connection_needed" not in [e.kind for e in rt.events.read(run)]
        assert server.people.acted == []
        assert [c.provider for c in connections.listing(rt, TEAM, "UALICE")] == ["mcp:people"]
    finally:
        server.stop()
