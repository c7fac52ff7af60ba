"""The client's flat method names from before it was grouped by resource, kept as deprecated aliases.

One name map serves both clients: `add_deprecated_aliases` gives RolloutClient and SyncRolloutClient each an
alias per old name, which warns (DeprecationWarning) and calls the resource method that replaced it.
`client.weights` is now the resource, so the old `client.weights()` is the resource's `__call__`.
"""

from __future__ import annotations

import functools
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
