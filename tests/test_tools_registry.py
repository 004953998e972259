"""The registry, SWITCHBOARD_TOOLS module loading and idempotent built-in loading."""

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import tools
import tools.builtin
from tools.declare import make_tool
from tools.exceptions import DuplicateToolError, ToolModuleError
from tools.registry import ToolRegistry, load_modules, registry

BUILTIN_NAMES = [
    "calculate",
    "knowledge_lookup",
    "search_tickets",
    "create_ticket",
    "update_ticket",
    "close_ticket",
]


def double(x: int) -> int:
    """Double a number."""
    return 2 * x


def test_registry_basics() -> None:
    local = ToolRegistry()
    first = make_tool(double, effect="read")
    assert local.register(first) is first
    assert local.register(first) is first  # the same object again is a no-op
    assert local.get("double") is first
    assert local.get("missing") is None
    assert "double" in local and first in local and "missing" not in local
    assert local.names() == ["double"]
    assert list(local) == [first] and len(local) == 1
    with pytest.raises(DuplicateToolError, match="'double' is already registered"):
        local.register(make_tool(double, effect="read"))
    assert local.unregister("double") is first
    assert local.unregister("double") is None
    assert len(local) == 0


def test_builtin_load_is_idempotent() -> None:
    local = ToolRegistry()
    assert tools.builtin.load(local) == BUILTIN_NAMES
    assert tools.builtin.load(local) == BUILTIN_NAMES
    assert local.names() == BUILTIN_NAMES


def test_importing_the_builtins_registers_nothing_listing_them_does() -> None:
    local = ToolRegistry()
    importlib.import_module("tools.builtin.tickets")
    load_modules(["tools.builtin.calculator"], local)  # its TOOLS: just the calculator
    assert local.names() == ["calculate"]
    load_modules("tools.builtin", local)  # SWITCHBOARD_TOOLS=tools.builtin
    assert local.names() == BUILTIN_NAMES


def test_reimporting_builtins_does_not_raise() -> None:
    local = ToolRegistry()
    tools.builtin.load(local)
    importlib.reload(tools.builtin.calculator)
    importlib.reload(tools.builtin)
    load_modules(["tools.builtin", "tools.builtin"], local)
    assert local.names() == BUILTIN_NAMES


def test_a_different_tool_with_a_builtin_name_conflicts_and_the_error_names_both() -> None:
    local = ToolRegistry()

    def calculate(expression: str) -> str:
        """Not the real calculator."""
        return expression

    local.register(make_tool(calculate, effect="read"))
    with pytest.raises(DuplicateToolError) as caught:
        tools.builtin.load(local)
    assert str(caught.value).startswith(
        f"a tool named 'calculate' is already registered by module {__name__}; "
        "module tools.builtin.calculator declares one too."
    )


def test_an_operators_tool_named_like_a_builtin_loads_when_builtins_are_not_asked_for(
    module_dir: Path,
) -> None:
    (module_dir / "sb_test_retail.py").write_text(
        textwrap.dedent(
            """
            from tools import register_tool
            from tools.registry import ToolRegistry

            LOCAL = ToolRegistry()
            register_tool(
                name="calculate",
                description="The retail benchmark's calculator.",
                parameters={"type": "object", "properties": {"expression": {"type": "string"}}},
                effect="read",
                handler=lambda ctx, args: "0",
                registry=LOCAL,
            )
            TOOLS = tuple(LOCAL)
            """
        )
    )
    local = ToolRegistry()
    load_modules("sb_test_retail", local)
    assert local.names() == ["calculate"]
    found = local.get("calculate")
    assert found is not None and found.source == "module sb_test_retail"


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in list(sys.modules):
        if name.startswith("sb_test_"):
            del sys.modules[name]
    for name in ("sb_test_lookup",):
        registry.unregister(name)


def test_load_modules_imports_and_registers(module_dir: Path) -> None:
    (module_dir / "sb_test_good.py").write_text(
        textwrap.dedent(
            '''
            from tools import tool

            @tool(effect="read")
            def sb_test_lookup(name: str) -> str:
                """Look a name up."""
                return name
            '''
        ),
        encoding="utf-8",
    )
    load_modules(" sb_test_good , ,")
    declared = registry.get("sb_test_lookup")
    assert declared is not None and declared.effect == "read"


def test_a_missing_module_is_named(module_dir: Path) -> None:
    with pytest.raises(ToolModuleError) as caught:
        load_modules(["sb_test_absent"])
    message = str(caught.value)
    assert "could not import tool module 'sb_test_absent'" in message
    assert "ModuleNotFoundError" in message


def test_a_module_that_fails_on_import_is_named_with_the_cause(module_dir: Path) -> None:
    (module_dir / "sb_test_broken.py").write_text(
        "raise RuntimeError('the database password is not set')\n", encoding="utf-8"
    )
    with pytest.raises(ToolModuleError) as caught:
        load_modules(["sb_test_broken"])
    assert "'sb_test_broken'" in str(caught.value)
    assert "RuntimeError: the database password is not set" in str(caught.value)
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_a_module_with_a_bad_declaration_is_named(module_dir: Path) -> None:
    (module_dir / "sb_test_bad_tool.py").write_text(
        "from tools import tool\n\n@tool\ndef nameless(x):\n    '''Doc.'''\n",
        encoding="utf-8",
    )
    with pytest.raises(ToolModuleError, match=r"sb_test_bad_tool.*needs a type annotation"):
        load_modules(["sb_test_bad_tool"])
