"""Process hygiene shared by every runtime: owner tags, own sessions, group kill.

Every process a sandbox starts carries `PRORL_SANDBOX_OWNER=<owner id>` (and `PRORL_SANDBOX_ID`) in its
environment; children inherit it, so the reaper can find leftovers by ownership after a crash, never by
process name. Each sandbox's top process leads its own session and process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from prorl_server.tool_server.protocol import ENV_OWNER, ENV_SANDBOX_ID

# The host uid and gid sandboxes run as when the server runs as root (nobody): never as host root, whose
# writes to /proc/sys (kernel.core_pattern, say) would be a way out of any sandbox.
SANDBOX_UID = 65534


def sandbox_user() -> int | None:
    """The uid (and gid) sandboxes must run as on the host: SANDBOX_UID for a root server, else None (its own)."""
    return SANDBOX_UID if os.geteuid() == 0 else None


# Variables kept from the server's environment when a sandbox's environment is scrubbed.
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "TERM", "TZ")


def sandbox_env(owner: str, sandbox_id: str, extra: dict[str, str]) -> dict[str, str]:
    """A scrubbed environment: a few harmless host variables, the owner tags, then `extra`."""
    env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env.update(extra)
    env[ENV_OWNER] = owner
    env[ENV_SANDBOX_ID] = sandbox_id
    return env


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False if it no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists."""
    return signal_group(pgid, 0)


async def terminate_group(pgid: int, grace_s: float = 2.0, poll_s: float = 0.01) -> None:
    """SIGTERM the group, wait up to `grace_s` for it to go, then SIGKILL what is left."""
    if not signal_group(pgid, signal.SIGTERM):
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while loop.time() < deadline:
        if not group_alive(pgid):
            return
        await asyncio.sleep(poll_s)
    signal_group(pgid, signal.SIGKILL)


async def reap(process: asyncio.subprocess.Process | None, timeout_s: float = 2.0) -> None:
    """Collect a child's exit status so it does not linger as a zombie."""
    if process is None:
        return
    with contextlib.suppress(TimeoutError, ProcessLookupError):
        await asyncio.wait_for(process.wait(), timeout_s)
