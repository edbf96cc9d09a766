"""The ledger package's shape: no import circle (lazy imports count), small modules, no
sibling package, and event kinds named through ``EventKind`` only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ledger.events import EventKind

LEDGER = Path(__file__).resolve().parent.parent / "ledger"
MAX_LINES = 400
FORBIDDEN_ROOTS = {"ray", "torch", "orchestrator", "actors"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(LEDGER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(LEDGER.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """Every module imported anywhere in the file (top level, in functions, under
    TYPE_CHECKING): ``from ledger import audit`` counts as ``ledger.audit``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    return {
        name: {imported for imported in _imports(path) if imported in MODULES} - {name}
        for name, path in MODULES.items()
    }


def test_no_import_circle_between_ledger_modules():
    graph = _graph()
    # A package's __init__ re-exports its modules; edges into a package are what a circle needs.
    for package in ("ledger", "ledger.cli"):
        graph[package] = set()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_small_and_imports_no_sibling_package(name: str):
    path = MODULES[name]
    assert len(path.read_text().splitlines()) <= MAX_LINES, f"{path} is over {MAX_LINES} lines"
    roots = {imported.split(".")[0] for imported in _imports(path)}
    assert not roots & FORBIDDEN_ROOTS, f"{name} imports {sorted(roots & FORBIDDEN_ROOTS)}"


def test_event_kinds_are_named_through_event_kind_only():
    kinds = {kind.value for kind in EventKind}
    named: list[str] = []
    for name, path in MODULES.items():
        if name == "ledger.events":
            continue  # where EventKind spells them
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in kinds:
                named.append(f"{name}:{node.lineno}: {node.value!r}")
    assert named == []
