"""The local runtime: the execution server as a plain host process. No isolation; for development only.

What it still does: own session per sandbox, scrubbed and tagged environment, a private working directory
(`<base>/<owner>/<sandbox id>/workspace`, the spec's `workdir` is not used), rlimits, cgroups where
writable, the wall-clock watchdog, and on close a sweep of every process carrying the sandbox id (children
that called setsid or double-forked included). What it does not: namespaces, binds, images, network modes,
a disk limit other than RLIMIT_FSIZE per file.
"""

from __future__ import annotations

import logging
import sys

from prorl_server.sandbox.limits import boot_code, rlimits
from prorl_server.sandbox.loopback import ENV_ADDRESS
from prorl_server.sandbox.process import sandbox_env
from prorl_server.sandbox.process_sandbox import ProcessRuntime
from prorl_server.sandbox.slot import Command, Slot, host_python_path, server_args
from prorl_server.sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)

WARNING = (
    "the local sandbox runtime gives NO isolation: sandboxed commands run as this user on this host, "
    "see its files and its network. Use it for development only; install bubblewrap or Apptainer otherwise."
)


class LocalRuntime(ProcessRuntime):
    """Starts unisolated sandboxes for one server instance (`owner`); warns loudly when made."""

    name = "local"
    sweep_tags = True
    confines = False
    subdirs = ("workspace", "tmp")

    def __init__(self, owner: str, **options) -> None:
        super().__init__(owner, **options)
        log.warning(WARNING)

    @classmethod
    def available(cls) -> str | None:
        """Always available."""
        return None

    def command(self, spec: SandboxSpec, slot: Slot, address: str | None, landlock_fd: int | None) -> Command:
        """The rlimit bootstrap that runs the execution server, in the private workspace."""
        workdir = slot.directory / "workspace"
        extra = {"HOME": str(workdir), "TMPDIR": str(slot.directory / "tmp")}
        if address is not None:
            extra[ENV_ADDRESS] = address
        env = sandbox_env(self.owner, slot.sandbox_id, {**extra, **spec.env})
        code = boot_code(rlimits(spec.limits, nproc=False), host_python_path(), server_args(spec, slot, str(workdir)))
        return Command([sys.executable, "-I", "-S", "-c", code], env, workdir)
