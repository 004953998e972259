"""Switchboard's tool library: declaring, validating, authorizing and running tools.

This package's own names are the authoring API, what a tool module needs (pinned by
tests/test_tools_api.py):

    from tools import tool, register_tool, ToolContext, ToolError

Everything else lives in its module: `tools.registry` (Tool, ToolRegistry, the global
`registry`, load_modules), `tools.policy` (Policy), `tools.execute`, `tools.decode`,
`tools.exceptions` (the errors, OperatorError the operator's), `tools.declare` (make_tool,
tool_of), `tools.mcp` (MCP servers) and `tools.builtin` (the opt-in samples).

Depends on nothing else in Switchboard.
"""

from tools.context import ToolContext
from tools.declare import register_tool, tool
from tools.exceptions import ToolError

__all__ = ["ToolContext", "ToolError", "register_tool", "tool"]
