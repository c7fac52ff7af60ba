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
from pathlib import Path

from prorl_server.sandbox.limits import boot_code, rlimits
from prorl_server.sandbox.loopback import ENV_ADDRESS
from prorl_server.sandbox.process import sandbox_env
from prorl_server.sandbox.process_sandbox import ProcessRuntime, host_python_path
from prorl_server.sandbox.spec import SandboxSpec
from prorl_server.tools.protocol import SOCKET_NAME

log = logging.getLogger(__name__)

WARNING = (
    "the local sandbox runtime gives NO isolation: sandboxed commands run as this user on this host, "
    "see its files and its network. Use it for development only; install bubblewrap or Apptainer otherwise."
)


class LocalRuntime(ProcessRuntime):
    """Starts unisolated sandboxes for one server instance (`owner`); warns loudly when made."""

    name = "local"
    sweep_tags = True
    subdirs = ("workspace", "tmp")

    def __init__(self, owner: str, **options) -> None:
        super().__init__(owner, **options)
        log.warning(WARNING)

    @classmethod
    def available(cls) -> str | None:
        """Always available."""
        return None

    def command(
        self, spec: SandboxSpec, sandbox_id: str, directory: Path, address: str | None
    ) -> tuple[list[str], dict[str, str], Path | None]:
        """The rlimit bootstrap that runs the execution server, in the private workspace."""
        workdir = directory / "workspace"
        extra = {"HOME": str(workdir), "TMPDIR": str(directory / "tmp")}
        if address is not None:
            extra[ENV_ADDRESS] = address
        env = sandbox_env(self.owner, sandbox_id, {**extra, **spec.env})
        server = ["--socket", str(directory / "sock" / SOCKET_NAME), "--workdir", str(workdir)] if spec.tools else None
        code = boot_code(rlimits(spec.limits, nproc=False), host_python_path(), server)
        return [sys.executable, "-I", "-S", "-c", code], env, workdir
