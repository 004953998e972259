"""Built-in sample tools: `calculate`, `knowledge_lookup` and the SQLite ticket tracker.

Opt-in: importing this package registers nothing. `SWITCHBOARD_TOOLS=tools.builtin` loads
them (through `TOOLS`, like any module that lists its tools), and Switchboard loads them
when no tools are configured at all, so the out-of-the-box console has something to call.
`load()` registers them in any registry and may be called any number of times.
"""

from __future__ import annotations

from tools.builtin import calculator, knowledge, tickets
from tools.registry import Tool, ToolRegistry, register_all

MODULES = (calculator, knowledge, tickets)


def builtin_tools() -> list[Tool]:
    """Every built-in tool, in a stable order."""
    return [tool for module in MODULES for tool in module.TOOLS]


TOOLS = tuple(builtin_tools())


def load(target: ToolRegistry | None = None) -> list[str]:
    """Register the built-in tools in `target` (default: the global registry).

    Idempotent: a built-in that is already registered (also from an earlier
    import of a reloaded module) is skipped. A *different* tool with a
    built-in's name is a DuplicateToolError naming both. Returns the built-in names.
    """
    return register_all(builtin_tools(), target)
