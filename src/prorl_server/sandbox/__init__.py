"""Rootless sandboxes: one Runtime interface, apptainer / bubblewrap / local runtimes, reaper, loopback IPs.

Pick a runtime with `make_runtime(name, owner)` (`name` in `CHOICES`; `owner` from `new_owner_id()`), start
sandboxes with `await runtime.start(SandboxSpec(...))`, close them with `await sandbox.close()`. Call
`reap_orphans(owner)` on server start; on stop, `runtime.close()` (prewarmed launchers), `reap(owner=owner)` and
`remove_owner_files(owner)`. docs/sandboxes.md has the details.
"""

from prorl_server.sandbox.base import Runtime, Sandbox
from prorl_server.sandbox.errors import SandboxError
from prorl_server.sandbox.loopback import LoopbackAllocator, LoopbackExhausted
from prorl_server.sandbox.manager import SandboxManager
from prorl_server.sandbox.reaper import DEFAULT_BASE_DIR, new_owner_id, reap, reap_orphans, remove_owner_files
from prorl_server.sandbox.registry import CHOICES, available, make_runtime
from prorl_server.sandbox.spec import Bind, SandboxLimits, SandboxSpec

__all__ = [
    "CHOICES",
    "DEFAULT_BASE_DIR",
    "Bind",
    "LoopbackAllocator",
    "LoopbackExhausted",
    "Runtime",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxManager",
    "SandboxSpec",
    "available",
    "make_runtime",
    "new_owner_id",
    "reap",
    "reap_orphans",
    "remove_owner_files",
]
