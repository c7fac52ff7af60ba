"""Each top-level package of src/prorl_server shows one face: its `__init__`. A module outside package P (of
src/prorl_server, or of the plugin package handlers/src/prorl_handlers) imports P's names from
`prorl_server.P`, never from `prorl_server.P.<module>`; and every name it imports from `prorl_server.P` is in
P's `__all__` (or is a subpackage or module of P).

Every import counts, read with ast as test_layers.py reads them: at module level, inside functions, and under
`if TYPE_CHECKING:`. Modules inside P import their siblings directly. The tests under tests/ are not checked:
they may reach into internals to test them.
"""

from __future__ import annotations

import ast

from repo_paths import REPO
from test_layers import SRC

HANDLERS_SRC = REPO / "handlers" / "src" / "prorl_handlers"

EXCEPTIONS: dict[str, str] = {
    "tool_server": "its modules run in the sandbox from a copy holding only the root, _version.py, errors.py and "
    "tool_server/ (sandbox/apptainer.py's stage_tool_packages): its `__init__` imports nothing, so the server "
    "starts fast and loads no host-side client there",
    # not yet converted (issue 37, item 2): each still imported from its modules by other packages
}
"""Packages whose modules other packages may import from directly, each with why."""


def _packages() -> set[str]:
    return {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}


def _own_package(path) -> str | None:
    """The top-level package of src/prorl_server `path` belongs to (None: the root, or prorl_handlers)."""
    if not path.is_relative_to(SRC):
        return None
    parts = path.relative_to(SRC).parts
    return parts[0] if len(parts) > 1 else None


def _offences() -> list[str]:
    packages = _packages()
    found = []
    for path in sorted([*SRC.rglob("*.py"), *HANDLERS_SRC.rglob("*.py")]):
        own = _own_package(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [(node.module, ", ".join(a.name for a in node.names))]
            elif isinstance(node, ast.Import):
                modules = [(a.name, "") for a in node.names]
            else:
                continue
            for module, names in modules:
                parts = module.split(".")
                if parts[0] != "prorl_server" or len(parts) < 3 or parts[1] not in packages:
                    continue
                package = parts[1]
                if package == own or package in EXCEPTIONS:
                    continue
                statement = f"from {module} import {names}" if names else f"import {module}"
                found.append(
                    f"{path.relative_to(REPO)}:{node.lineno}: {statement} -> import them from "
                    f"prorl_server.{package} (add them to its __all__)"
                )
    return found


def _all(package: str) -> set[str]:
    """The package's `__all__`, read from its `__init__`."""
    for node in ast.parse((SRC / package / "__init__.py").read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(getattr(t, "id", None) == "__all__" for t in targets):
            return set(ast.literal_eval(node.value))
    return set()


def _unexported() -> list[str]:
    """`from prorl_server.P import names` outside P where a name is not in P's `__all__`."""
    packages = _packages()
    found = []
    for path in sorted([*SRC.rglob("*.py"), *HANDLERS_SRC.rglob("*.py")]):
        own = _own_package(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            parts = node.module.split(".")
            if len(parts) != 2 or parts[0] != "prorl_server" or parts[1] not in packages or parts[1] == own:
                continue
            exported = _all(parts[1])
            subpackages = {p.stem for p in (SRC / parts[1]).iterdir()}
            missing = [a.name for a in node.names if a.name not in exported and a.name not in subpackages]
            if missing:
                found.append(
                    f"{path.relative_to(REPO)}:{node.lineno}: {', '.join(missing)} not in {node.module}.__all__"
                )
    return found


def test_other_packages_import_from_the_package_init():
    found = _offences()
    assert not found, "imports reaching into another package's modules:\n" + "\n".join(found)


def test_what_other_packages_import_from_an_init_is_in_its_all():
    found = _unexported()
    assert not found, "names imported from a package's __init__ that its __all__ lacks:\n" + "\n".join(found)


def test_exceptions_are_packages_with_a_reason():
    unknown = sorted(set(EXCEPTIONS) - _packages())
    assert not unknown, f"EXCEPTIONS names no package: {unknown}"
    assert all(reason.strip() for reason in EXCEPTIONS.values())
