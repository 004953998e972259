"""Running tools: timeouts, errors, serialization and output caps."""

import dataclasses
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from tools import ToolContext, ToolError, register_tool
from tools.declare import make_tool
from tools.execute import Observation, cap_text, execute
from tools.registry import Tool, ToolRegistry

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
    assert observation == Observation(ok=True, text="hello U1", truncated=False)


def test_other_results_become_compact_json() -> None:
    result = {"fee": 1999, "tags": ["a", "é"], "ok": True, "none": None}
    observation = execute(schema_tool(lambda ctx, args: result), CTX, {})
    assert observation.text == '{"fee":1999,"tags":["a","é"],"ok":true,"none":null}'


def test_odd_types_are_serialized_with_str() -> None:
    @dataclasses.dataclass
    class Point:
        x: int

    observation = execute(
        schema_tool(lambda ctx, args: {"day": date(2024, 5, 1), "p": Point(1), "s": {3}}), CTX, {}
    )
    assert observation.ok
    assert observation.text == '{"day":"2024-05-01","p":{"x":1},"s":[3]}'


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
def test_a_slow_tool_times_out_and_a_write_says_its_outcome_is_unknown(
    use_executor: bool,
) -> None:
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
    assert observation == Observation(
        ok=False,
        text="Error: t timed out after 0.2 s; its outcome is unknown (it may have taken "
        "effect) and it was not retried",
    )


def test_a_slow_read_times_out() -> None:
    release = threading.Event()
    tool = schema_tool(lambda ctx, args: release.wait(30), timeout=0.1, effect="read")
    try:
        assert execute(tool, CTX, {}) == Observation(
            ok=False, text="Error: t timed out after 0.1 s"
        )
    finally:
        release.set()


def test_the_runs_deadline_cuts_the_timeout_but_leaves_a_second() -> None:
    release = threading.Event()
    tool = schema_tool(lambda ctx, args: release.wait(30), timeout=20, effect="read")
    soon = dataclasses.replace(CTX, deadline=time.monotonic() - 5)  # already past
    started = time.monotonic()
    try:
        observation = execute(tool, soon, {})
    finally:
        release.set()
    assert observation.text == "Error: t timed out after 1 s"
    assert 0.9 < time.monotonic() - started < 5
    assert CTX.time_left(20) == 20  # no deadline: the tool's own timeout
    later = dataclasses.replace(CTX, deadline=time.monotonic() + 3)
    assert 2 < later.time_left(20) <= 3 and later.time_left(0.5) == 0.5


def test_a_tool_error_reaches_the_model_as_written_without_a_traceback() -> None:
    def refuse(ctx: ToolContext, args: dict[str, Any]) -> str:
        raise ToolError("No order 42 exists; list orders with list_orders first.")

    observation = execute(schema_tool(refuse, output_cap=100), CTX, {})
    assert observation == Observation(
        ok=False, text="No order 42 exists; list orders with list_orders first."
    )


LOGGED = """
from tools import ToolContext, ToolError, register_tool
from tools.execute import execute
from tools.registry import ToolRegistry

def refuse(ctx, args):
    raise {error}("no order 42")

tool = register_tool(name="t", description="T.", parameters={{"type": "object"}},
                     handler=refuse, registry=ToolRegistry())
print(execute(tool, ToolContext(user_id="U1"), {{}}).text)
"""


@pytest.mark.parametrize(
    ("error", "event", "traceback"),
    [("ToolError", "tool_error", False), ("KeyError", "tool_failed", True)],
)
def test_only_unexpected_errors_are_logged_with_a_traceback(
    error: str, event: str, traceback: bool
) -> None:
    """In a fresh process: this one's structlog may cache loggers, which capture_logs
    cannot see into."""
    out = subprocess.run(
        [sys.executable, "-c", LOGGED.format(error=error)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    ).stdout
    assert event in out
    assert ("Traceback" in out) is traceback
    last = out.strip().splitlines()[-1]
    assert last == ("no order 42" if error == "ToolError" else "Error: KeyError: 'no order 42'")


def test_a_long_tool_error_is_capped_like_any_output() -> None:
    def refuse(ctx: ToolContext, args: dict[str, Any]) -> str:
        raise ToolError("x" * 500)

    observation = execute(schema_tool(refuse, output_cap=100), CTX, {})
    assert not observation.ok and observation.truncated and len(observation.text) <= 100


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
