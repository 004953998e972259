"""Switchboard's tool library: declaring, validating, authorizing and running tools.

Depends on nothing else in Switchboard. Built-in tools live in `tools.builtin`
(call `tools.builtin.load()` or list `tools.builtin` in SWITCHBOARD_TOOLS).
"""

from tools.context import ToolContext
from tools.declare import make_tool, register_tool, tool, tool_of
from tools.decode import ArgumentError, canonical_json, decode_arguments
from tools.exceptions import (
    DuplicateToolError,
    OperatorError,
    PolicyError,
    ToolDefinitionError,
    ToolModuleError,
)
from tools.execute import Observation, execute, valid_unicode
from tools.policy import Denial, Policy, ToolRule
from tools.registry import Tool, ToolRegistry, load_modules, registry

__all__ = [
    "ArgumentError",
    "Denial",
    "DuplicateToolError",
    "Observation",
    "OperatorError",
    "Policy",
    "PolicyError",
    "Tool",
    "ToolContext",
    "ToolDefinitionError",
    "ToolModuleError",
    "ToolRegistry",
    "ToolRule",
    "canonical_json",
    "decode_arguments",
    "execute",
    "load_modules",
    "make_tool",
    "register_tool",
    "registry",
    "tool",
    "tool_of",
    "valid_unicode",
]
