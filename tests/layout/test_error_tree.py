"""One exception root: every exception class of src/prorl_server and handlers/src is a ProrlError, and the
tree drawn in prorl_server/errors.py's docstring is the tree the classes form (each class under its parent,
with the builtins it keeps)."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import prorl_handlers
import pytest

import prorl_server
import prorl_server.client
from prorl_server import errors
from prorl_server.errors import ProrlError, error_kind_of

PACKAGES = (prorl_server, prorl_handlers)
LINE = re.compile(
    r"^(?P<prefix>(?:[│ ]   )*(?:[├└]── )?)(?P<name>\w+)(?P<here> \*)?(?: \[(?P<keeps>[\w, ]+)\])?(?: \.+ .*)?$"
)
"""One line of the drawn tree: `│   ├── Name * [Builtin, ...] ..... where`."""


@dataclass(frozen=True)
class Drawn:
    name: str
    parent: str | None
    keeps: tuple[str, ...]  # the second bases shown in brackets
    here: bool  # marked * (an area root defined in prorl_server/errors.py)


def _modules() -> tuple[list[object], dict[str, BaseException]]:
    """Every module of the packages, imported, and those that cannot be (an optional dependency missing)."""
    imported, failed = [], {}
    for package in PACKAGES:
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            try:
                imported.append(importlib.import_module(info.name))
            except ImportError as exc:
                failed[info.name] = exc
    return imported, failed


def _exception_classes() -> list[type[BaseException]]:
    modules, _ = _modules()
    return sorted(
        {
            value
            for module in modules
            for value in vars(module).values()
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__
        },
        key=lambda cls: (cls.__module__, cls.__qualname__),
    )


def _drawn() -> list[Drawn]:
    """The docstring's tree, from its `ProrlError` line to the first blank line."""
    lines = errors.__doc__.splitlines()
    start = lines.index("ProrlError")
    parents: list[str] = []
    drawn = []
    for line in lines[start:]:
        if not line.strip():
            break
        match = LINE.match(line)
        assert match, f"a line of the tree is not `prefix Name [Builtins] ... where`: {line!r}"
        depth = len(match["prefix"]) // 4
        del parents[depth:]
        keeps = tuple(k.strip() for k in match["keeps"].split(",")) if match["keeps"] else ()
        drawn.append(Drawn(match["name"], parents[-1] if parents else None, keeps, bool(match["here"])))
        parents.append(match["name"])
    return drawn


def _as_drawn(cls: type[BaseException]) -> Drawn:
    """How `cls` must be drawn: under its first ProrlError base, with its other bases but Exception."""
    parent = next((base for base in cls.__bases__ if issubclass(base, ProrlError)), None)
    keeps = tuple(base.__name__ for base in cls.__bases__ if base is not parent and base is not Exception)
    here = cls.__module__ == errors.__name__ and cls is not ProrlError
    return Drawn(cls.__name__, parent.__name__ if parent else None, keeps, here)


def test_every_exception_class_of_the_packages_is_a_prorl_error():
    outside = [
        f"{cls.__module__}.{cls.__qualname__} (bases: {', '.join(b.__name__ for b in cls.__bases__)})"
        for cls in _exception_classes()
        if not issubclass(cls, ProrlError)
    ]
    assert not outside, (
        "exception classes that do not derive from ProrlError; derive each from its area's root in "
        "prorl_server/errors.py (keeping a builtin base as a second base if code catches it by that):\n  "
        + "\n  ".join(outside)
    )


def test_modules_that_cannot_be_imported_here_define_no_exception_class():
    """A module whose optional dependency is missing is read with ast: no class of it may subclass an
    exception (a builtin one or one of the packages'), since the import check cannot see it."""
    _, failed = _modules()
    for name, exc in failed.items():
        assert isinstance(exc, ModuleNotFoundError) and not exc.name.startswith("prorl"), (name, exc)
    known = {cls.__name__ for cls in _exception_classes()} | {
        name for name, value in vars(builtins).items() if inspect.isclass(value) and issubclass(value, BaseException)
    }
    unseen = []
    for name in failed:
        path = Path(sys.modules.get(name.rpartition(".")[0]).__path__[0]) / f"{name.rpartition('.')[2]}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(base).rpartition(".")[2] for base in node.bases}
                if bases & known:
                    unseen.append(f"{name}.{node.name}")
    assert not unseen, f"exception classes in modules the test cannot import: {unseen}"


def test_the_drawn_tree_is_the_tree_of_the_classes():
    drawn = _drawn()
    assert drawn[0] == Drawn("ProrlError", None, (), False)
    actual = {_as_drawn(cls) for cls in _exception_classes()}
    undrawn = sorted(map(repr, actual - set(drawn)))
    unreal = sorted(map(repr, set(drawn) - actual))
    assert not undrawn and not unreal, (
        "prorl_server/errors.py's tree is not the classes' tree; draw each class under its ProrlError base, with "
        "its other bases in brackets.\n  not drawn so: "
        + "\n  ".join(undrawn)
        + "\n  drawn, no such class: "
        + "\n  ".join(unreal)
    )
    assert len(drawn) == len(set(drawn)), "a class is drawn twice"


def test_every_area_root_is_drawn_directly_under_prorl_error():
    roots = {d.name for d in _drawn() if d.parent == "ProrlError"}
    for name in ("SandboxError", "ImageError", "ToolError", "LLMError", "GatewayError", "PipelineError"):
        assert name in roots
    here = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, ProrlError) and value is not ProrlError
    }
    assert here == {d.name for d in _drawn() if d.here}


def test_the_tree_drawn_in_the_test_itself_is_parsed_as_meant():
    assert LINE.match("│   │   └── ClientClosed")["prefix"] == "│   │   └── "
    match = LINE.match("├── SandboxError [RuntimeError] ........ sandbox/base.py: what")
    assert match["name"] == "SandboxError" and match["keeps"] == "RuntimeError"
    assert LINE.match("├── ImageError * ....... sandbox images")["here"]


@pytest.mark.parametrize("public", [prorl_server, prorl_server.client])
def test_prorl_error_is_public_from_the_package_and_the_client(public):
    assert public.ProrlError is ProrlError and "ProrlError" in public.__all__


def test_an_error_kind_is_the_class_name_unless_the_class_names_its_kind():
    class Mine(ProrlError):
        pass

    class Theirs(ValueError):
        pass

    assert error_kind_of(Mine()) == "Mine" and error_kind_of(Theirs()) == "Theirs"
    from prorl_server.llm import BackendStalled, BackendUnavailable

    assert BackendUnavailable.error_kind == "BackendUnavailable" and BackendStalled.error_kind == "BackendStalled"
    assert error_kind_of(BackendStalled("slow")) == "BackendStalled"


def test_the_statuses_and_kinds_on_the_wire_are_read_off_the_classes():
    """The HTTP API answers each class that sets an `http_status` with it (subclasses inherit it); the
    infrastructure errors a group refills name their ErrorKind."""
    from prorl_server.api.errors import _with_status
    from prorl_server.handlers import HandlerLoadError, UnknownDataSource
    from prorl_server.llm import BackendProtocolError, BackendStalled, BackendUnavailable, NoBackendAvailable
    from prorl_server.llm.engine_freeze import FreezeRefused
    from prorl_server.llm.session import StaleRollout
    from prorl_server.llm.weight_update import WeightReloadFailed, WeightRestoreFailed, WeightUpdateConflict
    from prorl_server.pipeline import DuplicateJob, InvalidInstance, NotAccepting
    from prorl_server.pipeline.groups import DuplicateGroup
    from prorl_server.pipeline.refill import INFRASTRUCTURE_ERRORS
    from prorl_server.protocol import ErrorKind
    from prorl_server.sandbox import SandboxError

    assert {cls: cls.http_status for cls in _with_status(ProrlError) if cls.__module__.startswith("prorl")} == {
        UnknownDataSource: 400,
        InvalidInstance: 400,
        DuplicateJob: 409,
        NotAccepting: 503,
        HandlerLoadError: 503,
        WeightUpdateConflict: 409,
        WeightReloadFailed: 502,
        WeightRestoreFailed: 502,
        FreezeRefused: 409,
    }
    assert DuplicateGroup.http_status == 409 and SandboxError.http_status is None
    for cls, kind in [
        (SandboxError, ErrorKind.SANDBOX_ERROR),
        (BackendUnavailable, ErrorKind.BACKEND_UNAVAILABLE),
        (BackendStalled, ErrorKind.BACKEND_STALLED),
        (BackendProtocolError, ErrorKind.BACKEND_PROTOCOL_ERROR),
        (NoBackendAvailable, ErrorKind.NO_BACKEND_AVAILABLE),
        (StaleRollout, ErrorKind.STALE_ROLLOUT),
    ]:
        assert cls.error_kind is kind
    infrastructure = (SandboxError, BackendUnavailable, BackendStalled, BackendProtocolError, NoBackendAvailable)
    refilled = {cls.error_kind for cls in infrastructure} | {ErrorKind.SERVER_RESTARTED}
    assert refilled == INFRASTRUCTURE_ERRORS
