"""Per-user connections against a real OAuth 2.1 authorization server (the `mcp` SDK's server
auth, tests/support/oauth_server.py): the flow with PKCE and a single-use state, the user
verifier, refresh, revocation, and tokens that never sit in Redis in plain text."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from urllib.parse import parse_qs, urlencode, urlparse

import httpx2
import pytest
import redis
from cryptography.fernet import Fernet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.oauth_server import OAuthMcpServer
from tests.support.runtime import make_runtime
from tools.exceptions import NotConnected, ToolError
from worker.connections import ConnectionStore, Grant, Provider
from worker.connections.tokens import Connections
from worker.runtime import Runtime
from worker.service import connections as service
from worker.service.connections import ConnectRefused

TEAM = "T0001"
PUBLIC = "https://switchboard.example.com"


def people_provider(server: OAuthMcpServer) -> Provider:
    """The MCP server's own OAuth: endpoints and client come from discovery."""
    return Provider(
        name="mcp:people",
        label="People",
        authorize_url="",
        token_url="",
        client_id="",
        discover_from=server.url,
        resource=server.url,
    )


def with_connections(rt: Runtime, server: OAuthMcpServer, keys: list[str] | None = None) -> Runtime:
    """`rt` with per-user connections to the People server (a fresh key unless given)."""
    store = ConnectionStore(
        rt.redis, rt.settings.namespace, keys or [Fernet.generate_key().decode()]
    )
    rt.connections = Connections(store, {"mcp:people": people_provider(server)}, PUBLIC)
    return rt


def connected_runtime(
    conn: redis.Redis, server: OAuthMcpServer, keys: list[str] | None = None
) -> Runtime:
    return with_connections(make_runtime(conn, "http://127.0.0.1:9/v1"), server, keys)


@pytest.fixture
def rt(redis_conn: redis.Redis, provider_server: OAuthMcpServer) -> Runtime:
    return connected_runtime(redis_conn, provider_server)


def sign_in(authorize_url: str, user: str, *, deny: bool = False) -> dict[str, str]:
    """What a browser does: the authorization page redirects to the provider's sign-in;
    signing in as `user` redirects to our callback. Returns the callback's query."""
    with httpx2.Client(follow_redirects=False, timeout=10) as browser:
        login = browser.get(authorize_url)
        assert login.status_code == 302, login.text
        extra = "&deny=1" if deny else f"&user={user}"
        back = browser.get(login.headers["location"] + extra)
        assert back.status_code == 302, back.text
    target = urlparse(back.headers["location"])
    assert f"{target.scheme}://{target.netloc}{target.path}" == PUBLIC + service.CALLBACK_PATH
    return {key: values[0] for key, values in parse_qs(target.query).items()}


def connect(rt: Runtime, user: str, *, signs_in_as: str | None = None) -> service.Finished:
    url = service.connect_url(rt, TEAM, user, "mcp:people")
    query = sign_in(url, signs_in_as or user.removeprefix("U").lower())  # UBOB signs in as bob
    return service.complete(rt, query["state"], query.get("code", ""))


def subject_of(server: OAuthMcpServer, token: str) -> str | None:
    found = server.people.access.get(token)
    return found.subject if found is not None else None


def test_a_person_connects_and_their_token_acts_as_them(
    rt: Runtime, provider_server: OAuthMcpServer
) -> None:
    url = service.connect_url(rt, TEAM, "UALICE", "mcp:people")
    query = parse_qs(urlparse(url).query)
    assert query["code_challenge_method"] == ["S256"] and query["resource"] == [provider_server.url]
    finished = service.complete(rt, **_callback(sign_in(url, "alice")))
    with pytest.raises(NotConnected):  # finished at the provider, not yet confirmed in Slack
        service.token_for(rt, TEAM, "UALICE", "mcp:people")
    connected = service.confirm(rt, TEAM, "UALICE", finished.code)
    assert connected.label == "People"
    assert (
        subject_of(provider_server, service.token_for(rt, TEAM, "UALICE", "mcp:people")) == "alice"
    )
    bob = connect(rt, "UBOB")
    service.confirm(rt, TEAM, "UBOB", bob.code.lower())  # codes are read case-blind
    assert subject_of(provider_server, service.token_for(rt, TEAM, "UBOB", "mcp:people")) == "bob"
    assert [c.provider for c in service.listing(rt, TEAM, "UALICE")] == ["mcp:people"]


def _callback(query: dict[str, str]) -> dict[str, str]:
    return {"state": query["state"], "code": query.get("code", "")}


def test_the_user_verifier_refuses_a_flow_finished_by_someone_else(rt: Runtime) -> None:
    # Alice's link was forwarded to Bob, who signed in at the provider as bob
    finished = connect(rt, "UALICE", signs_in_as="bob")
    with pytest.raises(ConnectRefused, match="started by someone else"):
        service.confirm(rt, TEAM, "UBOB", finished.code)
    with pytest.raises(ConnectRefused, match="not valid"):  # and the held tokens are gone
        service.confirm(rt, TEAM, "UALICE", finished.code)
    assert service.listing(rt, TEAM, "UALICE") == service.listing(rt, TEAM, "UBOB") == []


def test_a_replayed_or_tampered_state_is_refused_and_changes_nothing(rt: Runtime) -> None:
    url = service.connect_url(rt, TEAM, "UALICE", "mcp:people")
    query = sign_in(url, "alice")
    with pytest.raises(ConnectRefused, match=r"already used|not made"):
        service.complete(rt, query["state"] + "x", query["code"])
    service.complete(rt, query["state"], query["code"])
    with pytest.raises(ConnectRefused, match="already used"):
        service.complete(rt, query["state"], query["code"])
    assert service.listing(rt, TEAM, "UALICE") == []


def test_a_provider_error_and_a_token_endpoint_that_is_down_change_no_grant(
    redis_conn: redis.Redis, provider_server: OAuthMcpServer
) -> None:
    rt = connected_runtime(redis_conn, provider_server)
    connected = connect(rt, "UALICE")
    service.confirm(rt, TEAM, "UALICE", connected.code)
    before = service.token_for(rt, TEAM, "UALICE", "mcp:people")
    denied = sign_in(service.connect_url(rt, TEAM, "UALICE", "mcp:people"), "", deny=True)
    with pytest.raises(ConnectRefused, match="the person said no"):
        service.complete(
            rt, denied["state"], error=denied["error"], description=denied["error_description"]
        )
    assert rt.connections is not None
    found = rt.connections.provider("mcp:people")
    with socket_closed() as dead:  # the token endpoint stops answering
        rt.connections._providers["mcp:people"] = found.__class__(
            **{**found.__dict__, "token_url": dead}
        )
        url = service.connect_url(rt, TEAM, "UALICE", "mcp:people")
        with pytest.raises(ConnectRefused, match="could not be reached"):
            service.complete(rt, **_callback(sign_in(url, "mallory")))
    assert service.token_for(rt, TEAM, "UALICE", "mcp:people") == before


class socket_closed:
    """A local URL where nothing listens."""

    def __enter__(self) -> str:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/token"

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_an_expired_access_token_is_refreshed_and_a_revoked_one_asks_to_connect_again(
    rt: Runtime, provider_server: OAuthMcpServer
) -> None:
    service.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
    first = service.token_for(rt, TEAM, "UALICE", "mcp:people")
    provider_server.people.expire_access()
    assert rt.connections is not None
    grant = rt.connections.store.get(TEAM, "UALICE", "mcp:people")
    assert grant is not None  # the provider said the token lives an hour; it ended early
    rt.connections.store.put(
        TEAM, "UALICE", grant.__class__(**{**grant.__dict__, "expires_at": 1.0})
    )
    refreshes = provider_server.people.refreshes
    second = service.token_for(rt, TEAM, "UALICE", "mcp:people")
    assert second != first and provider_server.people.refreshes == refreshes + 1
    assert subject_of(provider_server, second) == "alice"
    provider_server.people.revoke_everything("alice")
    grant = rt.connections.store.get(TEAM, "UALICE", "mcp:people")
    assert grant is not None
    rt.connections.store.put(
        TEAM, "UALICE", grant.__class__(**{**grant.__dict__, "expires_at": 1.0})
    )
    with pytest.raises(NotConnected, match="revoked or expired"):
        service.token_for(rt, TEAM, "UALICE", "mcp:people")
    assert service.listing(rt, TEAM, "UALICE") == []


def expire(rt: Runtime, user: str) -> None:
    """As far as Switchboard knows, `user`'s access token has expired: the next use refreshes."""
    assert rt.connections is not None
    grant = rt.connections.store.get(TEAM, user, "mcp:people")
    assert grant is not None
    rt.connections.store.put(TEAM, user, replace(grant, expires_at=1.0))


def test_a_console_connect_on_its_own_port_leaves_everyone_elses_connection_working(
    redis_conn: redis.Redis, provider_server: OAuthMcpServer
) -> None:
    """An MCP server's own OAuth registers Switchboard as a client per redirect URI. The
    console connects through a loopback port of its own (switchboard/local_callback.py): its
    client must not replace the one Slack's connections were made with, or every one of them
    fails at its next refresh (the provider refuses a refresh token from another client)."""
    keys = [Fernet.generate_key().decode()]
    bot = connected_runtime(redis_conn, provider_server, keys)
    service.confirm(bot, TEAM, "UALICE", connect(bot, "UALICE").code)
    registrations = len(provider_server.people.clients)

    console = connected_runtime(redis_conn, provider_server, keys)  # another process
    loopback = "http://127.0.0.1:53682/oauth/callback"
    url = service.connect_url(console, TEAM, "ULOCAL", "mcp:people", callback=loopback)
    with httpx2.Client(follow_redirects=False, timeout=10) as browser:
        login = browser.get(url)
        back = browser.get(login.headers["location"] + "&user=local")
    query = parse_qs(urlparse(back.headers["location"]).query)
    finished = service.complete(console, query["state"][0], query["code"][0])
    service.confirm(console, TEAM, "ULOCAL", finished.code)
    assert len(provider_server.people.clients) == registrations + 1  # the console's own

    # a worker started after that refreshes Alice's connection with the client it came from
    worker = connected_runtime(redis_conn, provider_server, keys)
    expire(worker, "UALICE")
    assert subject_of(provider_server, service.token_for(worker, TEAM, "UALICE", "mcp:people")) == (
        "alice"
    )
    expire(worker, "ULOCAL")  # and the console's with the console's
    assert subject_of(provider_server, service.token_for(worker, TEAM, "ULOCAL", "mcp:people")) == (
        "local"
    )
    # and a new Slack connection still uses the first registration
    service.confirm(worker, TEAM, "UBOB", connect(worker, "UBOB").code)
    assert len(provider_server.people.clients) == registrations + 1
    # Disconnect revokes the console's grant with the console's client
    assert worker.connections is not None
    store = worker.connections.store
    local = store.get(TEAM, "ULOCAL", "mcp:people")
    assert local is not None and local.refresh_token in provider_server.people.refresh
    assert service.revoke(worker, TEAM, "ULOCAL", "mcp:people")
    assert local.refresh_token not in provider_server.people.refresh
    # connecting from the console, then from Slack: the Slack grant is the public client's
    finished = service.complete(console, **_callback(sign_in_at(console, "ULOCAL", loopback)))
    service.confirm(console, TEAM, "ULOCAL", finished.code)
    service.confirm(worker, TEAM, "ULOCAL", connect(worker, "ULOCAL", signs_in_as="local").code)
    expire(worker, "ULOCAL")
    assert subject_of(provider_server, service.token_for(worker, TEAM, "ULOCAL", "mcp:people")) == (
        "local"
    )
    # an issuer key left for another grant (the previous release replaced it without
    # knowing of the key) names nothing: Alice's grant is still refreshed as hers
    worker.redis.set(store.keys.connection_issuer(TEAM, "UALICE", "mcp:people"), f"1.0|{loopback}")
    expire(worker, "UALICE")
    assert subject_of(provider_server, service.token_for(worker, TEAM, "UALICE", "mcp:people")) == (
        "alice"
    )


def test_a_process_without_a_public_url_says_so_when_it_cannot_refresh_a_slack_connection(
    redis_conn: redis.Redis, provider_server: OAuthMcpServer
) -> None:
    keys = [Fernet.generate_key().decode()]
    bot = connected_runtime(redis_conn, provider_server, keys)
    service.confirm(bot, TEAM, "UALICE", connect(bot, "UALICE").code)
    console = connected_runtime(redis_conn, provider_server, keys)
    assert console.connections is not None
    console.connections.public_url = ""  # `switchboard chat` where it is not set
    expire(console, "UALICE")
    with pytest.raises(ToolError, match="SWITCHBOARD_PUBLIC_URL is not set where this runs"):
        service.token_for(console, TEAM, "UALICE", "mcp:people")
    assert [c.provider for c in service.listing(bot, TEAM, "UALICE")] == ["mcp:people"]


def sign_in_at(rt: Runtime, user: str, callback: str) -> dict[str, str]:
    """A connect through `callback` (the console's), signed in as the user's name."""
    url = service.connect_url(rt, TEAM, user, "mcp:people", callback=callback)
    with httpx2.Client(follow_redirects=False, timeout=10) as browser:
        login = browser.get(url)
        back = browser.get(login.headers["location"] + f"&user={user.removeprefix('U').lower()}")
    return {k: v[0] for k, v in parse_qs(urlparse(back.headers["location"]).query).items()}


def test_a_connect_asks_for_configured_then_wanted_then_held_scopes_within_the_url_bound(
    rt: Runtime,
) -> None:
    assert rt.connections is not None
    store = rt.connections.store
    store.put(TEAM, "UALICE", Grant("mcp:people", "at", scope="held:a,held:b"))  # GitHub-style
    store.want(TEAM, "UALICE", "mcp:people", ["old"])
    store.want(TEAM, "UALICE", "mcp:people", ["new", "old"])
    assert store.wanted(TEAM, "UALICE", "mcp:people") == ("new", "old")  # the newest first
    asked = service.scopes_to_ask(rt.connections, ["conf"], TEAM, "UALICE", "mcp:people")
    assert asked == ("conf", "new", "old", "held:a", "held:b")
    # scopes of URL-heavy characters: the bound is the URL's, encoded
    heavy = [f"https://api.example/{i}/:all" for i in range(60)]
    store.want(TEAM, "UBOB", "mcp:people", heavy)
    asked = service.scopes_to_ask(rt.connections, [], TEAM, "UBOB", "mcp:people")
    assert 0 < len(asked) < len(heavy)
    encoded = len(urlencode({"scope": " ".join(asked)})) - len("scope=")
    assert encoded <= service.MAX_ASKED_CHARS


def test_a_grant_given_no_scope_has_what_its_own_connect_asked_for(
    redis_conn: redis.Redis,
) -> None:
    """Not what a Connect started later would ask: a service that wants more meanwhile does
    not make the grant claim it."""
    server = OAuthMcpServer(scopes={"first": "first", "later": "later"})
    server.people.names_scope = False
    try:
        rt = connected_runtime(redis_conn, server)
        assert rt.connections is not None
        people = replace(people_provider(server), scopes=("people",))  # as configured
        rt.connections = Connections(rt.connections.store, {"mcp:people": people}, PUBLIC)
        rt.connections.store.want(TEAM, "UALICE", "mcp:people", ["first"])
        url = service.connect_url(rt, TEAM, "UALICE", "mcp:people")
        rt.connections.store.want(TEAM, "UALICE", "mcp:people", ["later"])
        query = sign_in(url, "alice")
        service.confirm(rt, TEAM, "UALICE", service.complete(rt, **_callback(query)).code)
        [held] = service.listing(rt, TEAM, "UALICE")
        assert held.scope == "people first"
    finally:
        server.stop()


# What the previous release reads with `Grant(**value)`, `Flow(**value)` and
# `Pending(**value)`, each refusing any other field: they share Redis with this one during a
# rolling upgrade, and after a rollback.
PREVIOUS_GRANT = {"provider", "access_token", "refresh_token", "expires_at", "scope"}
PREVIOUS_GRANT |= {"connected_at"}
PREVIOUS_FLOW = {"team", "user", "provider", "verifier", "redirect_uri", "expires_at"}
PREVIOUS_PENDING = {"team", "user", "provider", "grant", "expires_at"}


def sealed(rt: Runtime, pattern: str) -> list[dict[str, object]]:
    assert rt.connections is not None
    store = rt.connections.store
    found = []
    for key in rt.redis.scan_iter(match=store.keys.ns + pattern):
        if not key.endswith((b":issuer", b":refreshing", b":scopes")):
            value = store._open(rt.redis.get(key))
            assert value is not None, key
            found.append(value)
    return found


def test_what_is_stored_is_what_the_previous_release_reads_and_more_is_read_past(
    redis_conn: redis.Redis, provider_server: OAuthMcpServer
) -> None:
    keys = [Fernet.generate_key().decode()]
    rt = connected_runtime(redis_conn, provider_server, keys)
    service.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)  # a grant
    connect(rt, "UBOB")  # held, not confirmed
    service.connect_url(rt, TEAM, "UCAROL", "mcp:people")  # started only
    service.connect_url(rt, TEAM, "ULOCAL", "mcp:people", callback="http://127.0.0.1:1/cb")
    assert rt.connections is not None
    rt.connections.store.want(TEAM, "UALICE", "mcp:people", ["more"])
    grants, flows, held = (sealed(rt, p) for p in ("conn:*", "oauth:flow:*", "oauth:pending:*"))
    assert len(grants) == 1 and len(flows) == 2 and len(held) == 1
    assert all(set(g) == PREVIOUS_GRANT for g in grants)
    assert all(set(f) == PREVIOUS_FLOW for f in flows)
    assert all(set(p) == PREVIOUS_PENDING for p in held)
    assert all(isinstance(p["grant"], dict) and set(p["grant"]) == PREVIOUS_GRANT for p in held)
    # a later release's value, with a field this one does not know, is read all the same
    store = rt.connections.store
    grant = store.get(TEAM, "UALICE", "mcp:people")
    assert grant is not None
    later = {**dataclasses.asdict(grant), "added_later": 1}
    rt.redis.set(store.keys.connection(TEAM, "UALICE", "mcp:people"), store._seal(later))
    assert store.get(TEAM, "UALICE", "mcp:people") == grant


def test_rekey_leaves_a_grant_being_refreshed_and_two_registrations_at_once_keep_the_first(
    redis_conn: redis.Redis, provider_server: OAuthMcpServer
) -> None:
    rt = connected_runtime(redis_conn, provider_server)
    service.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
    assert rt.connections is not None
    store = rt.connections.store
    with store.refresh_lock(TEAM, "UALICE", "mcp:people", 5):  # a refresh in progress
        done = store.rekey(wait=0.1)
    assert (done.grants, done.unreadable_grants, done.busy) == (0, 0, 1)  # its lock: not a grant
    assert store.rekey(wait=0.1).grants == 1
    # two processes register for one redirect URI at once: the one stored first stands
    raw, _ = store.client("mcp:test", "")
    assert raw is None
    first, second = {"client_id": "first"}, {"client_id": "second"}
    assert store.put_client("mcp:test", "", first, raw) == first
    assert store.put_client("mcp:test", "", second, raw) == first
    assert store.client("mcp:test", "")[1] == first


def test_disconnect_revokes_at_the_provider_and_uninstall_drops_every_grant(
    rt: Runtime, provider_server: OAuthMcpServer
) -> None:
    for user in ("UALICE", "UBOB"):
        service.confirm(rt, TEAM, user, connect(rt, user).code)
    token = service.token_for(rt, TEAM, "UALICE", "mcp:people")
    revocations = provider_server.people.revocations
    assert service.revoke(rt, TEAM, "UALICE", "mcp:people")
    assert (
        provider_server.people.revocations > revocations
        and token not in provider_server.people.access
    )
    with pytest.raises(NotConnected):
        service.token_for(rt, TEAM, "UALICE", "mcp:people")
    assert service.drop_workspace(rt, TEAM) == 1
    assert service.listing(rt, TEAM, "UBOB") == []


def test_tokens_are_never_in_redis_in_plain_text_and_keys_rotate(
    redis_conn: redis.Redis, provider_server: OAuthMcpServer
) -> None:
    old = Fernet.generate_key().decode()
    rt = connected_runtime(redis_conn, provider_server, [old])
    service.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
    held = connect(rt, "UBOB")  # finished, not confirmed: its tokens are held too
    pending = service.connect_url(rt, TEAM, "UCAROL", "mcp:people")  # started only
    dump = redis_dump(redis_conn)
    secrets_seen = [
        *provider_server.people.issued,
        held.code,
        parse_qs(urlparse(pending).query)["state"][0],
    ]
    assert secrets_seen and not [s for s in secrets_seen if s.encode() in dump]
    # rotation: a new key first encrypts; the old one still decrypts until rekey rewrote all
    new = Fernet.generate_key().decode()
    rotated = connected_runtime(redis_conn, provider_server, [new, old])
    token = service.token_for(rotated, TEAM, "UALICE", "mcp:people")
    assert rotated.connections is not None
    done = rotated.connections.store.rekey()
    assert (done.grants, done.clients, done.unreadable_grants, done.busy) == (1, 1, 0, 0)
    only_new = connected_runtime(redis_conn, provider_server, [new])
    assert service.token_for(only_new, TEAM, "UALICE", "mcp:people") == token
    # the client the server registered us as was rewritten too: her grant still refreshes
    # with it, and nobody registers again
    registrations = len(provider_server.people.clients)
    expire(only_new, "UALICE")
    assert service.token_for(only_new, TEAM, "UALICE", "mcp:people") != token
    assert len(provider_server.people.clients) == registrations


def redis_dump(conn: redis.Redis) -> bytes:
    """Every key and every value in Redis, as bytes."""
    out = []
    for key in conn.scan_iter(count=1000):
        out.append(key)
        kind = conn.type(key)
        if kind == b"string":
            out.append(conn.get(key) or b"")
        elif kind == b"hash":
            out.extend(b for pair in conn.hgetall(key).items() for b in pair)
        elif kind == b"list":
            out.extend(conn.lrange(key, 0, -1))
        elif kind == b"set":
            out.extend(conn.smembers(key))
        elif kind == b"zset":
            out.extend(conn.zrange(key, 0, -1))
        elif kind == b"stream":
            out.extend(repr(conn.xrange(key)).encode())
    return b"\n".join(v if isinstance(v, bytes) else str(v).encode() for v in out)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(state=st.text(max_size=2100), code=st.text(max_size=2100), finishing=st.text(max_size=200))
def test_whatever_reaches_the_callback_or_the_code_box_is_refused_without_a_grant(
    rt: Runtime, state: str, code: str, finishing: str
) -> None:
    with pytest.raises(ConnectRefused):
        service.complete(rt, state, code)
    with pytest.raises(ConnectRefused):
        service.confirm(rt, TEAM, "UFUZZ" + str(len(finishing) % 3), finishing)
    assert service.listing(rt, TEAM, "UFUZZ0") == []


def test_an_unknown_provider_and_missing_keys_say_what_to_do(rt: Runtime) -> None:
    with pytest.raises(ConnectRefused, match="no provider named"):
        service.connect_url(rt, TEAM, "UALICE", "nope")
    from worker.connections.store import KeysMissing, fernet_of

    with pytest.raises(KeysMissing, match="SWITCHBOARD_CONNECTION_KEYS"):
        fernet_of([""])
    with pytest.raises(KeysMissing, match="key 1 is not a Fernet key"):
        fernet_of(["short"])
    assert isinstance(NotConnected("x"), ToolError)


def test_the_callback_page_shows_the_code_once_and_explains_a_refusal(rt: Runtime) -> None:
    from urllib.parse import urlencode

    from bot.transport.oauth_callback import callback_page

    query = sign_in(service.connect_url(rt, TEAM, "UALICE", "mcp:people"), "alice")
    status, page = callback_page(rt, urlencode(query))
    assert status == 200 and "Enter code" in page
    code = page.split("<code>")[1].split("</code>")[0]
    status, again = callback_page(rt, urlencode(query))  # the browser's back button, a replay
    assert status == 400 and "already used" in again and code not in again
    status, forged = callback_page(rt, "state=%3Cscript%3E&code=x")
    assert status == 400 and "<script>" not in forged
    assert service.confirm(rt, TEAM, "UALICE", code).provider == "mcp:people"


def test_the_providers_file_reads_a_github_style_app_and_names_every_problem() -> None:
    from worker.connections.providers import ProvidersError, read_providers

    text = """
providers:
  github:
    label: GitHub
    authorize_url: https://github.com/login/oauth/authorize
    token_url: https://github.com/login/oauth/access_token
    client_id: ${GITHUB_CLIENT_ID}
    client_secret: ${GITHUB_CLIENT_SECRET}
    scopes: [repo]
"""
    env = {"GITHUB_CLIENT_ID": "Iv1.abc", "GITHUB_CLIENT_SECRET": "s3cret"}
    github = read_providers(text, "providers.yaml", env)["github"]
    assert (github.client_id, github.scopes, github.label) == ("Iv1.abc", ("repo",), "GitHub")
    assert "s3cret" not in repr(github)
    with pytest.raises(ProvidersError) as raised:
        read_providers(text.replace("scopes: [repo]", "scopes: repo\n    colour: red"), "p", {})
    message = str(raised.value)
    assert "GITHUB_CLIENT_ID" in message and "scopes must be a list" in message
    assert "colour is not a provider key" in message


def test_a_per_user_write_card_says_it_acts_as_the_requester() -> None:
    from bot.render.blocks import approval_card
    from tests.test_bot_render import request

    pending = request({"body": "hi"})
    card = approval_card(
        pending, description="Comment.", approvers="anyone", high_risk=False, acts_as="GitHub"
    )
    assert "Acts as <@UALICE>'s GitHub account" in repr(card.blocks)
    plain = approval_card(pending, description="Comment.", approvers="anyone", high_risk=False)
    assert "Acts as" not in repr(plain.blocks)


def test_the_cli_lists_and_revokes_a_connection_without_showing_a_token(
    cli_env: None,
    redis_conn: redis.Redis,
    provider_server: OAuthMcpServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from switchboard.cli import main

    key = Fernet.generate_key().decode()
    rt = connected_runtime(redis_conn, provider_server, [key])
    service.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
    monkeypatch.setenv("SWITCHBOARD_CONNECTION_KEYS", key)
    assert main(["connections", "list", "UALICE", "--team", TEAM]) == 0
    listed = capsys.readouterr().out
    assert "mcp:people" in listed
    assert not [t for t in provider_server.people.issued if t in listed]
    assert main(["connections", "revoke", "UALICE", "mcp:people", "--team", TEAM]) == 0
    assert service.listing(rt, TEAM, "UALICE") == []


def test_the_cli_rekeys_every_connection_and_says_when_a_removed_key_leaves_some_unread(
    cli_env: None,
    redis_conn: redis.Redis,
    provider_server: OAuthMcpServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from switchboard.cli import main

    old, new, lost = (Fernet.generate_key().decode() for _ in range(3))
    rt = connected_runtime(redis_conn, provider_server, [old])
    service.confirm(rt, TEAM, "UALICE", connect(rt, "UALICE").code)
    monkeypatch.setenv("SWITCHBOARD_CONNECTION_KEYS", f"{new},{old}")
    assert main(["connections", "rekey"]) == 0
    said = capsys.readouterr().out
    assert "rewrote 1 connection(s) and 1 registered client(s)" in said
    assert "the other keys may be removed once connects started before now have finished" in said
    only_new = connected_runtime(redis_conn, provider_server, [new])
    assert [c.provider for c in service.listing(only_new, TEAM, "UALICE")] == ["mcp:people"]
    # a grant sealed with a key that was removed before rekey ran: said, and exit 1
    elsewhere = connected_runtime(redis_conn, provider_server, [lost])
    service.confirm(elsewhere, TEAM, "UBOB", connect(elsewhere, "UBOB").code)
    monkeypatch.setenv("SWITCHBOARD_CONNECTION_KEYS", new)
    assert main(["connections", "rekey"]) == 1
    assert "open with none of the configured keys" in capsys.readouterr().out
