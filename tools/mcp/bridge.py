"""An MCP server's tool as a Switchboard `Tool`: its name, effect, risk, schema and handler.

Effects come from the tool's annotations, failing safe: only `readOnlyHint: true` makes a
read; anything else, missing annotations included, is a write and waits for approval. A
write with `destructiveHint: true` is high risk (a confirmation on Approve) unless the
policy entry that applies sets `high_risk` itself. The server file's `effects:` overrides
both. Annotations are hints from the server, which is why an operator can override them,
and why a read is never what a server merely fails to say.

Everything else a server supplies is bounded before the model sees it: its description (or
title) and every description in its input schema are cut at MAX_TEXT characters (said once
in the log), and an input schema that cannot be checked safely (tools/schema_check.py) or
is larger than MAX_SCHEMA_CHARS is refused at start-up, naming the server and the tool.

A tool of a per-user server (`auth: per_user`) is registered with `connection="mcp:<key>"`,
as a Python per-user tool is, so its approvals, grants and contract digest say whom it acts
as; each call carries the asking person's token (`ctx.access_token()`: NotConnected when
they have none). A 401 from the server refreshes the connection and tries once more (the
server ran nothing); a second one drops it, and the person is asked to connect again. A
403 `insufficient_scope` keeps the connection and asks the person to connect again with the
access the server named (NeedsMoreAccess; a plain tool error if it named none).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import structlog
from mcp import types

from tools.context import ToolContext
from tools.exceptions import NotConnected, ToolDefinitionError, ToolError, short_of_access
from tools.mcp.config import Effect, ServerConfig
from tools.mcp.results import result_text
from tools.mcp.session import Connection, InsufficientScope, Unauthorized
from tools.registry import NAME_PATTERN, Handler, Tool
from tools.schema import usable_defaults, walk, with_defaults, without_titles
from tools.schema_check import schema_problem

log = structlog.get_logger(__name__)

# Where the idempotency key (the approval id) travels: the request's `_meta`, under a key of
# our own (the spec leaves `_meta` keys without a reserved prefix to their users).
IDEMPOTENCY_META = "switchboard/idempotency-key"
Guard = Callable[[], str | None]  # why a call must not run now, or None
MAX_TEXT = 2_000  # characters of a description the model is sent
MAX_SCHEMA_CHARS = 32_000  # characters of an input schema's JSON, descriptions cut


def effect_of(tool: types.Tool, config: ServerConfig) -> Effect:
    override = config.effects.get(tool.name)
    if override is not None:
        return override
    annotations = tool.annotations
    return "read" if annotations is not None and annotations.read_only_hint is True else "write"


def is_destructive(tool: types.Tool) -> bool:
    return tool.annotations is not None and tool.annotations.destructive_hint is True


def parameters_of(tool: types.Tool) -> dict[str, Any]:
    """The server's input schema as the model and the validator see it: titles dropped, and
    no argument the schema does not name (as for `register_tool`); nested objects stay as
    the server published them."""
    schema = without_titles(json.loads(json.dumps(tool.input_schema, allow_nan=False)))
    schema.pop("$schema", None)
    if "type" not in schema and isinstance(schema.get("properties"), dict):
        schema["type"] = "object"
    schema.setdefault("properties", {})
    schema.setdefault("additionalProperties", False)
    return schema


def make_tool(
    config: ServerConfig,
    connection: Connection,
    listed: types.Tool,
    *,
    all_writes: bool = False,
    guard: Guard | None = None,
) -> Tool:
    """Build the `Tool` for one listed server tool; ToolDefinitionError if it cannot be.
    `all_writes`: the server's listing changed (tools/mcp/pins.py), so whatever it says now,
    the tool is a high-risk write unless `effects:` pins it. `guard`, asked before each call
    of a read its annotations made (not `effects:`), says why it must not run now."""
    name = config.tool_name(listed.name)
    if not NAME_PATTERN.match(name):
        raise ToolDefinitionError(
            f"its tool {listed.name!r} would be named {name!r}, which is not a valid tool "
            "name (1-64 letters, digits, '_' or '-'); leave it out with `tools:`, or change "
            "`prefix:`"
        )
    pinned = config.effects.get(listed.name)
    effect = "write" if all_writes and pinned is None else effect_of(listed, config)
    high_risk = effect == "write" and (is_destructive(listed) or (all_writes and pinned is None))
    problem = schema_problem(listed.input_schema)  # before anything recursive looks at it
    if problem:
        raise ToolDefinitionError(
            f"tool {name}: its input schema cannot be checked: it {problem}; fix the server's "
            "schema, or leave the tool out with `tools:`"
        )
    try:
        parameters = parameters_of(listed)
    except (TypeError, ValueError) as error:
        raise ToolDefinitionError(f"tool {name}: its input schema is not plain JSON") from error
    description, cut = bounded_texts(listed, parameters)
    if cut:
        log.warning("mcp_text_cut", server=config.key, tool=name, cut=cut, limit=MAX_TEXT)
    size = len(json.dumps(parameters, ensure_ascii=False))
    if size > MAX_SCHEMA_CHARS:
        raise ToolDefinitionError(
            f"tool {name}: its input schema is {size:,} characters of JSON, more than "
            f"{MAX_SCHEMA_CHARS:,} (sent to the model with every request); leave the tool out "
            "with `tools:`"
        )
    defaults = usable_defaults(parameters)
    return Tool(
        name=name,
        description=description or f"The {listed.name} tool of the {config.key} MCP server.",
        parameters=parameters,
        effect=effect,
        handler=make_handler(
            connection,
            listed.name,
            name,
            effect,
            config.timeout,
            guard if effect == "read" and pinned is None else None,
        ),
        timeout=config.timeout,
        normalizer=lambda args: with_defaults(args, defaults),
        source=f"MCP server {config.key}",
        high_risk=high_risk,
        connection=config.connection,
        annotations=(
            listed.annotations.model_dump(by_alias=True, exclude_none=True)
            if listed.annotations is not None
            else None
        ),
    )


def bounded_texts(listed: types.Tool, parameters: dict[str, Any]) -> tuple[str, list[str]]:
    """The tool's description (or title) cut at MAX_TEXT, and every description in
    `parameters` cut in place; with what was cut ("description (200,015 characters)")."""
    cut = []
    description = (listed.description or listed.title or "").strip()
    if len(description) > MAX_TEXT:
        cut.append(f"description ({len(description):,} characters)")
        description = _cut(description)
    long = 0
    for node in walk(parameters):
        text = node.get("description")
        if isinstance(text, str) and len(text) > MAX_TEXT:
            node["description"] = _cut(text)
            long += 1
    if long:
        cut.append(f"{long} parameter description{'s' if long > 1 else ''}")
    return description, cut


def _cut(text: str) -> str:
    return text[: MAX_TEXT - 1] + "…"


def make_handler(
    connection: Connection,
    server_name: str,
    tool_name: str,
    effect: Effect,
    timeout: float,
    guard: Guard | None = None,
) -> Handler:
    def call(ctx: ToolContext, args: dict[str, Any]) -> str:
        refused = guard() if guard is not None else None
        if refused:
            raise ToolError(f"Error: {tool_name} was not run: {refused}")
        meta = {IDEMPOTENCY_META: ctx.idempotency_key} if ctx.idempotency_key else None
        if not connection.config.per_user:
            result = connection.call(
                server_name,
                args,
                tool_name=tool_name,
                timeout=ctx.time_left(timeout),
                meta=meta,
                repeatable=effect == "read",
            )
            return result_text(result, tool_name)
        deadline = time.monotonic() + ctx.time_left(timeout)
        token = ctx.access_token()  # NotConnected: the person is offered Connect
        for refresh in (True, False):
            try:
                result = connection.call(
                    server_name,
                    args,
                    tool_name=tool_name,
                    timeout=max(deadline - time.monotonic(), 0.0),
                    meta=meta,
                    repeatable=effect == "read",
                    bearer=token,
                )
                return result_text(result, tool_name)
            except Unauthorized:  # nothing ran; refreshed once, then dropped (NotConnected)
                token = ctx.access_token_refused(token, refresh=refresh)
            except InsufficientScope as short:  # nothing ran; the connection stays as it is
                config = connection.config
                raise short_of_access(
                    config.connection, config.connection_label, short.scope
                ) from None
        # refused twice, and another call had replaced the connection meanwhile
        config = connection.config
        raise NotConnected(config.connection, config.connection_label, "the server refused it")

    call.__name__ = f"{tool_name}_handler"
    return call
