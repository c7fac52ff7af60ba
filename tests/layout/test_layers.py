"""The top-level subpackages of prorl_server form layers: no import runs up a layer and none closes a loop.

Every import counts, read from the source with ast: at module level, inside functions, and under `if
TYPE_CHECKING:`. A unit is a top-level subpackage (`gateway/`) or module (`config.py`) of src/prorl_server.
The package root (`prorl_server/__init__.py`) is no unit: it re-exports `__version__` and names the public
API, loaded on first use; `from prorl_server import JobContext` counts as an import of the unit that defines it.
Nor is `_version.py` (`__version__` alone, importing nothing): part of the root, any layer may import it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass

from repo_paths import REPO

SRC = REPO / "src" / "prorl_server"
ROOT_MODULES = {"__init__", "_version"}
"""Modules of src/prorl_server that belong to the package root, not to a unit."""

LAYERS: list[tuple[str, set[str]]] = [
    (
        "wire schemas and leaf modules",
        {
            "protocol",
            "tool_call_formats",
            "request_body",
            "disconnect",
            "auth_key",
            "errors",
            "tool_server",
            "tools",
            "vllm_cpu",
            "process_gc",
            "threadsafe",
        },
    ),
    ("scheduling and per-action resources", {"scheduling", "actions"}),
    ("configuration", {"config"}),
    ("runtimes: sandboxes and LLM backends", {"sandbox", "llm"}),
    ("image building", {"imaging"}),
    ("the gateway", {"gateway"}),
    ("the handler API", {"handlers"}),
    ("the agent loop and the job pipeline", {"agent", "pipeline"}),
    ("the results journal and observability", {"journal", "observability"}),
    ("the HTTP API", {"api"}),
    ("the dev engine, the simulator and the test doubles", {"devllm", "simllm", "testing"}),
    ("the trainer's side", {"client", "training"}),
    ("entry points", {"cli", "settings_cli", "launch", "prewarm", "backend_profiler", "evaluation"}),
]
"""Lowest first. A unit imports units of its own layer or of lower ones; within a layer, no loop."""


@dataclass(frozen=True)
class Import:
    path: str  # the importing module, relative to src/
    line: int
    statement: str
    source: str  # the importing unit
    target: str  # the imported unit

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: `{self.statement}` ({self.source} -> {self.target})"


def _units() -> set[str]:
    return {
        p.stem if p.is_file() else p.name
        for p in SRC.iterdir()
        if (p.suffix == ".py" and p.stem not in ROOT_MODULES) or (p / "__init__.py").is_file()
    }


def _lazy_exports() -> dict[str, str]:
    """The root's public names and the modules that define them (its `_EXPORTS`)."""
    for node in ast.walk(ast.parse((SRC / "__init__.py").read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("prorl_server/__init__.py has no _EXPORTS")


def _imported_modules(node: ast.AST, package: list[str], exports: dict[str, str]) -> list[str]:
    """The dotted modules `node` imports (none for a node that is no import)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package[: len(package) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    if module != "prorl_server":
        return [module]
    modules = []
    for alias in node.names:  # from the root: a unit, a lazily exported name, or the root's own constant
        if alias.name in _units():
            modules.append(f"prorl_server.{alias.name}")
        elif alias.name in exports:
            modules.append(exports[alias.name])
    return modules


def _imports() -> list[Import]:
    exports = _lazy_exports()
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if len(rel.parts) == 1 and rel.stem in ROOT_MODULES:
            continue
        source = rel.parts[0].removesuffix(".py")
        package = ["prorl_server", *rel.parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for module in _imported_modules(node, package, exports):
                parts = module.split(".")
                if parts[0] != "prorl_server" or len(parts) < 2 or parts[1] in (source, *ROOT_MODULES):
                    continue
                statement = ast.unparse(node)
                found.append(Import(str(path.relative_to(SRC.parent)), node.lineno, statement, source, parts[1]))
    return found


def _layer_of() -> dict[str, int]:
    return {unit: index for index, (_, units) in enumerate(LAYERS) for unit in units}


def test_every_unit_is_in_exactly_one_layer():
    placed = [unit for _, units in LAYERS for unit in units]
    twice = sorted({unit for unit in placed if placed.count(unit) > 1})
    assert not twice, f"in more than one layer of LAYERS: {twice}"
    missing = sorted(_units() - set(placed))
    assert not missing, f"top-level units of src/prorl_server in no layer: {missing}; place each in LAYERS"
    gone = sorted(set(placed) - _units())
    assert not gone, f"LAYERS names units src/prorl_server does not have: {gone}"


def test_no_import_runs_up_a_layer():
    layer_of = _layer_of()
    upward = [imp for imp in _imports() if layer_of[imp.target] > layer_of[imp.source]]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(
        f"  {imp}: {LAYERS[layer_of[imp.source]][0]!r} imports {LAYERS[layer_of[imp.target]][0]!r}" for imp in upward
    )


def test_the_units_import_graph_has_no_loop():
    edges: dict[str, dict[str, Import]] = defaultdict(dict)
    for imp in _imports():
        edges[imp.source].setdefault(imp.target, imp)
    loop = _find_loop(edges)
    assert loop is None, (
        "a loop of imports between units: "
        + " -> ".join(loop or [])
        + "\n"
        + "\n".join(f"  {edges[a][b]}" for a, b in zip(loop or [], (loop or [])[1:], strict=False))
    )


def _find_loop(edges: dict[str, dict[str, Import]]) -> list[str] | None:
    """A loop as units [a, b, ..., a], or None (depth-first search, colouring the units on the path)."""
    on_path: list[str] = []
    done: set[str] = set()

    def visit(unit: str) -> list[str] | None:
        if unit in on_path:
            return [*on_path[on_path.index(unit) :], unit]
        if unit in done:
            return None
        on_path.append(unit)
        for target in sorted(edges.get(unit, {})):
            loop = visit(target)
            if loop is not None:
                return loop
        on_path.pop()
        done.add(unit)
        return None

    for unit in sorted(edges):
        loop = visit(unit)
        if loop is not None:
            return loop
    return None


def test_the_version_module_imports_nothing():
    """Every layer may import `_version.py`, and pyproject.toml reads its `__version__` without running it."""
    tree = ast.parse((SRC / "_version.py").read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not {p.stem for p in SRC.glob("_*.py")} - ROOT_MODULES, "a private module of the root not in ROOT_MODULES"


def test_the_checks_see_every_kind_of_import():
    """The parser counts imports in functions, under TYPE_CHECKING, relative ones and names from the root."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import base\n"
        "from ..gateway import sessions\n"
        "if TYPE_CHECKING:\n"
        "    from prorl_server.api.state import ServerState\n"
        "def f():\n"
        "    import prorl_server.journal.lock\n"
        "    from prorl_server import JobContext, __version__\n"
    )
    exports = _lazy_exports()
    modules = [
        module
        for node in ast.walk(ast.parse(source))
        for module in _imported_modules(node, ["prorl_server", "handlers"], exports)
    ]
    assert sorted(modules) == sorted(
        [
            "typing",
            "prorl_server.handlers",
            "prorl_server.gateway",
            "prorl_server.api.state",
            "prorl_server.journal.lock",
            "prorl_server.handlers",
        ]
    )
