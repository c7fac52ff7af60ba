"""Rootless sandboxes: one Runtime interface, apptainer / bubblewrap / local runtimes, reaper, loopback IPs.

Pick a runtime with `make_runtime(name, owner)` (`name` in `CHOICES`; `owner` from `new_owner_id()`), start
sandboxes with `await runtime.start(SandboxSpec(...))`, close them with `await sandbox.close()`. Call
`reap_orphans(owner)` on server start; on stop, `runtime.close()` (prewarmed launchers), `reap(owner=owner)` and
`remove_owner_files(owner)`. docs/sandboxes.md has the details.
"""

from prorl_server.sandbox.apptainer import (
    CACHE_DIR,
    NOT_FOUND,
    find_apptainer,
    stage_tool_packages,
    unpack_sif,
    unpacked_path,
)
from prorl_server.sandbox.base import Runtime, Sandbox
from prorl_server.sandbox.bwrap import HOST_SYSTEM
from prorl_server.sandbox.cpu_grants import CpuPool, cpu_slice, format_cpus
from prorl_server.sandbox.errors import SandboxError
from prorl_server.sandbox.loopback import LoopbackAllocator, LoopbackExhausted
from prorl_server.sandbox.manager import SandboxManager
from prorl_server.sandbox.network_guard import NetworkGuard, url_port
from prorl_server.sandbox.podman import podman_command
from prorl_server.sandbox.private_dir import ensure_private_dir, user_dir
from prorl_server.sandbox.reaper import DEFAULT_BASE_DIR, new_owner_id, reap, reap_orphans, remove_owner_files
from prorl_server.sandbox.registry import CHOICES, available, make_runtime
from prorl_server.sandbox.snapshot import Snapshot
from prorl_server.sandbox.spec import Bind, SandboxLimits, SandboxSpec

__all__ = [
    "CACHE_DIR",
    "CHOICES",
    "DEFAULT_BASE_DIR",
    "HOST_SYSTEM",
    "NOT_FOUND",
    "Bind",
    "CpuPool",
    "LoopbackAllocator",
    "LoopbackExhausted",
    "NetworkGuard",
    "Runtime",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxManager",
    "SandboxSpec",
    "Snapshot",
    "available",
    "cpu_slice",
    "ensure_private_dir",
    "find_apptainer",
    "format_cpus",
    "make_runtime",
    "new_owner_id",
    "podman_command",
    "reap",
    "reap_orphans",
    "remove_owner_files",
    "stage_tool_packages",
    "unpack_sif",
    "unpacked_path",
    "url_port",
    "user_dir",
]
