"""Running tools: timeouts, errors, serialization and output caps."""

import dataclasses
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from typing import Any

import pytest

from tools import Observation, Tool, ToolContext, ToolRegistry, execute, make_tool, register_tool
from tools.execute import cap_text

CTX = ToolContext(user_id="U1", call_id="call_1")


def schema_tool(handler: Any, **options: Any) -> Tool:
    return register_tool(
        name="t",
        description="Test tool.",
        parameters={"type": "object", "properties": {}},
        handler=handler,
        registry=ToolRegistry(),
        **options,
    )


def test_a_string_result_is_the_observation() -> None:
    observation = execute(schema_tool(lambda ctx, args: f"hello {ctx.user_id}"), CTX, {})
    assert observation == Observation(ok=True, text="hello U1", truncated=False, value="hello U1")


def test_other_results_become_compact_json_and_keep_the_value() -> None:
    result = {"fee": 1999, "tags": ["a", "é"], "ok": True, "none": None}
    observation = execute(schema_tool(lambda ctx, args: result), CTX, {})
    assert observation.text == '{"fee":1999,"tags":["a","é"],"ok":true,"none":null}'
    assert observation.value == result


def test_odd_types_are_serialized_with_str_and_have_no_value() -> None:
    @dataclasses.dataclass
    class Point:
        x: int

    observation = execute(
        schema_tool(lambda ctx, args: {"day": date(2024, 5, 1), "p": Point(1), "s": {3}}), CTX, {}
    )
    assert observation.ok
    assert observation.text == '{"day":"2024-05-01","p":{"x":1},"s":[3]}'
    assert observation.value is None


def test_exceptions_become_error_observations() -> None:
    def boom(ctx: ToolContext, args: dict[str, Any]) -> str:
        raise ValueError("ticket #7 does not exist")

    observation = execute(schema_tool(boom), CTX, {})
    assert observation == Observation(ok=False, text="Error: ValueError: ticket #7 does not exist")


def test_error_text_is_bounded() -> None:
    def boom(ctx: ToolContext, args: dict[str, Any]) -> str:
        raise RuntimeError("x" * 1_000_000)

    observation = execute(schema_tool(boom), CTX, {})
    assert not observation.ok
    assert observation.text.startswith("Error: RuntimeError: xxx")
    assert len(observation.text) <= 1000


def test_even_system_exit_in_a_tool_is_an_observation() -> None:
    def leave(ctx: ToolContext, args: dict[str, Any]) -> str:
        raise SystemExit(3)

    observation = execute(schema_tool(leave), CTX, {})
    assert observation.text == "Error: SystemExit: 3"


@pytest.mark.parametrize("use_executor", [False, True])
def test_a_slow_tool_times_out(use_executor: bool) -> None:
    release = threading.Event()
    started = threading.Event()

    def stuck(ctx: ToolContext, args: dict[str, Any]) -> str:
        started.set()
        release.wait(30)
        return "too late"

    tool = schema_tool(stuck, timeout=0.2)
    pool = ThreadPoolExecutor(max_workers=1) if use_executor else None
    try:
        observation = execute(tool, CTX, {}, executor=pool)
    finally:
        release.set()
        if pool is not None:
            pool.shutdown(wait=True)
    assert started.is_set()
    assert observation == Observation(ok=False, text="Error: t timed out after 0.2 s")


def test_the_executor_is_used_when_given() -> None:
    names: list[str] = []

    def where(ctx: ToolContext, args: dict[str, Any]) -> str:
        names.append(threading.current_thread().name)
        return "ok"

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolpool") as pool:
        assert execute(schema_tool(where), CTX, {}, executor=pool).ok
    assert names[0].startswith("toolpool")


def test_long_output_is_truncated_with_a_note() -> None:
    observation = execute(schema_tool(lambda ctx, args: "x" * 5000, output_cap=200), CTX, {})
    assert observation.ok and observation.truncated
    assert len(observation.text) <= 200
    body, note = observation.text.rsplit("\n", 1)
    match = re.fullmatch(r"\[truncated: showed (\d+) of 5000 characters\]", note)
    assert match is not None
    assert int(match.group(1)) == len(body)
    assert set(body) == {"x"}


def test_output_at_the_cap_is_not_truncated() -> None:
    observation = execute(schema_tool(lambda ctx, args: "y" * 100, output_cap=100), CTX, {})
    assert observation.text == "y" * 100
    assert not observation.truncated


@pytest.mark.parametrize("cap", [100, 101, 150, 999, 1000, 8000])
@pytest.mark.parametrize("length", [1001, 10_000, 123_456])
def test_cap_text_never_exceeds_the_cap(cap: int, length: int) -> None:
    text, truncated = cap_text("z" * length, cap)
    assert len(text) <= cap
    if length <= cap:
        assert not truncated and text == "z" * length
        return
    assert truncated
    shown = int(re.findall(r"showed (\d+) of", text)[0])
    assert text.startswith("z" * shown + "\n[truncated")


def test_typed_tools_run_with_validated_arguments() -> None:
    def add(ctx: ToolContext, a: int, b: int = 2) -> int:
        """Add."""
        return a + b

    tool = make_tool(add, effect="read")
    assert execute(tool, CTX, tool.validate({"a": 40})).text == "42"
    bad = execute(tool, CTX, {"a": "40"})
    assert not bad.ok
    assert bad.text.startswith("Error: ArgumentError: Invalid arguments for add: 'a'")


def test_lone_surrogates_in_output_are_replaced() -> None:
    observation = execute(schema_tool(lambda ctx, args: "bad \ud800 char"), CTX, {})
    observation.text.encode("utf-8")
    assert observation.text == "bad ? char"
