"""Declaring tools: `@tool` for typed functions, `register_tool` for schema-first tools.

A typed tool's JSON schema is derived from its signature with pydantic
(`create_model`), its description from the docstring, and each parameter's
description from a Google-style `Args:` section. An optional first parameter
annotated `ToolContext` receives the trusted context and is not part of the
schema the model sees.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from typing import Annotated, Any, TypedDict, TypeVar, Unpack, get_args, get_origin, overload

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model
from pydantic import ValidationError as PydanticValidationError
from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError
from pydantic.fields import FieldInfo

from tools.context import ToolContext
from tools.decode import argument_error, canonical_json, pydantic_problems
from tools.exceptions import ToolDefinitionError
from tools.mcp.loop import run_to_end
from tools.registry import Effect, Handler, Normalizer, Reconcile, Tool, ToolRegistry
from tools.registry import registry as default_registry
from tools.schema import tidy

F = TypeVar("F", bound=Callable[..., Any])

TOOL_ATTRIBUTE = "__tool__"

_SECTION_HEADER = re.compile(
    r"^(args|arguments|params|parameters|returns?|yields?|raises|examples?|notes?|"
    r"warnings?|see also|attributes|todo|references)\s*:\s*$",
    re.IGNORECASE,
)
_PARAMETER_SECTIONS = frozenset({"args", "arguments", "params", "parameters"})
_PARAMETER_LINE = re.compile(r"^\*{0,2}([A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


class Options(TypedDict, total=False):
    """How a tool runs, the same for every way of declaring one (`@tool`, `register_tool`,
    `make_tool`). Left out, each is the `Tool` default: effect "write" (waits for an
    approval; "read" runs at once), timeout 10 s, output_cap 8,000 characters, no
    reconcile hook (for writes: what an idempotency key already produced), no connection
    (`connection="github"`: the tool acts as the person asking, with the token they
    connected for that provider, read with `ctx.access_token()`)."""

    effect: Effect
    timeout: float
    output_cap: int
    reconcile: Reconcile | None
    connection: str  # per user: the provider whose token the person must have connected


def _tool(
    name: str,
    description: str,
    parameters: dict[str, Any],
    handler: Handler,
    options: Options,
    normalizer: Normalizer | None = None,
) -> Tool:
    rest: dict[str, Any] = {key: value for key, value in options.items() if key != "effect"}
    return Tool(
        name=name,
        description=description,
        parameters=parameters,
        handler=handler,
        normalizer=normalizer,
        effect=options.get("effect", "write"),
        **rest,  # what is left out keeps Tool's default
    )


@overload
def tool(func: F, /) -> F: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    registry: ToolRegistry | None = None,
    **options: Unpack[Options],
) -> Callable[[F], F]: ...


def tool(
    func: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    registry: ToolRegistry | None = None,
    **options: Unpack[Options],
) -> F | Callable[[F], F]:
    """Declare a typed function as a tool and register it (in `registry`, default global).

    Usable bare (`@tool`, effect "write") or with options
    (`@tool(effect="read", timeout=5)`). The function is returned unchanged
    and stays callable; its `Tool` is at `func.__tool__` (see `tool_of`).
    """

    def decorate(function: F) -> F:
        declared = make_tool(function, name=name, description=description, **options)
        (registry if registry is not None else default_registry).register(declared)
        setattr(function, TOOL_ATTRIBUTE, declared)
        return function

    if func is not None:
        return decorate(func)
    return decorate


def tool_of(func: Callable[..., Any]) -> Tool:
    """The `Tool` that `@tool` made from `func`."""
    declared = getattr(func, TOOL_ATTRIBUTE, None)
    if not isinstance(declared, Tool):
        raise ToolDefinitionError(f"{func!r} was not declared with @tool")
    return declared


def register_tool(
    *,
    name: str,
    description: str,
    parameters: dict[str, Any],
    handler: Handler,
    registry: ToolRegistry | None = None,
    **options: Unpack[Options],
) -> Tool:
    """Register a schema-first tool whose arguments are validated with jsonschema.

    `handler(ctx, args)` receives the validated argument dict. If the schema
    does not say, extra top-level properties are refused
    (`additionalProperties: false` is added).
    """
    declared = _tool(
        name,
        _checked_description(name, description),
        _schema_first_parameters(name, parameters),
        handler,
        options,
    )
    return (registry if registry is not None else default_registry).register(declared)


def make_tool(
    func: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    **options: Unpack[Options],
) -> Tool:
    """Build (but do not register) the `Tool` for a typed function."""
    tool_name: str = name or str(getattr(func, "__name__", ""))
    summary, parameter_docs = parse_docstring(inspect.getdoc(func) or "")
    signature = _Signature.of(func, tool_name)
    model = signature.model(tool_name, parameter_docs)
    parameters = _model_schema(tool_name, model)
    return _tool(
        tool_name,
        _checked_description(tool_name, description or summary),
        parameters,
        signature.handler(func, model, tool_name, parameters),
        options,
        _normalizer(model, tool_name, parameters),
    )


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and Google-style `Args:` entries."""
    description: list[str] = []
    parameters: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    entry_indent: int | None = None
    for line in inspect.cleandoc(doc).splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        header = _SECTION_HEADER.match(stripped) if indent == 0 else None
        if header:
            section, current, entry_indent = header.group(1).lower(), None, None
            continue
        if section is None:
            description.append(line)
            continue
        if section not in _PARAMETER_SECTIONS or not stripped:
            continue
        if entry_indent is None:
            entry_indent = indent
        entry = _PARAMETER_LINE.match(stripped) if indent <= entry_indent else None
        if entry:
            current = entry.group(1)
            parameters[current] = entry.group(2).strip()
        elif current is not None and indent > entry_indent:
            parameters[current] = (parameters[current] + " " + stripped).strip()
    return "\n".join(description).strip(), parameters


class _Signature:
    """The parts of a function signature a tool needs."""

    def __init__(
        self,
        context: inspect.Parameter | None,
        parameters: list[tuple[inspect.Parameter, Any]],
    ) -> None:
        self.context = context
        self.parameters = parameters

    @classmethod
    def of(cls, func: Callable[..., Any], tool_name: str) -> _Signature:
        if not callable(func):
            raise ToolDefinitionError(f"tool {tool_name}: {func!r} is not callable")
        try:
            hints = inspect.get_annotations(func, eval_str=True)
        except (NameError, TypeError, SyntaxError) as error:
            raise ToolDefinitionError(
                f"tool {tool_name}: cannot resolve its type hints ({error}); "
                "define the types at module level"
            ) from error
        context: inspect.Parameter | None = None
        parameters: list[tuple[inspect.Parameter, Any]] = []
        for index, parameter in enumerate(inspect.signature(func).parameters.values()):
            hint = hints.get(parameter.name, inspect.Parameter.empty)
            if _is_context(hint):
                if index != 0:
                    raise ToolDefinitionError(
                        f"tool {tool_name}: the ToolContext parameter {parameter.name!r} "
                        "must be the first parameter"
                    )
                context = parameter
                continue
            _check_parameter(tool_name, parameter, hint)
            parameters.append((parameter, hint))
        return cls(context, parameters)

    def model(self, tool_name: str, docs: dict[str, str]) -> type[BaseModel]:
        fields: dict[str, Any] = {}
        for index, (parameter, hint) in enumerate(self.parameters):
            default = ... if parameter.default is inspect.Parameter.empty else parameter.default
            described = docs.get(parameter.name)
            if described and not _has_description(hint, default):
                info = Field(alias=parameter.name, description=described)
            else:  # a description given in code (Annotated or Field) wins over the docstring
                info = Field(alias=parameter.name)
            fields[f"p{index}"] = (Annotated[hint, info], default)
        try:
            return create_model(
                f"{tool_name}_arguments",
                __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
                **fields,
            )
        except PydanticSchemaGenerationError as error:
            raise ToolDefinitionError(self._untyped(tool_name)) from error
        except (PydanticUserError, TypeError, ValueError) as error:
            raise ToolDefinitionError(
                f"tool {tool_name}: unsupported signature: {error}"
            ) from error

    def _untyped(self, tool_name: str) -> str:
        """Which parameter has a type with no JSON schema, in one line (pydantic's own message
        suggests `arbitrary_types_allowed`, which would not help: the model needs a schema)."""
        for parameter, hint in self.parameters:
            try:
                TypeAdapter(hint)
            except PydanticSchemaGenerationError:
                name = getattr(hint, "__name__", repr(hint))
                return (
                    f"tool {tool_name}: parameter {parameter.name!r} has type {name}, which has "
                    "no JSON schema; use str, int, float, bool, a list or dict of them, a "
                    "Literal, an Enum, a TypedDict, a dataclass or a pydantic model"
                )
        return f"tool {tool_name}: a parameter's type has no JSON schema"

    def handler(
        self,
        func: Callable[..., Any],
        model: type[BaseModel],
        tool_name: str,
        schema: dict[str, Any],
    ) -> Handler:
        names = [
            (f"p{index}", parameter.name) for index, (parameter, _) in enumerate(self.parameters)
        ]
        context = self.context

        def call(ctx: ToolContext, args: dict[str, Any]) -> Any:
            values = _validated(model, args, tool_name, schema)
            kwargs = {name: getattr(values, field) for field, name in names}
            if context is None:
                result = func(**kwargs)
            elif context.kind is inspect.Parameter.KEYWORD_ONLY:
                result = func(**{context.name: ctx}, **kwargs)
            else:
                result = func(ctx, **kwargs)
            if inspect.iscoroutine(result):
                result = run_to_end(result)
            return result

        call.__name__ = f"{tool_name}_handler"
        call.__wrapped__ = func  # type: ignore[attr-defined]
        return call


def _has_description(hint: Any, default: Any) -> bool:
    metadata = get_args(hint)[1:] if get_origin(hint) is Annotated else ()
    infos = [item for item in (*metadata, default) if isinstance(item, FieldInfo)]
    return any(info.description for info in infos)


def _is_context(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, ToolContext)


def _check_parameter(tool_name: str, parameter: inspect.Parameter, hint: Any) -> None:
    if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        raise ToolDefinitionError(
            f"tool {tool_name}: *args/**kwargs ({parameter.name!r}) cannot be described "
            "by a strict schema; declare explicit parameters"
        )
    if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise ToolDefinitionError(
            f"tool {tool_name}: parameter {parameter.name!r} is positional-only; "
            "tool arguments are passed by name"
        )
    if hint is inspect.Parameter.empty:
        raise ToolDefinitionError(
            f"tool {tool_name}: parameter {parameter.name!r} needs a type annotation"
        )


def _model_schema(tool_name: str, model: type[BaseModel]) -> dict[str, Any]:
    try:
        raw = model.model_json_schema(by_alias=True)
    except (PydanticUserError, TypeError, ValueError) as error:
        raise ToolDefinitionError(
            f"tool {tool_name}: cannot derive a JSON schema from its signature: {error}"
        ) from error
    schema = tidy(raw)
    ordered: dict[str, Any] = {
        "type": "object",
        "properties": schema.pop("properties", {}),
        "required": schema.pop("required", []),
        "additionalProperties": False,
    }
    schema.pop("type", None)
    schema.pop("additionalProperties", None)
    ordered.update(schema)
    return ordered


def _validated(
    model: type[BaseModel], args: dict[str, Any], tool_name: str, schema: dict[str, Any]
) -> BaseModel:
    try:
        text = canonical_json(args)
    except (TypeError, ValueError) as error:
        raise argument_error(
            tool_name, [f"arguments must be JSON values ({error})"], schema
        ) from None
    try:
        return model.model_validate_json(text, strict=True)
    except PydanticValidationError as error:
        raise argument_error(tool_name, pydantic_problems(error), schema) from None


def _normalizer(model: type[BaseModel], tool_name: str, schema: dict[str, Any]) -> Normalizer:
    def normalize(args: dict[str, Any]) -> dict[str, Any]:
        values = _validated(model, args, tool_name, schema)
        return values.model_dump(mode="json", by_alias=True)

    return normalize


def _checked_description(name: str, description: str) -> str:
    if not isinstance(description, str) or not description.strip():
        raise ToolDefinitionError(
            f"tool {name}: a description is required (write a docstring or pass description=)"
        )
    return description.strip()


def _schema_first_parameters(name: str, parameters: object) -> dict[str, Any]:
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ToolDefinitionError(
            f"tool {name}: parameters must be an object schema like "
            '{"type": "object", "properties": {...}, "required": [...]}'
        )
    try:
        schema: dict[str, Any] = json.loads(json.dumps(parameters, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise ToolDefinitionError(
            f"tool {name}: parameters must be plain JSON ({error})"
        ) from error
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    schema.setdefault("additionalProperties", False)
    properties, required = schema["properties"], schema["required"]
    if isinstance(properties, dict) and isinstance(required, list):
        unknown = [key for key in required if key not in properties]
        if unknown and schema["additionalProperties"] is False:
            raise ToolDefinitionError(
                f"tool {name}: required names {unknown} are not in properties, "
                "so no call could ever be valid"
            )
    return schema
