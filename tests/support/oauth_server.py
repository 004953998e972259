"""A real OAuth 2.1 authorization server protecting a real MCP server, in one local process.

Built from the `mcp` SDK's server auth: `MCPServer(auth_server_provider=..., auth=...)`
mounts its routes (metadata, /authorize with PKCE, /token, /register for dynamic
registration, /revoke) and the protected-resource metadata, and its bearer middleware
refuses calls without a valid token. `People` below is the provider those routes call: it
keeps clients, codes and tokens in memory. Its "login page" (`/login`) stands in for the
provider's own sign-in: whoever opens it with `?user=alice` has signed in as alice.

The MCP server's tool `whoami` answers with the subject of the bearer token it was called
with, and records it in `People.acted`: the test sees on whose behalf each call acted (the
server's own record, not what the client says). `People.mint` issues a token with no
sign-in, e.g. the operator's token a per-user server's tools are listed with.

With `scopes` (`OAuthMcpServer(scopes={"payroll": "payroll"})`), the server also has a read
tool of each name that needs that scope: a call whose token lacks it is answered HTTP 403
`insufficient_scope` naming the scope (RFC 6750; the MCP spec's step-up; not naming it with
`names_scope=False`), before the MCP server sees it (`ScopeGate`), and clients are
registered with those scopes and `people`.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import uvicorn
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from mcp.types import ToolAnnotations
from pydantic import AnyHttpUrl
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response


@dataclass
class People:
    """The provider: in-memory clients, codes and tokens; `access_seconds` is how long an
    access token lives (tests shorten it to see a refresh); without `names_scope`, a token
    answer leaves `scope` out (RFC 6749 5.1 allows it when what was asked was granted)."""

    base: str
    access_seconds: int = 3600
    names_scope: bool = True
    clients: dict[str, OAuthClientInformationFull] = field(default_factory=dict)
    waiting: dict[str, tuple[str, AuthorizationParams]] = field(default_factory=dict)
    codes: dict[str, AuthorizationCode] = field(default_factory=dict)
    access: dict[str, AccessToken] = field(default_factory=dict)
    refresh: dict[str, RefreshToken] = field(default_factory=dict)
    pairs: dict[str, str] = field(default_factory=dict)  # refresh -> its access token
    issued: list[str] = field(default_factory=list)  # every token handed out, to grep for
    refreshes: int = 0
    revocations: int = 0
    acted: list[str] = field(default_factory=list)  # the subject of every tool call, in order

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        ticket = secrets.token_urlsafe(16)
        self.waiting[ticket] = (str(client.client_id), params)
        return f"{self.base}/login?{urlencode({'ticket': ticket})}"

    def sign_in(self, ticket: str, user: str) -> str:
        """The person signed in as `user` and agreed: where the browser goes next."""
        client_id, params = self.waiting.pop(ticket)
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [],
            expires_at=time.time() + 300,
            client_id=client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
            subject=user,
        )
        return f"{params.redirect_uri}?{urlencode({'code': code, 'state': params.state or ''})}"

    def deny(self, ticket: str) -> str:
        _, params = self.waiting.pop(ticket)
        query = {"error": "access_denied", "error_description": "the person said no"}
        return f"{params.redirect_uri}?{urlencode({**query, 'state': params.state or ''})}"

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        return self._issue(
            str(client.client_id), authorization_code.scopes, authorization_code.subject
        )

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        self.refreshes += 1
        self._drop(refresh_token.token)
        return self._issue(
            str(client.client_id), scopes or refresh_token.scopes, refresh_token.subject
        )

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def exchange_identity_assertion(self, client: object, params: object) -> OAuthToken:
        raise NotImplementedError  # not this test server's grant

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.revocations += 1
        if isinstance(token, RefreshToken):
            self._drop(token.token)
        else:
            self.access.pop(token.token, None)
            for refresh, access in list(self.pairs.items()):
                if access == token.token:
                    self._drop(refresh)

    def _issue(self, client_id: str, scopes: list[str], subject: str | None) -> OAuthToken:
        access, refresh = "at-" + secrets.token_urlsafe(24), "rt-" + secrets.token_urlsafe(24)
        expires = int(time.time()) + self.access_seconds
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires, subject=subject
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, subject=subject
        )
        self.pairs[refresh] = access
        self.issued += [access, refresh]
        return OAuthToken(
            access_token=access,
            expires_in=self.access_seconds,
            refresh_token=refresh,
            scope=(" ".join(scopes) or None) if self.names_scope else None,
        )

    def _drop(self, refresh: str) -> None:
        self.refresh.pop(refresh, None)
        self.access.pop(self.pairs.pop(refresh, ""), None)

    # -- what tests do to the provider ------------------------------------------------------
    def mint(self, subject: str) -> str:
        """An access token for `subject` with no sign-in (an operator's, say)."""
        return self._issue("operator-client", [], subject).access_token

    def expire_access(self) -> None:
        """Every access token expires now (refresh tokens stay good)."""
        for token in self.access.values():
            token.expires_at = int(time.time()) - 1

    def revoke_everything(self, subject: str) -> None:
        """The person revoked the app at the provider: none of their tokens works."""
        for refresh, token in list(self.refresh.items()):
            if token.subject == subject:
                self._drop(refresh)


class ScopeGate:
    """ASGI, in front of the MCP app: a `tools/call` of a tool in `needs` whose bearer token
    lacks the tool's scope is answered 403 with `WWW-Authenticate: Bearer
    error="insufficient_scope", scope="..."` (without the scope unless `names`); everything
    else passes as it came."""

    def __init__(
        self, app: Any, people: People, needs: dict[str, str], *, names: bool = True
    ) -> None:
        self.app, self.people, self.needs, self.names = app, people, needs, names

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages, body, more = [], b"", True
        while more:
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            more = message.get("more_body", False)
        needed = self._needed(body)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        token = self.people.access.get(headers.get("authorization", "").removeprefix("Bearer "))
        if needed and token is not None and needed not in token.scopes:
            challenge = 'Bearer error="insufficient_scope"'
            if self.names:
                challenge += f', scope="{needed}"'
            await send(
                {
                    "type": "http.response.start",
                    "status": 403,
                    "headers": [(b"www-authenticate", challenge.encode())],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return

        async def replay() -> Any:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    def _needed(self, body: bytes) -> str:
        try:
            message = json.loads(body)
        except ValueError:
            return ""
        if not isinstance(message, dict) or message.get("method") != "tools/call":
            return ""
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        return self.needs.get(name, "") if isinstance(name, str) else ""


class OAuthMcpServer:
    """The authorization server and the MCP server it protects, on one free local port,
    served by uvicorn in a thread of the test process."""

    def __init__(self, scopes: dict[str, str] | None = None, *, names_scope: bool = True) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        port = self.sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/mcp"
        self.people = People(self.base)
        registered = ["people", *sorted(set(scopes.values()))] if scopes else None
        server = MCPServer(
            "people",
            log_level="WARNING",
            auth_server_provider=self.people,
            auth=AuthSettings(
                issuer_url=AnyHttpUrl(self.base),
                resource_server_url=AnyHttpUrl(self.url),
                client_registration_options=ClientRegistrationOptions(
                    enabled=True, valid_scopes=registered, default_scopes=registered
                ),
                revocation_options=RevocationOptions(enabled=True),
                validate_token_resource=False,
            ),
        )

        @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
        def whoami() -> str:
            """Who the bearer token acts for."""
            token = get_access_token()
            subject = token.subject if token and token.subject else "nobody"
            self.people.acted.append(subject)
            return f"acting as {subject}"

        @server.tool()
        def note(text: str) -> str:
            """Keep a note, as whoever the bearer token acts for (a write: no annotations)."""
            token = get_access_token()
            subject = token.subject if token and token.subject else "nobody"
            self.people.acted.append(subject)
            return f"noted {text!r} as {subject}"

        @server.custom_route("/login", methods=["GET"])
        async def login(request: Request) -> Response:
            ticket = request.query_params.get("ticket", "")
            if ticket not in self.people.waiting:
                return HTMLResponse("unknown sign-in", status_code=400)
            user = request.query_params.get("user")
            if request.query_params.get("deny"):
                return RedirectResponse(self.people.deny(ticket), status_code=302)
            if not user:  # the sign-in page a browser sees
                return HTMLResponse(
                    f'<form action="/login"><input type="hidden" name="ticket" value="{ticket}">'
                    '<input id="user" name="user"><button id="go">Sign in</button></form>'
                )
            return RedirectResponse(self.people.sign_in(ticket, user), status_code=302)

        for name in scopes or {}:

            @server.tool(name=name, annotations=ToolAnnotations(readOnlyHint=True))
            def scoped() -> str:
                """A read that needs a scope of its own (ScopeGate)."""
                token = get_access_token()
                subject = token.subject if token and token.subject else "nobody"
                self.people.acted.append(subject)
                return f"read as {subject}"

        app: Any = server.streamable_http_app()
        if scopes:
            app = ScopeGate(app, self.people, scopes, names=names_scope)
        self.uvicorn = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(
            target=self.uvicorn.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.uvicorn.started:
            assert time.monotonic() < deadline, "the OAuth MCP server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(10)
        self.sock.close()


def whoami(url: str, token: str) -> str:
    """Call the MCP server's `whoami` with a bearer token, as a per-user tool does."""
    import asyncio

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def call() -> str:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=10) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            result = await client.call_tool("whoami", {})
        return "".join(getattr(part, "text", "") for part in result.content)

    return asyncio.run(call())
