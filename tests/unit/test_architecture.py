"""The house's shape (ARCHITECTURE.md): no import cycle between modules. The layers are `lint-imports`'s
([tool.importlinter] in pyproject.toml), which `make test` runs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("training_platform", "training_platform_dagster", "assets", "resources", "sensors")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), imports inside functions and TYPE_CHECKING
    blocks included: a cycle closed by a function-level import is still a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(module: str) -> None:
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
                groups.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return groups


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert len(graph.modules) > 200  # the packages were found
    assert _cycles(graph) == []


def test_a_cycle_is_found():
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert _cycles(graph) == [["pkg.a", "pkg.b"]]


def test_the_root_holds_only_the_base_and_the_contract():
    library = ROOT / "training_platform"
    modules = sorted(path.stem for path in library.glob("*.py") if path.stem != "__init__")
    assert modules == ["errors", "hardware", "identifiers", "paths", "redaction"]
    packages = {path.parent.name for path in library.glob("*/__init__.py")}
    assert {"spec", "shipped"} <= packages


def test_every_package_has_its_layer():
    """A new package is placed in a layer, not left out of the check."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [contract["layers"] for contract in config["contracts"] if contract["type"] == "layers"]
    layered = {name.strip() for layer in layers for name in re.split(r"[:|]", layer)}
    library = {f"training_platform.{path.parent.name}" for path in (ROOT / "training_platform").glob("*/__init__.py")}
    modules = {f"training_platform.{path.stem}" for path in (ROOT / "training_platform").glob("*.py")}
    assert library - {"training_platform.shipped"} <= layered  # shipped/ holds data files, no code
    assert modules - {"training_platform.__init__"} <= layered
    assert {"training_platform_dagster", "assets", "resources", "sensors"} <= layered
