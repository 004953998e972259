"""The MCP servers of one SWITCHBOARD_MCP file: connected at start-up, their tools registered.

Start-up connects to every server at once and refuses to start, with one line per problem,
when any server cannot be reached or listed, or when its tools cannot be registered as
configured (a name `tools:` or `effects:` lists that the server does not have, a name that
is not a valid tool name, two sources with one name). Starting without a server's tools
would silently drop tools the policy names, and a policy naming a tool that is not there
is itself a start-up error. After start-up a server that dies costs only its own calls:
they fail with a message the model reads while the session is reopened with backoff.

Each server is listed twice at start-up and compared with the listing first recorded for
the deployment (tools/mcp/pins.py): a server whose listing changed has all its tools
registered as writes, except those `effects:` pins.

A per-user server (`auth: per_user`) is listed the same way, with its `headers:` (meant for
listing only) or with none when it lists openly; once its tools are registered that session
is closed, and each call opens its own with the asking person's token (tools/mcp/session.py).
"""

from __future__ import annotations

import atexit
import difflib
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import redis
import structlog

from tools.exceptions import McpConfigError, McpServerError, ToolDefinitionError
from tools.mcp.bridge import make_tool
from tools.mcp.config import ServerConfig, read_config
from tools.mcp.loop import EventLoopThread, shared_loop
from tools.mcp.pins import SAME, Pins, Verdict, compare
from tools.mcp.session import Connection
from tools.registry import Tool, ToolRegistry, registry
from tools.yaml_nodes import printable

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ServerTools:
    """One server and the tools it brings, as registered."""

    config: ServerConfig
    connection: Connection
    tools: tuple[Tool, ...]
    verdict: Verdict = SAME  # "differs": its listing changed, its tools are all writes


class McpServers:
    """Connections to the servers of one file and the tools made from their listings."""

    def __init__(self, configs: Iterable[ServerConfig], loop: EventLoopThread | None = None):
        loop = loop or shared_loop()
        self.connections = {c.key: Connection(c, loop) for c in configs}
        self.servers: list[ServerTools] = []
        self.pins: Pins | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> McpServers:
        return cls(read_file(path))

    def connect(self, pins: Pins | None = None) -> None:
        """Connect to every server (at once) and build their tools; McpServerError lists
        every problem, and then no session stays open. With `pins`, each listing is checked
        against the one recorded for the deployment (recorded now if there is none)."""
        problems: list[str] = []
        failed: set[str] = set()
        threads = [
            threading.Thread(target=_start, args=(c, problems, failed), name=f"mcp-start-{key}")
            for key, c in self.connections.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.pins = pins
        self.servers = [
            self._tools_of(c, problems, self._verdict(c, pins, problems))
            for key, c in self.connections.items()
            if key not in failed
        ]
        if problems:
            self.close()
            raise McpServerError("\n".join(sorted(problems)))
        for connection in self.connections.values():
            connection.end_listing()

    def register(self, target: ToolRegistry) -> None:
        """Register every tool, or none: a name taken by another source, or by two servers,
        is a McpServerError naming both."""
        problems: list[str] = []
        seen: dict[str, ServerConfig] = {}
        for server in self.servers:
            for tool in server.tools:
                existing = target.get(tool.name)
                if existing is not None and existing is not tool:
                    problems.append(
                        f"{server.config.where}: its tool {tool.name!r} has the name of a tool "
                        f"from {existing.source}; tool names must be unique: set `prefix:` for "
                        "the server, or leave the tool out with `tools:`"
                    )
                elif tool.name in seen:
                    problems.append(
                        f"{server.config.where}: its tool {tool.name!r} has the name of a tool "
                        f"of {seen[tool.name].where}; give one of them another `prefix:`"
                    )
                seen.setdefault(tool.name, server.config)
        if problems:
            raise McpServerError("\n".join(problems))
        for server in self.servers:
            for tool in server.tools:
                target.register(tool)

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()

    def _guard(self, config: ServerConfig) -> Callable[[], str | None] | None:
        """For the reads of a server this process believed: refuse them once another
        process has found the server's listing changed (one Redis GET per call)."""
        pins = self.pins
        if pins is None:
            return None

        def changed() -> str | None:
            try:
                mark = pins.marked(config.key)
            except redis.RedisError:
                return "Switchboard cannot check that its MCP server is unchanged (Redis)"
            if mark is None:
                return None
            return (
                f"MCP server '{config.key}' has changed its tool listing since this process "
                "started, so its reads wait until an operator accepts the change and "
                "Switchboard restarts"
            )

        return changed

    def _verdict(self, connection: Connection, pins: Pins | None, problems: list[str]) -> Verdict:
        """Whether the server's listing stayed what it was (see tools/mcp/pins.py)."""
        config = connection.config
        try:
            again = connection.list_again()
        except McpServerError as error:
            problems.append(str(error))
            return SAME
        if pins is None:
            verdict = compare(config.key, connection.listing, again)
        else:
            verdict = pins.check(config.key, connection.listing, again)
        if verdict.differs:
            log.warning(
                "mcp_server_listing_changed",
                server=config.key,
                reason=verdict.reason,
                tools=list(verdict.differing),
                effect="every tool of the server is a write, except those `effects:` pins",
                hint=f"switchboard tools accept {config.key}",
            )
        elif verdict.state == "recorded":
            log.info("mcp_server_listing_recorded", server=config.key, tools=len(again))
        return verdict

    def _tools_of(
        self, connection: Connection, problems: list[str], verdict: Verdict = SAME
    ) -> ServerTools:
        config = connection.config
        twice = [name for name, n in Counter(t.name for t in connection.listing).items() if n > 1]
        for name in twice[:5]:
            problems.append(
                f"{config.where}: it lists two tools named {printable(name[:80])!r}, so which "
                "one a call reaches is not known; fix the server, or leave the tool out with "
                "`tools:`"
            )
        listed = {tool.name: tool for tool in connection.listing if tool.name not in twice}
        for section, names in (("tools", config.tools or ()), ("effects", config.effects)):
            for name in names:
                if name not in listed:
                    problems.append(
                        f"{config.where}: {section} names {name!r}, which the server does not "
                        f"have ({_suggest(name, sorted(listed))})"
                    )
        wanted = config.tools if config.tools is not None else tuple(listed)
        for name in config.effects:
            if name in listed and name not in wanted:
                problems.append(f"{config.where}: effects names {name!r}, left out by `tools:`")
        made = []
        for name in wanted:
            if name not in listed:
                continue
            try:
                made.append(
                    make_tool(
                        config,
                        connection,
                        listed[name],
                        all_writes=verdict.differs,
                        guard=self._guard(config) if not verdict.differs else None,
                    )
                )
            except ToolDefinitionError as error:
                problems.append(f"{config.where}: {error}")
        return ServerTools(config, connection, tuple(made), verdict)


def read_file(path: str | Path) -> list[ServerConfig]:
    """The checked servers of an MCP servers file (McpConfigError: what is wrong, where)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise McpConfigError(f"{source}: MCP servers file not found (SWITCHBOARD_MCP)") from None
    except (OSError, UnicodeDecodeError) as error:
        raise McpConfigError(f"{source}: cannot read the MCP servers file: {error}") from None
    return read_config(text, source)


def _suggest(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    return printable(f"it has: {shown or 'no tools'}")


def _start(connection: Connection, problems: list[str], failed: set[str]) -> None:
    try:
        connection.start()
    except McpServerError as error:
        problems.append(str(error))
        failed.add(connection.config.key)


_loaded: dict[tuple[str, int], tuple[ToolRegistry, McpServers]] = {}
_lock = threading.Lock()


def load(
    path: str | Path, target: ToolRegistry | None = None, pins: Pins | None = None
) -> McpServers:
    """Read SWITCHBOARD_MCP, connect to every server and register its tools in `target`
    (default: the global registry), each listing checked against `pins`. Once per file and
    registry in a process: loading it again returns the same servers. Raises McpConfigError
    or McpServerError."""
    target = target if target is not None else registry
    key = (str(Path(path).resolve()), id(target))
    with _lock:
        if key in _loaded:
            return _loaded[key][1]
        servers = McpServers.from_file(path)
        servers.connect(pins)
        try:
            servers.register(target)
        except McpServerError:
            servers.close()
            raise
        _loaded[key] = (target, servers)
        return servers


def unload(servers: McpServers) -> None:
    """Close the servers and unregister their tools (for tests and for `tools check`)."""
    with _lock:
        for key, (target, loaded) in list(_loaded.items()):
            if loaded is servers:
                del _loaded[key]
                for server in servers.servers:
                    for tool in server.tools:
                        if target.get(tool.name) is tool:
                            target.unregister(tool.name)
    servers.close()


@atexit.register
def _close_all() -> None:
    """Stop stdio servers politely at exit (they would also stop when their stdin closes)."""
    with _lock:
        loaded = [servers for _, servers in _loaded.values()]
        _loaded.clear()
    for servers in loaded:
        servers.close()
