"""What a hostile MCP server supplies is bounded, and what cannot be checked is refused at
start-up (issue 21, items 5 and 6, and a name that collides with a built-in). Real parts:
a real MCP server over stdio (tests/support/mcp_hostile_server.py), the real start-up path
(`build_runtime`, `switchboard worker`), the openai client against the fake model server.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

import tools.mcp
from switchboard.settings import Config
from switchboard.wiring import build_runtime
from tests.fakes.openai_server import FakeOpenAI
from tests.support.mcp_servers import stdio_hostile, write_config
from tests.support.processes import ROOT, worker_env
from tests.support.runtime import ALICE, work
from tools import register_tool
from tools.exceptions import ArgumentError, McpServerError, ToolDefinitionError
from tools.registry import ToolRegistry, registry
from tools.schema_check import schema_problem
from worker import service
from worker.run import RunStatus
from worker.runtime import Runtime

Build = Callable[..., Runtime]


@pytest.fixture
def build(redis_conn: redis.Redis, model_server: FakeOpenAI) -> Iterator[Build]:
    """Start-up as the bot and every worker do it, from a servers file."""
    files: list[Path] = []

    def build_from(mcp_file: Path, tool_modules: str = "") -> Runtime:
        config = Config(
            SWITCHBOARD_MCP=str(mcp_file),
            SWITCHBOARD_TOOLS=tool_modules,
            OPENAI_BASE_URL=model_server.url,
            OPENAI_API_KEY="test",
            SWITCHBOARD_MODEL="gpt-fake",
        )
        runtime = build_runtime(config, redis_conn)
        files.append(mcp_file)
        return runtime

    yield build_from
    for path in files:
        tools.mcp.unload(tools.mcp.load(path))


# -- item 5: texts are bounded ------------------------------------------------------------


def test_a_200000_character_description_is_cut_in_what_the_model_is_sent(
    build: Build, model_server: FakeOpenAI, notes_dir: Path, tmp_path: Path
) -> None:
    path = write_config(tmp_path / "mcp.yaml", {"long": stdio_hostile(notes_dir, "long")})
    with capture_logs() as logs:
        rt = build(path)
    model_server.route("anything", ["Nothing to flip."])
    run = service.submit(rt, "anything to flip?", ALICE)
    work(rt)
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    sent = model_server.last_chat_request["tools"]
    [spec] = [t["function"] for t in sent if t["function"]["name"] == "long_flip_write"]
    assert len(spec["description"]) == 2000 and spec["description"].endswith("x…")
    assert spec["description"].startswith("Flip a switch. xxx")
    target = spec["parameters"]["properties"]["target"]
    assert len(target["description"]) == 2000
    assert len(json.dumps(spec)) < 5000  # it was 400 KB, sent with every request
    cut = [e for e in logs if e["event"] == "mcp_text_cut"]
    assert [(e["server"], e["tool"], e["cut"]) for e in cut] == [
        ("long", "long_flip_write", ["description (200,015 characters)", "1 parameter description"])
    ]


# -- item 6: schemas that cannot be checked ---------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        (
            "loop",
            "has `$ref`s that loop without going into any argument (#/$defs/b → "
            "#/$defs/b/allOf/0 → #/$defs/a → #/$defs/b)",
        ),
        ("deep", "nests subschemas more than 32 levels deep"),
    ],
)
def test_a_schema_that_cannot_be_checked_is_refused_at_start_up_in_one_line(
    mode: str, problem: str, build: Build, notes_dir: Path, tmp_path: Path
) -> None:
    path = write_config(tmp_path / "mcp.yaml", {"bad": stdio_hostile(notes_dir, mode)})
    with pytest.raises(McpServerError) as caught:
        build(path)
    assert str(caught.value) == (
        f"MCP server 'bad' ({path} line 2): tool bad_flip_write: its input schema cannot be "
        f"checked: it {problem}; fix the server's schema, or leave the tool out with `tools:`"
    )
    assert registry.get("bad_flip_write") is None


@pytest.mark.slow
def test_a_worker_given_a_looping_ref_stops_at_start_up_with_one_line(
    redis_url: str, model_server: FakeOpenAI, notes_dir: Path, tmp_path: Path
) -> None:
    path = write_config(tmp_path / "mcp.yaml", {"bad": stdio_hostile(notes_dir, "loop")})
    env = worker_env(redis_url, model_server.url, tmp_path, SWITCHBOARD_MCP=str(path))
    done = subprocess.run(
        [sys.executable, "-m", "switchboard", "worker"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("switchboard:")]
    assert lines == [
        f"switchboard: MCP server 'bad' ({path} line 2): tool bad_flip_write: its input schema "
        "cannot be checked: it has `$ref`s that loop without going into any argument "
        "(#/$defs/b → #/$defs/b/allOf/0 → #/$defs/a → #/$defs/b); fix the server's schema, or "
        "leave the tool out with `tools:`"
    ]
    assert "RecursionError" not in done.stderr + done.stdout


def test_a_python_tool_whose_schema_loops_is_refused_when_declared() -> None:
    with pytest.raises(ToolDefinitionError) as caught:
        register_tool(
            name="looping",
            description="Loops.",
            parameters={"type": "object", "$ref": "#"},
            handler=lambda ctx, args: "",
            registry=ToolRegistry(),
        )
    assert str(caught.value) == (
        "tool looping: its parameters schema cannot be checked: it has `$ref`s that loop "
        "without going into any argument (# → #)"
    )


# Schemas made of `$ref`s between a few definitions, in place (allOf/anyOf/not) or into a
# property or an item, and arguments up to the decoder's depth: whatever is declared can
# check any arguments without RecursionError, even from deep in a caller's stack.
NAMES = ("a", "b", "c")
_leaf = st.sampled_from([{"type": "string"}, {"type": "object"}, {}, {"type": "array"}])


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    ref = st.sampled_from([{"$ref": f"#/$defs/{n}"} for n in NAMES])
    return st.recursive(
        _leaf | ref,
        lambda inner: st.one_of(
            st.lists(inner, min_size=1, max_size=3).map(lambda xs: {"allOf": xs}),
            st.lists(inner, min_size=1, max_size=3).map(lambda xs: {"anyOf": xs}),
            inner.map(lambda x: {"not": x}),
            inner.map(lambda x: {"type": "object", "properties": {"p": x}}),
            inner.map(lambda x: {"type": "array", "items": x}),
        ),
        max_leaves=6,
    )


_arguments = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.just("p"), inner, max_size=1),
    max_leaves=20,
)


def _deep(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = {"p": value}
    return value


def _from_deep_in_the_stack(depth: int, call: Callable[[], Any]) -> Any:
    return call() if depth == 0 else _from_deep_in_the_stack(depth - 1, call)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    definitions=st.fixed_dictionaries({n: _schemas() for n in NAMES}),
    root=_schemas(),
    arguments=_arguments,
    levels=st.integers(0, 14),
)
def test_a_declared_schema_never_makes_checking_arguments_recurse_too_deep(
    definitions: dict[str, Any], root: dict[str, Any], arguments: Any, levels: int
) -> None:
    parameters = {"type": "object", "properties": {"p": root}, "$defs": definitions}
    try:
        tool = register_tool(
            name="t",
            description="d",
            parameters=parameters,
            handler=lambda ctx, args: "",
            registry=ToolRegistry(),
        )
    except ToolDefinitionError:
        return  # refused when declared: nothing will ever check arguments against it
    value = {"p": _deep(arguments, levels)}  # at most the decoder's 16 levels
    with contextlib.suppress(ArgumentError):  # refused, with a message: fine
        _from_deep_in_the_stack(150, lambda: tool.validate(value))


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["$ref", "allOf", "properties", "items", "$defs", "not", "p", "type"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(schema=st.dictionaries(st.sampled_from(["$ref", "allOf", "properties", "$defs"]), _json))
def test_the_schema_check_answers_for_any_json_and_never_recurses(schema: dict[str, Any]) -> None:
    problem = schema_problem(schema)
    assert problem is None or isinstance(problem, str)


def test_a_schema_nested_far_past_the_recursion_limit_is_refused_without_recursing() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(5000):  # far past Python's recursion limit, as JSON a server could send
        deep = {"allOf": [deep]}
    assert schema_problem({"type": "object", "properties": {"p": deep}}) == (
        "nests subschemas more than 32 levels deep"
    )


# -- names that collide ------------------------------------------------------------------------


def test_an_mcp_tool_named_like_a_built_in_is_refused_at_start_up_in_one_line(
    build: Build, notes_dir: Path, tmp_path: Path
) -> None:
    """The server's `create_ticket` says it is read-only; the built-in one is a write. The
    server does not get the name, and the built-in stays what it was."""
    path = write_config(
        tmp_path / "mcp.yaml", {"c": stdio_hostile(notes_dir, "collide", prefix="")}
    )
    with pytest.raises(McpServerError) as caught:
        build(path, tool_modules="tools.builtin")
    assert str(caught.value) == (
        f"MCP server 'c' ({path} line 2): its tool 'create_ticket' has the name of a tool from "
        "module tools.builtin.tickets; tool names must be unique: set `prefix:` for the "
        "server, or leave the tool out with `tools:`"
    )
    builtin = registry.get("create_ticket")
    assert builtin is not None
    assert (builtin.effect, builtin.source) == ("write", "module tools.builtin.tickets")


def test_two_stdio_servers_with_one_tool_name_are_refused_at_start_up_in_one_line(
    build: Build, notes_dir: Path, tmp_path: Path
) -> None:
    one, two = (stdio_hostile(notes_dir, "flip", prefix="") for _ in range(2))
    path = write_config(tmp_path / "mcp.yaml", {"one": one, "two": two})
    with pytest.raises(McpServerError) as caught:
        build(path)
    assert str(caught.value) == (
        f"MCP server 'two' ({path} line 10): its tool 'flip_write' has the name of a tool of "
        f"MCP server 'one' ({path} line 2); give one of them another `prefix:`"
    )
    assert registry.get("flip_write") is None
