"""The layout rules of DESIGN section 2 (docs/DESIGN.md), checked on the source: package
arrows, no import circles (lazy and TYPE_CHECKING imports count), module and folder sizes, and
event kinds spelled only through ``EventKind``. The project's one architecture checker."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.events import EventKind

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ledger", "orchestrator", "actors")
MAX_MODULE_LINES = 400  # DESIGN section 2: "no module over 400 lines"
MAX_MODULES_PER_FOLDER = 12  # "no folder with more than ~10 modules"


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every project module ``name`` imports, wherever the import statement is."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import module`` imports the module; ``from pkg import name`` the pkg.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


GRAPH = {name: set(_imports(name, path)) for name, path in MODULES.items()}


def test_ledger_imports_no_ray_torch_or_sibling_package() -> None:
    forbidden = ("ray", "torch", "orchestrator", "actors", "megatron")
    offenders = []
    for name, path in MODULES.items():
        if not name.startswith("ledger"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            roots = []
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                roots = [node.module.split(".")[0]]
            offenders += [f"{name} imports {root}" for root in roots if root in forbidden]
    assert offenders == []


def test_rollout_path_imports_neither_control_plane_drills_nor_actors() -> None:
    offenders = [
        f"{name} -> {target}"
        for name, targets in GRAPH.items() if name.startswith("orchestrator.rollout")
        for target in targets
        if target.startswith(("orchestrator.control", "orchestrator.drills", "actors"))
    ]
    assert offenders == []


def test_actors_import_only_the_ledger_and_rollout_contracts() -> None:
    offenders = [
        f"{name} -> {target}"
        for name, targets in GRAPH.items() if name.startswith("actors")
        for target in targets
        if target.startswith("orchestrator") and not target.startswith("orchestrator.rollout")
    ]
    assert offenders == []


def _find_cycle() -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(GRAPH[node]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle_between_project_modules() -> None:
    assert _find_cycle() is None


def test_the_cycle_finder_finds_a_planted_circle(monkeypatch: pytest.MonkeyPatch) -> None:
    planted = {name: set(targets) for name, targets in GRAPH.items()}
    planted["ledger.errors"].add("ledger.store")
    monkeypatch.setattr(f"{__name__}.GRAPH", planted)
    cycle = _find_cycle()
    assert cycle is not None and "ledger.errors" in cycle


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_small(name: str) -> None:
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines"


def test_no_folder_holds_more_than_about_ten_modules() -> None:
    folders: dict[Path, int] = {}
    for path in MODULES.values():
        if path.name != "__init__.py":
            folders[path.parent] = folders.get(path.parent, 0) + 1
    crowded = {str(f.relative_to(ROOT)): n for f, n in folders.items()
               if n > MAX_MODULES_PER_FOLDER}
    assert crowded == {}


def test_event_kinds_are_spelled_through_event_kind_only() -> None:
    """A kind written as a bare string in the ledger drifts from the enum unnoticed."""
    kinds = {kind.value for kind in EventKind}
    named = [
        f"{name}:{node.lineno}: {node.value!r}"
        for name, path in MODULES.items()
        if name.startswith("ledger") and name != "ledger.events"  # where EventKind spells them
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value in kinds
    ]
    assert named == []
