"""Tools from MCP servers (SWITCHBOARD_MCP), through the official `mcp` SDK as the client.

config.py    the servers file: stdio commands or streamable HTTP URLs, prefixes, effects
loop.py      one asyncio loop per process, in a daemon thread, owning the sessions
session.py   one server's session: kept open, reopened with backoff, calls with timeouts
             (a per-user server: one session per call, with the asking person's token)
bridge.py    a listed tool as a `Tool`: name, effect from annotations, schema, handler
results.py   a tool result (text, images, resources, structured, isError) as text
servers.py   connecting at start-up and registering the tools, or refusing to start
"""

from tools.mcp.bridge import IDEMPOTENCY_META, effect_of, parameters_of
from tools.mcp.config import ServerConfig, expand, read_config
from tools.mcp.servers import McpServers, ServerTools, load, unload

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
