"""The shape of the code, checked mechanically: the pipeline's layers, the two import rules of the child scripts,
no import cycle, small modules, and a package list that ships every package.

Imports are read from the source (every `import` statement, at the top or inside a function), so a lazy import
counts like any other.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

from mcp_server.children.contract import COMPILE_MODES as CHILD_COMPILE_MODES
from mcp_server.schema.types import COMPILE_MODES

ENGINE_ROOTS = ("mcp_server", "plugins")
CHILDREN = "mcp_server.children"
# Lowest first. A module may import its own group and the groups of lower ranks; groups of one rank stand apart
# (capture and assemble sit on either side of the run directory). Names match a module or the package above it.
LAYERS: dict[int, tuple[str, ...]] = {
    0: ("mcp_server.errors", "mcp_server.children.contract"),
    1: ("mcp_server.progress", "mcp_server.schema", "mcp_server.data"),
    2: ("plugins",),
    3: ("mcp_server.process", "mcp_server.rundir", "mcp_server.loop"),
    4: ("mcp_server.backend",),  # the protocol both sides of the run directory read; the registry is above them
    5: ("mcp_server.capture", "mcp_server.assemble"),
    6: ("mcp_server.backends",),  # each backend's adapter names its capture and assemble halves; the registry
    7: ("mcp_server.queries", "mcp_server.analysis", "mcp_server.compare", "mcp_server.proof", "mcp_server.preflight",
        "mcp_server.cli_text", "mcp_server.ranks", "mcp_server.memory"),
    8: ("mcp_server.render",),
    9: ("mcp_server.api",),
    10: ("mcp_server.serve",),  # the MCP face: its tools (serve.app) and registry call the facade
    11: ("mcp_server.cli",),
    12: ("mcp_server.__main__",),
}
ROOT_PACKAGE = "mcp_server"  # its __init__ holds the version only: any module may import it
MAX_LINES = 500
LONGER_ALLOWED = {"mcp_server/cli.py"}  # the CLI face: one parser for every subcommand
CHILD_THIRD_PARTY = {"torch", "numpy"}  # numpy only where torch's own RNG seeding reaches for it


def _modules() -> dict[str, Path]:
    found = {}
    for root in ENGINE_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every module `name` imports (a package's submodule when `from package import submodule`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
            yield from subs or [base]


IMPORTS = {name: set(_imports(name, path)) for name, path in MODULES.items()}


def _group(module: str) -> tuple[int, str] | None:
    matches = [(rank, group) for rank, groups in LAYERS.items() for group in groups
               if module == group or module.startswith(group + ".")]
    return max(matches, key=lambda m: len(m[1])) if matches else None


def _is_engine(module: str) -> bool:
    return module.split(".")[0] in ENGINE_ROOTS


def test_every_engine_module_has_a_place_in_the_layers():
    unplaced = [m for m in MODULES if m != ROOT_PACKAGE and _group(m) is None and not m.startswith(CHILDREN)]
    assert not unplaced, f"add these modules to a layer of LAYERS: {unplaced}"


def test_no_module_imports_a_module_above_it_or_beside_it():
    wrong = []
    for module, imported in IMPORTS.items():
        if module == ROOT_PACKAGE or (module.startswith(CHILDREN) and _group(module) is None):
            continue  # the children are checked below
        rank, group = _group(module) or (0, module)
        for target in sorted(t for t in imported if _is_engine(t) and t != ROOT_PACKAGE):
            placed = _group(target)
            if placed is None:
                wrong.append(f"{module} imports {target}, which no engine module may import")
            elif placed[1] != group and placed[0] >= rank:
                wrong.append(f"{module} (layer {rank}) imports {target} (layer {placed[0]})")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    graph = {m: {t for t in imported if t in MODULES and t != m} for m, imported in IMPORTS.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert not cycles, cycles


def test_children_import_only_the_standard_library_torch_and_each_other():
    wrong = []
    for module, imported in IMPORTS.items():
        if not module.startswith(CHILDREN):
            continue
        for target in sorted(imported):
            top = target.split(".")[0]
            allowed = (
                top in sys.stdlib_module_names or top in CHILD_THIRD_PARTY or target.startswith(CHILDREN)
                or target in (ROOT_PACKAGE, "_operator_profiler_child", "__future__")
            )
            if not allowed:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "the children run under the workload's interpreter, without the engine:\n" + "\n".join(wrong)


def test_no_module_outside_the_children_imports_torch():
    wrong = [f"{module} imports {target}" for module, imported in IMPORTS.items() if not module.startswith(CHILDREN)
             for target in imported if target.split(".")[0] == "torch"]
    hooks = [f"hooks/{path.name} imports {target}" for path in (REPO / "hooks").glob("*.py")
             for target in _imports(path.stem, path) if target.split(".")[0] == "torch"]
    assert not wrong + hooks, "the engine never imports torch (the workload's interpreter has it):\n" + "\n".join(
        wrong + hooks)


def test_engine_modules_stay_small():
    long = {str(p.relative_to(REPO)): n for p in MODULES.values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert set(long) <= LONGER_ALLOWED, f"split these modules (over {MAX_LINES} lines): {long}"


def test_pyproject_ships_every_package_and_the_data_folders():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    mapped = set(config["package-dir"])
    assert set(config["packages"]) == packages | mapped
    assert {config["package-dir"][m] for m in mapped} == {"knowledge", "prompts"}


def test_the_engine_and_the_harness_know_the_same_compile_modes():
    assert COMPILE_MODES == CHILD_COMPILE_MODES


SHARED_NAMES = {
    # A file name may repeat only where each file is one layer's side of the same subject: its schema (the
    # model), its engine, its child process (children/), its face (api/), its renderer (render/) or a backend's
    # adapter (backends/).
    "attribute.py": {"assemble", "memory"},  # attribution of kernels, and of allocations, to operators
    "build.py": {"ranks", "memory"},  # each builds its derived file (ranks.json, memory.json)
    "common.py": {"api", "children"},  # each package's shared helpers
    "documents.py": {"api", "render"},  # the documents verb's face and its renderer
    "harness.py": {"children", "schema"},  # the harness child and its result's model
    "loop.py": {"api", "schema"},  # loop status: its face and its model
    "measure.py": {"children", "proof"},  # the isolated measurement: its child and the engine reading it
    "memory.py": {"capture", "children", "render", "schema"},  # the memory pass at each layer
    "nsys.py": {"assemble", "backends"},  # the nsys + ncu backend: its assembler and its adapter
    "proof.py": {"api", "schema"},  # bench/recipes/validate: their face and their models
    "recipes.py": {"proof", "schema"},  # the frontier: its engine and its model
    "torch_profiler.py": {"assemble", "backends"},  # the torch.profiler backend: its assembler and its adapter
    "validate.py": {"children", "proof"},  # validation: its child and its engine
}


def test_a_file_name_names_one_subject():
    """Two modules share a file name only as the sides of one subject listed above: a new clash is named here."""
    folders: dict[str, set[str]] = {}
    for path in (REPO / "mcp_server").rglob("*.py"):
        if path.name != "__init__.py":
            folders.setdefault(path.name, set()).add(path.parent.name)
    shared = {name: where for name, where in folders.items() if len(where) > 1}
    assert shared == SHARED_NAMES
