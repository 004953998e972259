"""Switchboard's tool library: declaring, validating, authorizing and running tools.

Depends on nothing else in Switchboard. Tools come from Python modules
(`load_modules`), from MCP servers (`tools.mcp`), and from the built-in samples in
`tools.builtin` (opt-in: `tools.builtin.load()`, or `tools.builtin` in SWITCHBOARD_TOOLS).
"""

from tools.context import ToolContext
from tools.declare import make_tool, register_tool, tool, tool_of
from tools.decode import ArgumentError, canonical_json, decode_arguments
from tools.exceptions import (
    DuplicateToolError,
    McpConfigError,
    McpServerError,
    OperatorError,
    PolicyError,
    ToolDefinitionError,
    ToolError,
    ToolModuleError,
)
from tools.execute import Observation, execute, valid_unicode
from tools.policy import Denial, Policy, ToolRule
from tools.registry import Tool, ToolRegistry, load_modules, register_all, registry

__all__ = [
    "ArgumentError",
    "Denial",
    "DuplicateToolError",
    "McpConfigError",
    "McpServerError",
    "Observation",
    "OperatorError",
    "Policy",
    "PolicyError",
    "Tool",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolModuleError",
    "ToolRegistry",
    "ToolRule",
    "canonical_json",
    "decode_arguments",
    "execute",
    "load_modules",
    "make_tool",
    "register_all",
    "register_tool",
    "registry",
    "tool",
    "tool_of",
    "valid_unicode",
]
