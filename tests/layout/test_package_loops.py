"""Inside each package of src/prorl_server, the modules' imports form no loop.

test_layers.py checks the units against each other; this checks the modules of one top-level package (its
subpackages' too) among themselves. Only what runs when a module is imported counts: imports at module
level, in class bodies and in `if`, `try` and `with` blocks; not those inside functions, nor under `if
TYPE_CHECKING:` (how a type-only or late import is meant to be written). `from package import name` counts
as an import of the submodule `package.name` when there is one, else of the package's `__init__.py`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_layers import SRC, Import, _find_loop, _imported_modules, _lazy_exports


def _packages() -> list[Path]:
    return sorted(p for p in SRC.iterdir() if (p / "__init__.py").is_file())


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return ast.unparse(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _run_on_import(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The statements of `body` that run when the module is imported, nested blocks included; no function
    bodies, no `if TYPE_CHECKING:` branch (its `else:` runs)."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _run_on_import(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _run_on_import(getattr(node, field, []))


def _targets(node: ast.AST, package: list[str], modules: set[str], exports: dict[str, str]) -> list[str]:
    """The modules of `modules` that `node` imports (a name imported from a package: its submodule if any)."""
    found = []
    for module in _imported_modules(node, package, exports):
        if isinstance(node, ast.ImportFrom):
            names = [f"{module}.{alias.name}" for alias in node.names]
            submodules = [name for name in names if name in modules]
            found += submodules
            if module in modules and len(submodules) < len(names):
                found.append(module)
        elif module in modules:
            found.append(module)
    return found


def _edges(package_dir: Path) -> dict[str, dict[str, Import]]:
    """Module -> imported module -> the first such import, among the modules of one package."""
    paths = {_module_name(path): path for path in sorted(package_dir.rglob("*.py"))}
    exports = _lazy_exports()
    edges: dict[str, dict[str, Import]] = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in _run_on_import(ast.parse(path.read_text(), str(path)).body):
            for target in _targets(node, package, set(paths), exports):
                if target != name:
                    imp = Import(str(path.relative_to(SRC.parent)), node.lineno, ast.unparse(node), name, target)
                    edges.setdefault(name, {}).setdefault(target, imp)
    return edges


@pytest.mark.parametrize("package_dir", _packages(), ids=lambda p: p.name)
def test_the_modules_of_a_package_import_each_other_in_no_loop(package_dir: Path):
    edges = _edges(package_dir)
    loop = _find_loop(edges)
    assert loop is None, (
        f"a loop of module-level imports inside {package_dir.name}/: "
        + " -> ".join(loop or [])
        + "\n"
        + "\n".join(f"  {edges[a][b]}" for a, b in zip(loop or [], (loop or [])[1:], strict=False))
        + "\nbreak it: move what both need into a module of its own that imports neither"
    )


def test_the_reader_counts_only_what_runs_on_import():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from prorl_server.sandbox import base, Runtime\n"
        "from . import spec\n"
        "import prorl_server.sandbox.slot\n"
        "if TYPE_CHECKING:\n"
        "    from prorl_server.sandbox.snapshot import Snapshot\n"
        "else:\n"
        "    from prorl_server.sandbox.reaper import reap\n"
        "try:\n"
        "    from prorl_server.sandbox.cgroups import available\n"
        "except ImportError:\n"
        "    from prorl_server.sandbox.limits import SandboxLimits\n"
        "class C:\n"
        "    from prorl_server.sandbox.bwrap import BwrapRuntime\n"
        "def f():\n"
        "    from prorl_server.sandbox.podman import PodmanRuntime\n"
    )
    modules = {_module_name(path) for path in (SRC / "sandbox").rglob("*.py")}
    found = [
        target
        for node in _run_on_import(ast.parse(source).body)
        for target in _targets(node, ["prorl_server", "sandbox"], modules, _lazy_exports())
    ]
    assert found == [
        "prorl_server.sandbox.base",
        "prorl_server.sandbox",  # Runtime, a name of the package's __init__
        "prorl_server.sandbox.spec",
        "prorl_server.sandbox.slot",
        "prorl_server.sandbox.reaper",
        "prorl_server.sandbox.cgroups",
        "prorl_server.sandbox.limits",
        "prorl_server.sandbox.bwrap",
    ]


def test_a_loop_is_found_and_named():
    edges: dict[str, dict[str, Import]] = {"a": {}, "b": {}, "c": {}}
    for source, target in [("a", "b"), ("b", "c"), ("c", "a")]:
        edges[source][target] = Import("x.py", 1, f"import {target}", source, target)
    assert _find_loop(edges) == ["a", "b", "c", "a"]
