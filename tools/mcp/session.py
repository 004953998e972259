"""One MCP server's client session: opened in the shared loop, kept open, reopened when it
breaks.

A task in the loop (`_hold`) owns the session: it enters the SDK's `Client` (the server's
process for stdio, an HTTP session for streamable HTTP), lists the tools, and keeps the
session open until a call finds it broken or the process stops; then it closes it and
opens a new one, after 0.5 s, doubling up to 30 s while the server keeps failing. Calls
come from tool threads through `call`, which waits for a session up to the call's own
timeout. A read that loses its connection is sent again on the new session (reads are
safe to repeat); a write never is: before sending one the session is checked with a probe,
and a write that loses its connection after it was sent is reported as of unknown outcome.

A per-user server (`auth: per_user`) is held like this only to list its tools at start-up,
with its `headers:` (or none), and the session is then closed (`end_listing`). Each call
opens a session of its own with the asking person's token as its only credential
(`Authorization: Bearer ...`, never `headers:`), initializes, calls and closes, all within
the call's timeout: a streamable-HTTP session carries its headers, so one session per call
is what keeps one person's token out of another's call. A 401 on that session raises
`Unauthorized` (the token is no longer good; nothing was run), a 403 `insufficient_scope`
`InsufficientScope` (the token is good but does not give the access the call needs). Tokens
are never logged: the SDK logs URLs and messages, not headers, and nothing here logs either.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Any

import httpx2
import structlog
from mcp import Client, MCPError, StdioServerParameters, types
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
from pydantic import ValidationError

from tools.exceptions import McpServerError, ToolError, bounded
from tools.mcp.config import ServerConfig, command_places, resolve_command
from tools.mcp.loop import EventLoopThread
from tools.yaml_nodes import printable

log = structlog.get_logger(__name__)

CLIENT_INFO = types.Implementation(name="switchboard", version="0.1.0")
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
STABLE_SECONDS = 30.0  # a session that lasted this long starts the backoff over
PROBE_SECONDS = 5.0
CANCEL_AFTER_SECONDS = 1.0
MAX_PAGES = 100  # of tools/list
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)  # the SDK's own defaults


class Unauthorized(Exception):
    """A per-user server answered 401 to the person's token: it no longer accepts it (the
    call was not run: the server refused it before any tool saw it)."""


class InsufficientScope(Exception):
    """A per-user server answered 403 `insufficient_scope` (RFC 6750) to the person's token:
    it is good, but does not give the access the call needs (`scope`: what the server said
    it needs, as it wrote it, or ""). The call was not run."""

    def __init__(self, server: str, scope: str) -> None:
        super().__init__(server)
        self.scope = scope


MAX_CHALLENGE_CHARS = 8_000  # of a WWW-Authenticate header read
_AUTH_PARAM = re.compile(
    r"[ \t]*([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*=[ \t]*"  # name =
    r"""("(?:[^"\\]|\\.)*"|[^ \t,"]*)[ \t]*(?:,|$)"""  # "quoted" or token, then , or the end
)
_BEARER = re.compile(r"(?:^|[ \t,])Bearer(?:[ \t]+|$)", re.IGNORECASE)


def bearer_params(header: str) -> dict[str, str]:
    """The parameters of the Bearer challenge in a WWW-Authenticate value (RFC 7235
    auth-params: `name=token` or `name="quoted string"`, comma-separated), names in lower
    case, the first of each kept; {} without a Bearer challenge. Read in order, so a
    `scope=` inside another parameter's quoted text is that text, not the scope."""
    header = header[:MAX_CHALLENGE_CHARS]
    found = _BEARER.search(header)
    params: dict[str, str] = {}
    if found is None:
        return params
    at = found.end()
    while at < len(header):
        param = _AUTH_PARAM.match(header, at)
        if param is None or param.end() == at:
            break  # another scheme's challenge, or what is not an auth-param
        name, value = param.group(1).lower(), param.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        params.setdefault(name, value)
        at = param.end()
    return params


def short_of_scope(response: httpx2.Response) -> str | None:
    """For a 403 whose WWW-Authenticate says `insufficient_scope`: the `scope` it names ("" if
    none); else None."""
    if response.status_code != 403:
        return None
    params = bearer_params(response.headers.get("WWW-Authenticate", ""))
    if params.get("error") != "insufficient_scope":
        return None
    return params.get("scope", "")


class BearerAnswers:
    """What a per-user server's bearer check answered a call's session, as its responses
    come (`seen`, the HTTP client's response hook): a 401 (`refused`) or a 403
    `insufficient_scope` (`short_of`, the scope it named) to the MCP messages (POSTs) sent
    before the `tools/call` itself was answered otherwise. Once it was, or on the session's
    other requests (the GET stream, the DELETE that closes it), such an answer cannot mean
    the call did not run, and counts for nothing."""

    def __init__(self) -> None:
        self.refused = False
        self.short_of: str | None = None
        self.answered = False  # the tools/call had an answer other than 401/403

    async def seen(self, response: httpx2.Response) -> None:
        request = response.request
        if self.answered or request.method != "POST" or response.has_redirect_location:
            return  # a redirect (the SDK follows it within the origin) answers nothing
        if response.status_code == 401:
            self.refused = True
            return
        named = short_of_scope(response)
        if named is not None:
            self.short_of = named if self.short_of is None else self.short_of
        elif _is_call(request):
            self.answered = True


def _is_call(request: httpx2.Request) -> bool:
    try:
        body = request.content
    except httpx2.RequestNotRead:
        return True  # not known: taken as the call, so nothing after it counts
    return b'"tools/call"' in body


class Connection:
    """The session with one configured server, shared by every thread of the process."""

    def __init__(self, config: ServerConfig, loop: EventLoopThread) -> None:
        self.config = config
        self.loop = loop
        self.listing: list[types.Tool] = []  # from the last connection
        self.last_error: str | None = None
        self.sessions = 0  # opened so far
        # Loop-side state: read and changed only by coroutines running in `loop`.
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._failed = asyncio.Event()  # an attempt failed since the last success
        self._broken = asyncio.Event()
        self._stop = asyncio.Event()
        self._holder: asyncio.Task[None] | None = None

    # -- from any thread ----------------------------------------------------------

    def start(self) -> None:
        """Connect and list the tools, or raise McpServerError saying why not. A stdio
        server gets one try (a command that fails at once will fail again); an HTTP server
        is tried again until `connect_timeout`, as it may still be starting."""
        self.loop.run(self._start(), timeout=self.config.connect_timeout + 10)

    def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        tool_name: str,
        timeout: float,
        meta: dict[str, Any] | None,
        repeatable: bool,
        bearer: str | None = None,
    ) -> types.CallToolResult:
        """Call the server's tool `name`; `tool_name` is ours, for messages. Raises ToolError
        for every failure the model should read. A per-user server is called with `bearer`
        (the person's token) on a session of its own, and raises Unauthorized on a 401."""
        call = _Call(name, arguments, tool_name, meta, repeatable, time.monotonic() + timeout)
        if self.config.per_user and not bearer:  # never the listing session's credentials
            raise ToolError(
                f"Error: {tool_name} was not run: it acts as the person asking, and there is "
                "no token of theirs to call it with"
            )
        work = self._call(call) if bearer is None else self._call_as(call, bearer)
        try:
            return self.loop.run(work, timeout=timeout + CANCEL_AFTER_SECONDS + 5)
        except TimeoutError:  # the loop itself did not answer: the call's fate is not known
            raise ToolError(call.lost("it did not answer in time")) from None

    def list_again(self) -> list[types.Tool]:
        """List the server's tools once more on the open session (start-up asks twice, to
        catch a server that says something different each time: tools/mcp/pins.py)."""
        return self.loop.run(self._list_again(), timeout=self.config.connect_timeout + 5)

    def end_listing(self) -> None:
        """A per-user server's tools are registered: close the session that listed them (with
        `headers:`); its calls open sessions of their own."""
        if self.config.per_user:
            self.close()

    def close(self, timeout: float = 5.0) -> None:
        if self.loop.alive:
            with contextlib.suppress(TimeoutError):
                self.loop.run(self._close(), timeout=timeout + 1)

    # -- in the loop ----------------------------------------------------------------

    async def _start(self) -> None:
        if self._holder is None:
            self._holder = asyncio.create_task(self._hold(), name=f"mcp-{self.config.key}")
        fail_fast = self.config.transport == "stdio"
        if await self._wait_ready(self.config.connect_timeout, fail_fast=fail_fast):
            return
        reason = printable(self.last_error or f"no answer within {self.config.connect_timeout:g} s")
        await self._close()
        raise McpServerError(
            f"{self.config.where}: cannot connect to {bounded(self.config.target, 120)}: "
            f"{reason}; check its {'command' if fail_fast else 'url and headers'}, or remove "
            "the server"
        )

    async def _list_again(self) -> list[types.Tool]:
        client = self._client
        try:
            if client is None:
                raise ConnectionError("the connection closed")
            async with asyncio.timeout(self.config.connect_timeout):
                return await _list_tools(client)
        except (*_UNAVAILABLE, ValidationError, RuntimeError) as error:
            raise McpServerError(
                f"{self.config.where}: cannot list its tools a second time: "
                f"{printable(describe(error, self.config))}; check that the server is stable, "
                "or remove it"
            ) from None

    async def _hold(self) -> None:
        delay = BACKOFF_FIRST
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                await self._session()
            except Exception as error:  # the session's boundary: any failure means reconnect
                self.last_error = describe(error, self.config)
                self._failed.set()
                log.warning(
                    "mcp_server_unavailable",
                    server=self.config.key,
                    error=self.last_error,
                    retry_in=delay,
                    # a server that is down or gone needs no traceback; anything else does
                    exc_info=None if isinstance(_leaf(error), _UNAVAILABLE) else error,
                )
            if self._stop.is_set():
                return
            if time.monotonic() - started >= STABLE_SECONDS:
                delay = BACKOFF_FIRST
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            delay = min(delay * 2, BACKOFF_MAX)

    async def _session(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            async with asyncio.timeout(self.config.connect_timeout):
                client = await stack.enter_async_context(await self._open(stack))
                listing = await _list_tools(client)
            self._note_changes(listing)
            self.listing, self._client, self.last_error = listing, client, None
            self.sessions += 1
            self._failed.clear()
            self._ready.set()
            log.info(
                "mcp_server_connected",
                server=self.config.key,
                transport=self.config.transport,
                tools=len(listing),
                session=self.sessions,
            )
            try:
                await _first(self._broken.wait(), self._stop.wait())
            finally:
                self._client = None
                self._ready.clear()
                self._broken.clear()

    def _note_changes(self, listing: list[types.Tool]) -> None:
        """Tools are registered at start-up; a server that comes back with other tools keeps
        the registered ones (a call to a tool it dropped fails) until the process restarts."""
        if not self.sessions:
            return
        before, now = {t.name for t in self.listing}, {t.name for t in listing}
        if before != now:
            log.warning(
                "mcp_server_tools_changed",
                server=self.config.key,
                added=sorted(now - before)[:10],
                removed=sorted(before - now)[:10],
                hint="restart Switchboard to register the server's current tools",
            )

    async def _open(self, stack: contextlib.AsyncExitStack) -> Client:
        config = self.config
        if config.command is not None:
            params = StdioServerParameters(
                command=resolve_command(config.command),
                args=list(config.args),
                env=dict(config.env) or None,
                cwd=config.cwd,
            )
            return Client(params, client_info=CLIENT_INFO, cache=None)
        http = httpx2.AsyncClient(headers=dict(config.headers), timeout=HTTP_TIMEOUT)
        await stack.enter_async_context(http)
        transport = streamable_http_client(str(config.url), http_client=http)
        return Client(transport, client_info=CLIENT_INFO, cache=None)

    async def _wait_ready(self, timeout: float, *, fail_fast: bool = False) -> bool:
        if self._ready.is_set():
            return True
        if timeout > 0:
            waits = [self._ready.wait(), *([self._failed.wait()] if fail_fast else [])]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_first(*waits), timeout)
        return self._ready.is_set()

    async def _connected(self, call: _Call) -> Client:
        if await self._wait_ready(call.remaining()) and self._client is not None:
            return self._client
        why = self.last_error or "it is not connected"
        raise ToolError(
            f"Error: {call.tool_name} was not run: MCP server '{self.config.key}' is "
            f"unavailable ({why}); Switchboard keeps reconnecting, so try again later"
        )

    async def _call(self, call: _Call) -> types.CallToolResult:
        for attempt in (1, 2):  # a read that lost its session is asked again on the next
            client = await self._connected(call)
            if not call.repeatable and not await self._alive(client, call):
                client = await self._connected(call)  # a fresh session; the write was not sent
            try:
                return await self._send(client, call)
            except _Lost as lost:
                if not call.repeatable or attempt == 2:
                    raise ToolError(call.lost(lost.reason)) from None
        raise AssertionError("unreachable")

    async def _call_as(self, call: _Call, bearer: str) -> types.CallToolResult:
        """A per-user server's call, on a session opened for it with `bearer` alone. A read
        whose session breaks is sent once more on a new one; a write never is."""
        for attempt in (1, 2):
            try:
                return await self._once_as(call, bearer)
            except _Lost as lost:
                if not call.repeatable or attempt == 2:
                    raise ToolError(call.lost(lost.reason)) from None
        raise AssertionError("unreachable")

    async def _once_as(self, call: _Call, bearer: str) -> types.CallToolResult:
        said = BearerAnswers()
        # What the call came to, kept as a value: raised inside the session's task group, it
        # would come out wrapped in exception groups.
        outcome: types.CallToolResult | Exception | None = None
        opened = False
        try:
            async with contextlib.AsyncExitStack() as stack:
                http = httpx2.AsyncClient(
                    headers={"Authorization": f"Bearer {bearer}"},
                    timeout=HTTP_TIMEOUT,
                    event_hooks={"response": [said.seen]},
                )
                await stack.enter_async_context(http)
                transport = streamable_http_client(str(self.config.url), http_client=http)
                async with asyncio.timeout(call.remaining()):
                    client = await stack.enter_async_context(
                        Client(transport, client_info=CLIENT_INFO, cache=None)
                    )
                opened = True
                try:
                    outcome = await self._send(client, call)
                except (ToolError, _Lost) as error:
                    outcome = error
        except Exception as error:  # opening (or closing) the session failed
            if outcome is None:
                outcome = error
        if isinstance(outcome, types.CallToolResult):
            return outcome  # whatever answered 401 afterwards (closing) changes nothing
        if said.refused:  # the server's bearer check refused it: no tool ran
            log.info("mcp_token_refused", server=self.config.key, tool=call.tool_name)
            raise Unauthorized(self.config.key)
        if said.short_of is not None:  # ... or found it short of a scope: nor then
            log.info("mcp_token_short_of_scope", server=self.config.key, tool=call.tool_name)
            raise InsufficientScope(self.config.key, said.short_of)
        if isinstance(outcome, ToolError | _Lost):
            raise outcome
        if outcome is None:
            why = "no session"
        elif isinstance(_leaf(outcome), TimeoutError):
            why = f"no answer within {round(call.timeout, 1):g} s"
        else:
            why = describe(outcome, self.config)
        if opened:  # the session broke after it was opened: the call may have been sent
            raise _Lost(why)
        raise ToolError(
            f"Error: {call.tool_name} was not run: MCP server '{self.config.key}' is "
            f"unavailable ({printable(why)}); try again later"
        )

    async def _send(self, client: Client, call: _Call) -> types.CallToolResult:
        try:
            return await client.call_tool(
                call.name,
                call.arguments,
                # past the caller's own timeout, which reports it (`execute`); then the server
                # is asked to cancel, and this thread is freed
                read_timeout_seconds=call.remaining() + CANCEL_AFTER_SECONDS,
                meta=call.meta,  # type: ignore[arg-type]  # a plain dict is what it sends
            )
        except MCPError as error:
            if error.code == CONNECTION_CLOSED:
                self._mark_broken(client, "the connection closed")
                raise _Lost("the connection to the server closed") from None
            if error.code == REQUEST_TIMEOUT:
                raise ToolError(call.timed_out()) from None
            raise ToolError(
                f"Error: MCP server '{self.config.key}' refused {call.tool_name}: "
                f"{bounded(error.message, 500)}"
            ) from None
        except ValidationError as error:
            raise ToolError(
                call.lost(f"its reply is not a valid MCP result ({error.error_count()} problems)")
            ) from None

    async def _alive(self, client: Client, call: _Call) -> bool:
        """Check the session before a write, so one that died while idle is found out now,
        before the write is sent, not after. The probe is a tools/list: `ping` is gone from
        the 2026-07-28 protocol."""
        try:
            probe = client.session.list_tools()
            await asyncio.wait_for(probe, min(PROBE_SECONDS, call.remaining()))
        except MCPError as error:
            if error.code != CONNECTION_CLOSED:
                return True  # it answered, if not with a pong
            self._mark_broken(client, "the connection closed")
            return False
        except TimeoutError:
            return True  # slow, not gone: the call's own timeout decides
        return True

    def _mark_broken(self, client: Client, why: str) -> None:
        if client is self._client:
            self.last_error = why
            self._ready.clear()
            self._broken.set()
            log.warning("mcp_server_connection_lost", server=self.config.key, why=why)

    async def _close(self) -> None:
        self._stop.set()
        holder, self._holder = self._holder, None
        if holder is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(holder, 5.0)


class _Call:
    """One call in flight: what to send, and when its time is up."""

    def __init__(
        self,
        name: str,
        arguments: dict[str, Any],
        tool_name: str,
        meta: dict[str, Any] | None,
        repeatable: bool,
        deadline: float,
    ) -> None:
        self.name, self.arguments, self.tool_name = name, arguments, tool_name
        self.meta, self.repeatable, self.deadline = meta, repeatable, deadline
        self.timeout = max(deadline - time.monotonic(), 0.0)

    def remaining(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)

    def lost(self, reason: str) -> str:
        if self.repeatable:
            return f"Error: {self.tool_name} failed: {reason}"
        return (
            f"Error: {self.tool_name} was sent, but {reason}; its outcome is unknown (it may "
            "have taken effect) and it was not retried"
        )

    def timed_out(self) -> str:
        return self.lost(f"the server did not answer within {round(self.timeout, 1):g} s")


class _Lost(Exception):
    """The session broke while a call was in flight."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def _list_tools(client: Client) -> list[types.Tool]:
    listed: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return listed
    raise RuntimeError(f"tools/list gave more than {MAX_PAGES} pages")


async def _first(*waits: Any) -> None:
    """Wait until the first of these coroutines finishes; cancel the others."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


# How servers are unavailable: a process that will not start or has exited, a connection
# refused or dropped, no answer in time, an MCP error answer.
_UNAVAILABLE = (OSError, TimeoutError, httpx2.TransportError, MCPError)


def _leaf(error: BaseException) -> BaseException:
    """The first real error inside the exception groups anyio wraps errors in."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def describe(error: BaseException, config: ServerConfig) -> str:
    """A failure to connect, in one line for the operator."""
    leaf = _leaf(error)
    if isinstance(leaf, FileNotFoundError) and config.command is not None:
        places = " and ".join(command_places())
        return f"command not found: {bounded(config.command, 100)} (looked in {places})"
    if isinstance(leaf, MCPError) and leaf.code == CONNECTION_CLOSED:
        if config.command is not None:
            return "the server closed the connection (its process exited; its output is above)"
        return "the server closed the connection"
    if isinstance(leaf, TimeoutError):
        return f"no answer within {config.connect_timeout:g} s"
    return bounded(f"{type(leaf).__name__}: {leaf}", 300)
