"""What a sandbox's first process runs to confine itself before anything else: Landlock, then seccomp.

bubblewrap installs the seccomp filter itself (`--seccomp FD`, no cost to the sandbox's start); Apptainer
sandboxes install it from their bootstrap. Landlock (network modes host and loopback only, see
network_guard.py) is always enforced by the bootstrap, on a ruleset the host built once. The local runtime
confines nothing: it is no sandbox.
"""

from __future__ import annotations

import functools
import logging

from prorl_server.sandbox import landlock, seccomp

log = logging.getLogger(__name__)


@functools.cache
def seccomp_program() -> bytes | None:
    """This machine's seccomp deny-list program, or None (logged once) where it cannot be installed."""
    reason = seccomp.unavailable_reason()
    if reason is not None:
        log.warning("sandboxes run without a seccomp filter: %s", reason)
        return None
    return seccomp.deny_program()


def boot_source(landlock_fd: int | None, program: bytes | None) -> str | None:
    """Python source for the bootstrap (limits.BOOT_CODE's `pre`): restrict to ruleset `landlock_fd` (closing
    it), then install seccomp `program`; None when there is neither."""
    parts: list[str] = []
    if landlock_fd is not None:
        parts += [landlock.RESTRICT_SOURCE, f"_landlock({landlock_fd})"]
    if program is not None:
        parts += [seccomp.INSTALL_SOURCE, f"_seccomp({program!r})"]
    return "\n".join(parts) or None
