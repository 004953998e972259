"""The `Tool` record and the registry that maps names to tools."""

from __future__ import annotations

import functools
import hashlib
import importlib
import math
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import SchemaError

from tools.context import ToolContext
from tools.decode import (
    argument_error,
    canonical_json,
    compact_json,
    json_type,
    schema_problems,
)
from tools.exceptions import (
    DuplicateToolError,
    OperatorError,
    ToolDefinitionError,
    ToolModuleError,
)
from tools.schema import is_object_schema, is_strict_compatible
from tools.schema_check import schema_problem

log = structlog.get_logger(__name__)

Effect = Literal["read", "write"]
Handler = Callable[[ToolContext, dict[str, Any]], Any]
Reconcile = Callable[[ToolContext, dict[str, Any]], Any]
Normalizer = Callable[[dict[str, Any]], dict[str, Any]]

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
EFFECTS: tuple[Effect, ...] = ("read", "write")
MIN_OUTPUT_CAP = 100
# Formats checked in arguments: those jsonschema checks by itself, the same everywhere
# (date-time and uri need optional packages, so they stay annotations as the draft says).
FORMATS = FormatChecker(formats=("date", "email", "ipv4", "ipv6", "uuid"))


@dataclass(frozen=True, eq=False)
class Tool:
    """A callable the model may propose, with its schema, effect and limits.

    `handler(ctx, args)` receives arguments that `validate` accepted. For
    typed tools `normalizer` runs after the JSON schema check (pydantic, strict)
    and returns the normalized arguments, defaults filled in.

    `source` says where the tool comes from, for people ("module mycompany.tools",
    "MCP server git"); left empty it is the module that defines the handler.
    `high_risk` is the declaration's own judgement (an MCP server's `destructiveHint`):
    the policy makes such a tool high risk unless the tool's entry says otherwise.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    effect: Effect
    handler: Handler
    timeout: float = 10.0
    output_cap: int = 8000
    reconcile: Reconcile | None = None
    normalizer: Normalizer | None = field(default=None, repr=False)
    source: str = ""
    high_risk: bool = False
    # What an MCP server's listing said about the tool (readOnlyHint, destructiveHint...);
    # None for tools declared in Python. Part of `contract_digest`.
    annotations: dict[str, Any] | None = field(default=None, repr=False)
    # A per-user tool's provider ("github", "mcp:docs"): it acts as the person asking, with
    # their own token (ToolContext.access_token); empty: the tool's own credentials.
    connection: str = ""
    strict: bool = field(init=False)
    _validator: Draft202012Validator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            raise ToolDefinitionError(
                f"tool name {self.name!r} is invalid: use 1-64 letters, digits, '_' or '-'"
            )
        if self.effect not in EFFECTS:
            raise ToolDefinitionError(
                f"tool {self.name}: effect must be 'read' or 'write', got {self.effect!r}"
            )
        if not callable(self.handler):
            raise ToolDefinitionError(f"tool {self.name}: handler must be callable")
        if self.reconcile is not None and not callable(self.reconcile):
            raise ToolDefinitionError(f"tool {self.name}: reconcile must be callable or None")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, int | float):
            raise ToolDefinitionError(f"tool {self.name}: timeout must be a number of seconds")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ToolDefinitionError(f"tool {self.name}: timeout must be positive and finite")
        if not isinstance(self.output_cap, int) or self.output_cap < MIN_OUTPUT_CAP:
            raise ToolDefinitionError(
                f"tool {self.name}: output_cap must be an integer >= {MIN_OUTPUT_CAP}"
            )
        if not isinstance(self.connection, str) or len(self.connection) > 64:
            raise ToolDefinitionError(
                f"tool {self.name}: connection must be a provider's name (text, at most 64)"
            )
        if not isinstance(self.source, str):
            raise ToolDefinitionError(f"tool {self.name}: source must be a string")
        if not self.source:
            object.__setattr__(self, "source", "module " + origin_module(self.handler))
        object.__setattr__(self, "_validator", _schema_validator(self.name, self.parameters))
        object.__setattr__(self, "strict", is_strict_compatible(self.parameters))

    @property
    def contract_digest(self) -> str:
        """A digest of what the tool takes and what it says it does: its schema, effect,
        high-risk declaration, annotations and whose credentials it acts with (`connection`).
        A standing grant made under one digest does
        not cover a call of the tool once it changed (approvals/grants.py)."""
        material = canonical_json(
            [
                self.name,
                self.parameters,
                self.effect,
                self.high_risk,
                self.annotations,
                self.connection,
            ]
        )
        return hashlib.sha256(material.encode()).hexdigest()[:16]

    def openai_spec(self) -> dict[str, Any]:
        """The Chat Completions `tools` entry; `strict` only when the schema allows it."""
        function: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        }
        if self.strict:
            function["strict"] = True
        return {"type": "function", "function": function}

    @functools.cached_property
    def openai_spec_json(self) -> str:
        """`openai_spec()` as the JSON text a request carries (`compact_json`), encoded once:
        a request's body is encoded at every model call, and its tools' entries are the same
        at each (worker/model_base.py `ToolSpecs`). A tool is not changed once made (frozen,
        its schema not edited in place)."""
        return compact_json(self.openai_spec())

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        """Check decoded arguments against the schema; raise ArgumentError if unusable."""
        if not isinstance(args, dict):
            problem = f"arguments must be a JSON object, got {json_type(args)}"
            raise argument_error(self.name, [problem], self.parameters)
        problems = schema_problems(self._validator, args, self.parameters)
        if problems:
            raise argument_error(self.name, problems, self.parameters)
        if self.normalizer is None:
            return dict(args)
        return self.normalizer(args)


def origin_module(handler: Callable[..., Any]) -> str:
    """The module that defines a handler (the decorated function, for typed tools)."""
    function = getattr(handler, "__wrapped__", handler)
    return str(getattr(function, "__module__", None) or "unknown")


def same_declaration(a: Tool, b: Tool) -> bool:
    """True for one declaration made twice (its module was imported again): the same
    function, the same name, effect, description and schema."""
    return _origin(a) == _origin(b) and _contract(a) == _contract(b)


def _origin(tool: Tool) -> str:
    function = getattr(tool.handler, "__wrapped__", tool.handler)
    return f"{function.__module__}.{function.__qualname__}"


def _contract(tool: Tool) -> tuple[object, ...]:
    return (tool.name, tool.effect, tool.description, tool.parameters, tool.source)


def _schema_validator(name: str, parameters: object) -> Draft202012Validator:
    if not isinstance(parameters, dict) or not is_object_schema(parameters):
        raise ToolDefinitionError(
            f'tool {name}: parameters must be a JSON schema with "type": "object" '
            f"(got {_preview(parameters)})"
        )
    problem = schema_problem(parameters)  # before anything recursive looks at it
    if problem:
        raise ToolDefinitionError(
            f"tool {name}: its parameters schema cannot be checked: it {problem}"
        )
    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as error:
        raise ToolDefinitionError(
            f"tool {name}: parameters is not a valid JSON schema: {error.message}"
        ) from error
    return Draft202012Validator(parameters, format_checker=FORMATS)


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"


class ToolRegistry:
    """Tools by name, in registration order. Registering a taken name is an error that
    names both sources (see `register_all` for re-imported declarations)."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._lock = threading.Lock()
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> Tool:
        with self._lock:
            existing = self._tools.get(tool.name)
            if existing is tool:
                return tool
            if existing is not None:
                raise DuplicateToolError(
                    f"a tool named {tool.name!r} is already registered by {existing.source}; "
                    f"{tool.source} declares one too. Tool names must be unique across modules "
                    "and MCP servers: rename one (for an MCP server, set its `prefix:` or leave "
                    "the tool out with `tools:`)"
                )
            self._tools[tool.name] = tool
        return tool

    def unregister(self, name: str) -> Tool | None:
        with self._lock:
            return self._tools.pop(name, None)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __contains__(self, name: object) -> bool:
        if isinstance(name, Tool):
            return self._tools.get(name.name) is name
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names()!r})"


registry = ToolRegistry()


def register_all(declared: Iterable[Tool], target: ToolRegistry | None = None) -> list[str]:
    """Register tools a module lists (its `TOOLS`) in `target` (default: the global registry).

    Idempotent: a tool whose declaration is already registered (also from an earlier import
    of a reloaded module) is skipped; a *different* tool with a taken name is a
    DuplicateToolError naming both. Returns the names, in order.
    """
    target = target if target is not None else registry
    names = []
    for tool in declared:
        existing = target.get(tool.name)
        if existing is None or not same_declaration(existing, tool):
            target.register(tool)
        names.append(tool.name)
    return names


def load_modules(names: Iterable[str] | str, target: ToolRegistry | None = None) -> None:
    """Import each tool module so its declarations register themselves.

    `names` may be an iterable or the raw comma-separated SWITCHBOARD_TOOLS
    value; blanks are ignored. A module may instead list its tools in a
    module-level `TOOLS` sequence (as `tools.builtin` does, so importing it
    registers nothing); those are registered in `target` (default: the global
    registry). A module that fails to import raises `ToolModuleError` naming
    the module and the cause.
    """
    target = target if target is not None else registry
    if isinstance(names, str):
        names = names.split(",")
    for raw_name in names:
        name = raw_name.strip()
        if not name:
            continue
        try:
            module = importlib.import_module(name)
            declared = getattr(module, "TOOLS", ())
            if isinstance(declared, list | tuple):
                register_all([t for t in declared if isinstance(t, Tool)], target)
        except OperatorError as error:  # a bad declaration: its message says what and where
            raise ToolModuleError(
                f"tool module {name!r} (from SWITCHBOARD_TOOLS): {error}", name=name
            ) from error
        except Exception as error:  # start-up boundary: any failure must name the module
            raise ToolModuleError(
                f"could not import tool module {name!r} (from SWITCHBOARD_TOOLS): "
                f"{type(error).__name__}: {error}",
                name=name,
            ) from error
        log.info("tool_module_loaded", module=name)
