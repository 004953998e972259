"""The architecture, checked: the import-linter contracts in pyproject.toml (packages depend
one way; nothing below the use-case layer imports it; surfaces reach the stores only
through it), that those contracts bite, that surfaces do not reach past the layer through
the runtime's attributes either, and that no product module imports itself back."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tools", "approvals", "worker", "evals", "bot", "switchboard")
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"

# The surfaces: they parse their input, call worker.service and render what it returns.
SURFACES = [
    *sorted((ROOT / "bot").rglob("*.py")),
    *sorted((ROOT / "evals").rglob("*.py")),
    *(
        ROOT / "switchboard" / name
        for name in (
            "console.py",
            "render.py",
            "runs_cli.py",
            "approvals_cli.py",
            "demos_cli.py",
            "eval_cli.py",
            "status_cli.py",
        )
    ),
]
# What the runtime holds that only the use-case layer may use.
RUNTIME_INTERNALS = {"store", "approvals", "events", "ledger", "policy", "limits", "leases"}


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LINT],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_import_contracts_hold() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "3 kept, 0 broken" in result.stdout


def test_a_listener_importing_a_store_breaks_the_contract(tmp_path: Path) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    listener = tmp_path / "bot" / "listeners" / "actions.py"
    listener.write_text(listener.read_text() + "\nfrom worker.store import RunStore  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "bot is not allowed to import worker.store" in result.stdout
    assert "bot.listeners.actions -> worker.store" in result.stdout


def reaches_past_the_layer(source: str) -> list[str]:
    """`x.rt.store`, `rt.policy`, `runtime.events`...: a surface using what the runtime
    holds instead of asking the use-case layer."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and node.attr in RUNTIME_INTERNALS):
            continue
        holder = node.value
        name = holder.attr if isinstance(holder, ast.Attribute) else getattr(holder, "id", "")
        if name in ("rt", "runtime"):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_surfaces_reach_the_runtime_only_through_the_use_case_layer() -> None:
    found = {
        str(path.relative_to(ROOT)): hits
        for path in SURFACES
        if (hits := reaches_past_the_layer(path.read_text()))
    }
    assert found == {}


def test_the_attribute_check_bites() -> None:
    assert reaches_past_the_layer("sb.rt.store.find(run_id)\nrt.policy.rule('x')\n") == [
        "line 1: sb.rt.store",
        "line 2: rt.policy",
    ]
    assert reaches_past_the_layer("runs.find(sb.rt, run_id)\nself.rt.redis.ping()\n") == []


def import_cycles() -> list[list[str]]:
    """Strongly connected groups of product modules, counting every import: at module
    level, inside functions (deferred) and under TYPE_CHECKING."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm; the graph is ~150 modules
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_no_product_module_imports_itself_back() -> None:
    assert import_cycles() == []
