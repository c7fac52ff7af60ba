"""Handler discovery: the `prorl_server.handlers` entry-point group and `--handler` targets."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from prorl_server.errors import HandlerApiError
from prorl_server.handlers.base import AgentHandler
from prorl_server.handlers.failure import import_error_location

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "prorl_server.handlers"


class UnknownDataSource(HandlerApiError, LookupError):
    """No handler is registered under the instance's `data_source`."""

    http_status = 400


class HandlerLoadError(HandlerApiError, RuntimeError):
    """A handler plugin is registered but could not be imported or instantiated."""

    http_status = 503


@dataclass
class HandlerEntry:
    """A registered handler: where it comes from, and the loaded object or the load error."""

    data_source: str
    target: str
    handler: AgentHandler | None = None
    error: str | None = None


def load_target(target: str) -> type[AgentHandler]:
    """Import `module:Class` or `path/to/file.py:Class` and check it is an AgentHandler subclass."""
    module_part, sep, attr = target.rpartition(":")
    if not sep or not module_part or not attr:
        raise HandlerLoadError(f"handler target {target!r} must look like 'package.module:Class' or 'file.py:Class'")
    try:
        module = _import(module_part)
    except HandlerLoadError:
        raise
    except Exception as exc:
        raise HandlerLoadError(
            f"cannot import {module_part!r} for handler {target!r}: {describe_load_error(exc)}"
        ) from exc
    cls = getattr(module, attr, None)
    if cls is None:
        raise HandlerLoadError(f"{module_part} has no attribute {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, AgentHandler)):
        raise HandlerLoadError(f"{target} is not a subclass of prorl_server.AgentHandler")
    return cls


def describe_load_error(exc: BaseException) -> str:
    """`Type: message (at file.py:12 in func)`: why a plugin failed to load, and where in its code."""
    location = import_error_location(exc)
    text = f"{type(exc).__name__}: {exc}"
    return f"{text} (at {location})" if location else text


def _import(module_part: str) -> ModuleType:
    if module_part.endswith(".py"):
        path = Path(module_part).resolve()
        if not path.is_file():
            raise HandlerLoadError(f"handler file {path} does not exist")
        name = f"prorl_handler_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(module_part)


class HandlerRegistry:
    """Maps `data_source` names to handler objects (one object per name, shared by its jobs)."""

    def __init__(self) -> None:
        self._entries: dict[str, HandlerEntry] = {}

    def load_entry_points(self) -> None:
        """Register every handler installed under the `prorl_server.handlers` entry-point group."""
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            entry = HandlerEntry(data_source=ep.name, target=ep.value)
            try:
                cls = ep.load()
                if not (isinstance(cls, type) and issubclass(cls, AgentHandler)):
                    raise HandlerLoadError(f"{ep.value} is not a subclass of prorl_server.AgentHandler")
                entry.handler = cls()
            except Exception as exc:
                entry.error = describe_load_error(exc)
                log.error("handler plugin %r (%s) failed to load: %s", ep.name, ep.value, entry.error)
            self._entries[ep.name] = entry

    def add_target(self, spec: str) -> str:
        """Register `[name=]module:Class`; the name defaults to the class's `name` attribute."""
        name, sep, target = spec.partition("=")
        if not sep or ":" in name:
            name, target = "", spec
        cls = load_target(target)
        name = name or cls.name
        if not name:
            raise HandlerLoadError(f"{target} has no `name` class attribute; pass --handler NAME={target}")
        try:
            handler = cls()
        except Exception as exc:
            raise HandlerLoadError(f"cannot instantiate handler {target!r}: {describe_load_error(exc)}") from exc
        self.register(name, handler, target)
        return name

    def register(self, data_source: str, handler: AgentHandler, target: str | None = None) -> None:
        """Register a handler object under a data_source name (replaces an earlier one)."""
        if not isinstance(handler, AgentHandler):
            raise TypeError(f"{handler!r} is not an AgentHandler")
        target = target or f"{type(handler).__module__}:{type(handler).__qualname__}"
        self._entries[data_source] = HandlerEntry(data_source=data_source, target=target, handler=handler)

    def get(self, data_source: str) -> AgentHandler:
        """The handler for `data_source`, or UnknownDataSource / HandlerLoadError with a usable message."""
        entry = self._entries.get(data_source)
        if entry is None:
            known = ", ".join(sorted(self.names())) or "none; install a handler plugin or pass --handler"
            raise UnknownDataSource(f"unknown data_source {data_source!r}; known data sources: {known}")
        if entry.handler is None:
            raise HandlerLoadError(f"handler {data_source!r} ({entry.target}) failed to load: {entry.error}")
        return entry.handler

    def names(self) -> list[str]:
        """Names of handlers that loaded."""
        return sorted(name for name, e in self._entries.items() if e.handler is not None)

    def entries(self) -> list[HandlerEntry]:
        """All registered entries, loaded or not."""
        return [self._entries[name] for name in sorted(self._entries)]
