"""Deprecated names of the client, kept as aliases that warn (DeprecationWarning) and name what replaces them.

- The flat method names from before the client was grouped by resource: one name map serves both clients,
  `add_deprecated_aliases` gives RolloutClient and SyncRolloutClient each an alias per old name, which calls
  the resource method that replaced it. `client.weights` is now the resource, so the old `client.weights()`
  is the resource's `__call__`.
- The names that moved out of `prorl_server.client` (`MOVED`: `LocalStack`, `free_port`, `run_with_stack`,
  now in `prorl_server.launch`): `moved_attribute` is the package's `__getattr__` (PEP 562), for a release.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

RENAMED: dict[str, str] = {
    "submit": "jobs.submit",
    "submit_many": "jobs.submit_many",
    "process": "jobs.process",
    "get": "jobs.get",
    "wait": "jobs.wait",
    "cancel": "jobs.cancel",
    "server_of": "jobs.server_of",
    "stream_results": "jobs.stream",
    "as_completed": "jobs.as_completed",
    "collect": "jobs.collect",
    "ack": "jobs.ack",
    "submit_group": "groups.submit",
    "group": "groups.get",
    "wait_group": "groups.wait",
    "cancel_group": "groups.cancel",
    "server_of_group": "groups.server_of",
    "weights": "weights.status",
    "pause_weights": "weights.pause",
    "update_weights": "weights.update",
    "resume_weights": "weights.resume",
    "swap_weights": "weights.swap",
    "add_llm_server": "backends.add",
    "remove_llm_server": "backends.remove",
    "llm_servers": "backends.list",
    "clear_llm_servers": "backends.clear",
    "register_backends": "backends.register",
}
"""Old flat method name -> `resource.method` that replaces it."""


MOVED: dict[str, str] = {
    "LocalStack": "prorl_server.launch",
    "free_port": "prorl_server.launch",
    "run_with_stack": "prorl_server.launch",
}
"""Public name that left `prorl_server.client` -> the module to import it from now."""


def moved_attribute(module: str, name: str) -> Any:
    """`name` of MOVED from its new module, with a DeprecationWarning naming the new path; AttributeError for any
    other name. Imported by name (importlib), not by an import statement: the launchers are a layer above the
    client, which reaches them only through these aliases, and only until they go."""
    new = MOVED.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is deprecated: import it from {new} (`from {new} import {name}`); "
        f"the alias goes in a later release",
        DeprecationWarning,
        stacklevel=3,  # the code that reads the name (through the module's __getattr__)
    )
    return getattr(importlib.import_module(new), name)


def add_deprecated_aliases(client_class: type, resource_classes: Mapping[str, type]) -> None:
    """Give `client_class` every old name of RENAMED, each forwarding to its resource method (the resource
    classes by attribute name: `{"jobs": Jobs, ...}`), with a DeprecationWarning."""
    prefix = client_class.__name__
    for old, new in RENAMED.items():
        resource, method = new.split(".")
        target = getattr(resource_classes[resource], method)
        if old == resource:  # the name is the resource now: calling it is the old call
            alias = _alias(f"{prefix}.{old}()", f"{prefix}.{new}()", target, lambda owner, m=method: getattr(owner, m))
            alias.__name__, alias.__qualname__ = "__call__", f"{resource_classes[resource].__name__}.__call__"
            resource_classes[resource].__call__ = alias
        else:
            alias = _alias(
                f"{prefix}.{old}()",
                f"{prefix}.{new}()",
                target,
                lambda owner, r=resource, m=method: getattr(getattr(owner, r), m),
            )
            alias.__name__, alias.__qualname__ = old, f"{prefix}.{old}"
            setattr(client_class, old, alias)


def _alias(old: str, new: str, target: Callable[..., Any], find: Callable[[Any], Callable[..., Any]]) -> Any:
    @functools.wraps(target)
    def alias(self: Any, *args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=2)
        return find(self)(*args, **kwargs)

    alias.__doc__ = f"Deprecated: use `{new}`. {target.__doc__ or ''}".rstrip()
    alias.deprecated_for = new  # type: ignore[attr-defined]
    return alias
