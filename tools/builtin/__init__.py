"""Built-in tools: `calculate`, `knowledge_lookup` and the SQLite ticket tracker.

Importing this package registers them in the global registry; `load()` does
the same for any registry and may be called any number of times.
"""

from __future__ import annotations

from tools.builtin import calculator, knowledge, tickets
from tools.exceptions import DuplicateToolError
from tools.registry import Tool, ToolRegistry, registry

MODULES = (calculator, knowledge, tickets)


def builtin_tools() -> list[Tool]:
    """Every built-in tool, in a stable order."""
    return [tool for module in MODULES for tool in module.TOOLS]


def load(target: ToolRegistry | None = None) -> list[str]:
    """Register the built-in tools in `target` (default: the global registry).

    Idempotent: a built-in that is already registered (also from an earlier
    import of a reloaded module) is skipped. A *different* tool with a
    built-in's name is a DuplicateToolError. Returns the built-in names.
    """
    target = target if target is not None else registry
    for tool in builtin_tools():
        existing = target.get(tool.name)
        if existing is None:
            target.register(tool)
        elif existing is not tool and not _same_declaration(existing, tool):
            raise DuplicateToolError(
                f"cannot load built-in tool {tool.name!r}: another tool with that name "
                "is already registered"
            )
    return [tool.name for tool in builtin_tools()]


def _same_declaration(a: Tool, b: Tool) -> bool:
    """True for the same built-in declared twice (its module was re-imported)."""
    return _origin(a) == _origin(b) and _contract(a) == _contract(b)


def _origin(tool: Tool) -> str:
    function = getattr(tool.handler, "__wrapped__", tool.handler)
    return f"{function.__module__}.{function.__qualname__}"


def _contract(tool: Tool) -> tuple[object, ...]:
    return (tool.name, tool.effect, tool.description, tool.parameters)


load()
