"""Declaring tools: schema derivation from typed signatures and schema-first tools."""

import asyncio
import enum
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from tools import ToolContext, register_tool, tool
from tools.declare import make_tool, tool_of
from tools.exceptions import ArgumentError, DuplicateToolError, ToolDefinitionError
from tools.registry import Tool, ToolRegistry
from tools.registry import registry as global_registry
from tools.schema import walk

CTX = ToolContext(user_id="U123", team_id="T1", channel_id="C1", roles=frozenset({"everyone"}))


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class LineItem(BaseModel):
    title: str
    quantity: int = 1


def create_order(
    ctx: ToolContext,
    customer: str,
    items: list[LineItem],
    color: Color = Color.RED,
    speed: Literal["slow", "fast"] = "slow",
    note: str | None = None,
    weight: float = 1.0,
    count: Annotated[int, Field(ge=1, le=5)] = 1,
) -> dict[str, Any]:
    """Create an order for a customer.

    Orders are shipped the next working day.

    Args:
        customer: The customer's account name,
            as shown on the invoice.
        items (list[LineItem]): What to ship.
        speed: Shipping speed.

    Returns:
        The order.
    """
    return {
        "user": ctx.user_id,
        "customer": customer,
        "items": items,
        "color": color,
        "speed": speed,
        "note": note,
        "weight": weight,
        "count": count,
    }


@pytest.fixture
def order_tool() -> Tool:
    return make_tool(create_order, effect="write")


def test_schema_is_derived_from_the_signature(order_tool: Tool) -> None:
    schema = order_tool.parameters
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert list(schema["properties"]) == [
        "customer",
        "items",
        "color",
        "speed",
        "note",
        "weight",
        "count",
    ]
    assert schema["required"] == ["customer", "items"]
    assert "ctx" not in schema["properties"]


def test_descriptions_come_from_the_docstring(order_tool: Tool) -> None:
    assert order_tool.description == (
        "Create an order for a customer.\n\nOrders are shipped the next working day."
    )
    properties = order_tool.parameters["properties"]
    assert properties["customer"]["description"] == (
        "The customer's account name, as shown on the invoice."
    )
    assert properties["items"]["description"] == "What to ship."
    assert properties["speed"]["description"] == "Shipping speed."
    assert "description" not in properties["weight"]


def test_defaults_literals_and_constraints_are_in_the_schema(order_tool: Tool) -> None:
    properties = order_tool.parameters["properties"]
    assert properties["speed"] == {
        "default": "slow",
        "description": "Shipping speed.",
        "enum": ["slow", "fast"],
        "type": "string",
    }
    assert properties["weight"] == {"default": 1.0, "type": "number"}
    assert properties["count"]["minimum"] == 1
    assert properties["count"]["maximum"] == 5
    assert properties["note"]["default"] is None


def test_nested_models_are_closed_and_titles_are_removed(order_tool: Tool) -> None:
    schema = order_tool.parameters
    line_item = schema["$defs"]["LineItem"]
    assert line_item["additionalProperties"] is False
    # a *property* named "title" survives; the "title" annotations do not
    assert "title" in line_item["properties"]
    for node in walk(schema):
        assert not isinstance(node.get("title"), str)
    assert schema["$defs"]["Color"]["enum"] == ["red", "blue"]


def test_handler_receives_python_values_and_the_context(order_tool: Tool) -> None:
    args = order_tool.validate(
        {"customer": "acme", "items": [{"title": "bolt", "quantity": 3}], "color": "blue"}
    )
    result = order_tool.handler(CTX, args)
    assert result["user"] == "U123"
    assert result["items"] == [LineItem(title="bolt", quantity=3)]
    assert result["color"] is Color.BLUE
    assert result["weight"] == 1.0


def test_validate_fills_defaults_and_returns_json_values(order_tool: Tool) -> None:
    args = order_tool.validate({"customer": "acme", "items": [{"title": "bolt"}], "weight": 2})
    assert args == {
        "customer": "acme",
        "items": [{"title": "bolt", "quantity": 1}],
        "color": "red",
        "speed": "slow",
        "note": None,
        "weight": 2.0,
        "count": 1,
    }


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"customer": "acme"}, "missing required parameter 'items'"),
        ({"customer": 5, "items": []}, "'customer' must be string (got integer)"),
        ({"customer": "a", "items": [], "count": "2"}, "'count' must be integer (got string)"),
        ({"customer": "a", "items": [], "count": True}, "'count' must be integer (got boolean)"),
        ({"customer": "a", "items": [], "count": 9}, "'count'"),
        ({"customer": "a", "items": [], "speed": "warp"}, "'speed' must be one of"),
        ({"customer": "a", "items": [], "extra": 1}, "unknown parameter 'extra'"),
        (
            {"customer": "a", "items": [{"title": "x", "sku": 1}]},
            "unknown field 'sku' in 'items[0]'",
        ),
    ],
)
def test_validation_is_strict(order_tool: Tool, args: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ArgumentError) as caught:
        order_tool.validate(args)
    message = str(caught.value)
    assert fragment in message
    assert message.startswith("Invalid arguments for create_order:")
    assert "customer (string, required)" in message


def test_openai_spec_is_strict_only_when_every_property_is_required(order_tool: Tool) -> None:
    def add(a: int, b: float) -> float:
        """Add two numbers."""
        return a + b

    strict = make_tool(add, effect="read")
    assert strict.openai_spec() == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
    assert "strict" not in order_tool.openai_spec()["function"]


def test_no_parameters_gives_an_empty_strict_schema() -> None:
    def ping() -> str:
        """Say pong."""
        return "pong"

    declared = make_tool(ping, effect="read")
    assert declared.parameters == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }
    assert declared.strict


def test_bare_decorator_defaults_to_write_and_keeps_the_function() -> None:
    local = ToolRegistry()

    @tool(registry=local)
    def delete_everything(reason: str) -> str:
        """Delete everything."""
        return "deleted because " + reason

    declared = local.get("delete_everything")
    assert declared is not None
    assert declared.effect == "write"
    assert tool_of(delete_everything) is declared
    assert delete_everything("tests") == "deleted because tests"


def test_bare_decorator_registers_in_the_global_registry() -> None:
    @tool
    def tmp_bare_tool_for_tests(x: int) -> int:
        """Double x."""
        return x * 2

    try:
        declared = global_registry.get("tmp_bare_tool_for_tests")
        assert declared is not None and declared.effect == "write"
        assert tmp_bare_tool_for_tests(2) == 4
    finally:
        global_registry.unregister("tmp_bare_tool_for_tests")


def test_decorator_options() -> None:
    local = ToolRegistry()

    def reconcile(ctx: ToolContext, args: dict[str, Any]) -> None:
        return None

    @tool(effect="read", timeout=3, output_cap=500, name="lookup-v2", registry=local)
    def lookup(ctx: ToolContext, key: str) -> str:
        """Look something up."""
        return key

    @tool(registry=local, reconcile=reconcile, description="Explicit description.")
    def write_it(value: int) -> int:
        return value

    declared = local.get("lookup-v2")
    assert declared is not None
    assert (declared.effect, declared.timeout, declared.output_cap) == ("read", 3, 500)
    written = local.get("write_it")
    assert written is not None
    assert written.reconcile is reconcile
    assert written.description == "Explicit description."


def test_duplicate_names_are_refused() -> None:
    local = ToolRegistry()

    def first(x: int) -> int:
        """First."""
        return x

    tool(registry=local, name="same")(first)
    with pytest.raises(DuplicateToolError, match="'same' is already registered"):
        tool(registry=local, name="same")(first)


def test_async_tools_run_to_completion() -> None:
    async def slow_echo(text: str) -> str:
        """Echo text."""
        await asyncio.sleep(0)
        return text

    declared = make_tool(slow_echo, effect="read")
    assert declared.handler(CTX, {"text": "hi"}) == "hi"


def test_keyword_only_context_parameter() -> None:
    def who(*, ctx: ToolContext, greeting: str) -> str:
        """Greet."""
        return f"{greeting} {ctx.user_id}"

    declared = make_tool(who, effect="read")
    assert list(declared.parameters["properties"]) == ["greeting"]
    assert declared.handler(CTX, {"greeting": "hi"}) == "hi U123"


def test_parameter_names_that_shadow_pydantic_attributes_work() -> None:
    def shadow(schema: str, json: int, model_config: bool = False) -> list[Any]:
        """Names pydantic models use themselves."""
        return [schema, json, model_config]

    declared = make_tool(shadow, effect="read")
    assert declared.parameters["required"] == ["schema", "json"]
    assert declared.handler(CTX, {"schema": "s", "json": 1}) == ["s", 1, False]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x):\n    '''Doc.'''", "needs a type annotation"),
        ("def f(*args: int):\n    '''Doc.'''", "*args/**kwargs"),
        ("def f(**kw: int):\n    '''Doc.'''", "*args/**kwargs"),
        ("def f(x: int, /):\n    '''Doc.'''", "positional-only"),
        ("def f(x: int, ctx: ToolContext):\n    '''Doc.'''", "must be the first parameter"),
        ("def f(x: int):\n    pass", "a description is required"),
        ("def f(x: 'Missing'):\n    '''Doc.'''", "cannot resolve its type hints"),
    ],
)
def test_bad_declarations_fail_with_a_clear_message(source: str, message: str) -> None:
    namespace: dict[str, Any] = {"ToolContext": ToolContext}
    exec(source, namespace)
    with pytest.raises(ToolDefinitionError, match=message.replace("*", r"\*")):
        make_tool(namespace["f"])


def test_bad_names_effects_and_limits_are_refused() -> None:
    def f(x: int) -> int:
        """Doc."""
        return x

    with pytest.raises(ToolDefinitionError, match="name"):
        make_tool(f, name="has space")
    with pytest.raises(ToolDefinitionError, match="effect"):
        make_tool(f, effect="delete")  # type: ignore[arg-type]
    with pytest.raises(ToolDefinitionError, match="timeout"):
        make_tool(f, timeout=0)
    with pytest.raises(ToolDefinitionError, match="output_cap"):
        make_tool(f, output_cap=10)


# -- schema-first tools ----------------------------------------------------------

ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "description": "The order to cancel."},
        "reason": {"type": "string", "enum": ["customer", "fraud"]},
    },
    "required": ["order_id"],
}


def test_register_tool_validates_with_jsonschema() -> None:
    local = ToolRegistry()
    seen: list[dict[str, Any]] = []
    declared = register_tool(
        name="cancel_order",
        description="Cancel a pending order.",
        parameters=ORDER_SCHEMA,
        effect="write",
        handler=lambda ctx, args: seen.append(args) or "cancelled",  # type: ignore[func-returns-value]
        registry=local,
    )
    assert local.get("cancel_order") is declared
    assert declared.parameters["additionalProperties"] is False
    assert "additionalProperties" not in ORDER_SCHEMA  # the caller's dict is not changed
    assert declared.validate({"order_id": "A1"}) == {"order_id": "A1"}
    with pytest.raises(ArgumentError, match="'reason' must be one of"):
        declared.validate({"order_id": "A1", "reason": "boredom"})
    with pytest.raises(ArgumentError, match="unknown parameter 'x'"):
        declared.validate({"order_id": "A1", "x": 1})
    assert declared.handler(CTX, {"order_id": "A1"}) == "cancelled"
    assert not declared.strict


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "string"},
        {"properties": {}},
        [],
        {"type": "object", "properties": {"x": {"type": "banana"}}},
        {"type": "object", "properties": {}, "required": ["ghost"]},
    ],
)
def test_register_tool_refuses_non_object_or_broken_schemas(parameters: Any) -> None:
    with pytest.raises(ToolDefinitionError, match="cancel_order"):
        register_tool(
            name="cancel_order",
            description="Cancel.",
            parameters=parameters,
            effect="write",
            handler=lambda ctx, args: None,
            registry=ToolRegistry(),
        )


def test_schema_first_default_effect_is_write() -> None:
    declared = register_tool(
        name="ping",
        description="Ping.",
        parameters={"type": "object", "properties": {}},
        handler=lambda ctx, args: "pong",
        registry=ToolRegistry(),
    )
    assert declared.effect == "write"
    assert declared.strict


def test_descriptions_written_in_code_win_over_the_docstring() -> None:
    def described(
        a: Annotated[int, Field(description="From Annotated.", ge=0)],
        b: int = Field(default=3, description="From Field."),
        c: Annotated[str, Field(max_length=3)] = "x",
    ) -> int:
        """Doc.

        Args:
            a: From the docstring.
            b: From the docstring.
            c: From the docstring.
        """
        return a

    properties = make_tool(described).parameters["properties"]
    assert properties["a"] == {"description": "From Annotated.", "minimum": 0, "type": "integer"}
    assert properties["b"]["description"] == "From Field."
    assert properties["c"] == {
        "default": "x",
        "description": "From the docstring.",
        "maxLength": 3,
        "type": "string",
    }


def test_a_parameter_of_an_ordinary_class_is_one_clear_line() -> None:
    class Order:
        pass

    def refund(order: Order) -> str:
        """Refund an order.

        Args:
            order: The order.
        """
        return "ok"

    with pytest.raises(ToolDefinitionError) as caught:
        make_tool(refund, effect="write")
    message = str(caught.value)
    assert "parameter 'order' has type Order, which has no JSON schema" in message
    assert "\n" not in message and "arbitrary_types_allowed" not in message
