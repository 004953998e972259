"""Tools from MCP servers (SWITCHBOARD_MCP), through the official `mcp` SDK as the client.

config.py    the servers file: stdio commands or streamable HTTP URLs, prefixes, effects
loop.py      one asyncio loop per process, in a daemon thread, owning the sessions
session.py   one server's session: kept open, reopened with backoff, calls with timeouts
             (a per-user server: one session per call, with the asking person's token)
bridge.py    a listed tool as a `Tool`: name, effect from annotations, schema, handler
results.py   a tool result (text, images, resources, structured, isError) as text
servers.py   connecting at start-up and registering the tools, or refusing to start
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tools.mcp.bridge import IDEMPOTENCY_META, effect_of, parameters_of
    from tools.mcp.config import ServerConfig, expand, read_config
    from tools.mcp.servers import McpServers, ServerTools, load, unload

# Each name is imported from its module when first asked for, so that `tools.mcp.config`
# (the servers file, read by every process) does not import the SDK (~25 MiB a process):
# only processes that connect to servers do.
_FROM = {
    "IDEMPOTENCY_META": "bridge",
    "effect_of": "bridge",
    "parameters_of": "bridge",
    "ServerConfig": "config",
    "expand": "config",
    "read_config": "config",
    "McpServers": "servers",
    "ServerTools": "servers",
    "load": "servers",
    "unload": "servers",
}


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_FROM[name]}"), name)


__all__ = [
    "IDEMPOTENCY_META",
    "McpServers",
    "ServerConfig",
    "ServerTools",
    "effect_of",
    "expand",
    "load",
    "parameters_of",
    "read_config",
    "unload",
]
