"""Initialise once, fork N: the members of a group whose handler says `fork_after_init = True` share one INIT.

A GroupFork is shared by a group's members (used on the INIT stage's loop; closed on the API's). The first
member to reach INIT leads: the handler's INIT runs on its context, then the one sandbox INIT started
(`ctx.sandbox`) is snapshotted (`Runtime.snapshot`, which stops it; sandbox/snapshot.py), a deep copy of its
`ctx.state` and `ctx.artifacts` is kept, and the cleanups its INIT registered with `ctx.on_release` pass to
the group: they run when the group ends, after the snapshot is removed, since the snapshot and every fork may
depend on them (an image lease, say). The other members wait for the leader, then each gets its own deep copy
of that state and those artifacts and a fork of the snapshot as `ctx.sandbox`, without calling INIT; the
leader continues in a fork too. An INIT that started no sandbox is shared the same way, without a snapshot.

Faults: a leader whose INIT (or snapshot) fails fails as it would without forking, and the next member to
reach INIT leads again, so a waiting member never inherits a failure that was not its own. A member whose
fork fails (the snapshot gone or corrupt) fails with that SandboxError, an infrastructure error its group
refills (pipeline/refill.py); the snapshot is dropped, so the next member to reach INIT, the refill among
them, initialises again. `aclose()` (the group ended) removes every snapshot the group made and runs the
group's cleanups (the most recent first); a leader whose snapshot completes after that removes it at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prorl_server.errors import PipelineError
from prorl_server.handlers import JobContext, ReleaseCallback
from prorl_server.sandbox import SandboxError, SandboxManager, Snapshot

log = logging.getLogger(__name__)


class ForkStateError(PipelineError, TypeError):
    """A forking handler's INIT left state that cannot be copied for the group's other members, started more
    than one sandbox, or started one with a gateway session."""


@dataclass
class Template:
    """What one INIT left for the group: its sandbox's snapshot (None: it started none), copies of its
    `ctx.state` and `ctx.artifacts`, and the cleanups it registered."""

    snapshot: Snapshot | None
    state: dict[str, Any]
    artifacts: dict[str, Any]
    cleanups: list[ReleaseCallback]


class GroupFork:
    """One group's shared INIT (see the module docstring). `inits`: INITs that made a template; `forks`:
    sandboxes started from one."""

    def __init__(self, group_id: str, manager: SandboxManager) -> None:
        self.group_id = group_id
        self.manager = manager
        self.inits = 0
        self.forks = 0
        self._lock = threading.Lock()
        self._template: Template | None = None  # the one members fork from now
        self._leading: concurrent.futures.Future[None] | None = None  # done when the current leader is
        self._made: list[Template] = []  # every template, removed by aclose
        self._closed = False

    async def init(self, ctx: JobContext, run_init: Callable[[], Awaitable[Any]]) -> None:
        """A member's INIT: lead (run `run_init`, the handler's INIT, and keep its template) or wait for the
        leader, then start from a fork of the template."""
        while True:
            with self._lock:
                if self._closed:
                    raise SandboxError(f"group {self.group_id!r} has ended; its INIT snapshot is removed")
                template, leading = self._template, self._leading
                leads = template is None and leading is None
                if leads:
                    leading = self._leading = concurrent.futures.Future()
            if template is not None:
                await self._fork(ctx, template, copy_state=True)
                return
            assert leading is not None
            if not leads:
                await asyncio.shield(asyncio.wrap_future(leading))
                continue
            try:
                template = await self._lead(ctx, run_init)
            finally:
                with self._lock:
                    self._leading = None
                leading.set_result(None)
            await self._fork(ctx, template, copy_state=False)
            return

    async def _lead(self, ctx: JobContext, run_init: Callable[[], Awaitable[Any]]) -> Template:
        """Run INIT on the leader's context and make the group's template of what it left."""
        await run_init()
        if len(ctx._started) > 1:
            raise ForkStateError(
                f"INIT started {len(ctx._started)} sandboxes; a handler with fork_after_init starts one at most "
                "(ctx.sandbox), which its group's members fork"
            )
        if ctx._gateway_started:
            raise ForkStateError(
                "INIT started its sandbox with gateway=: every fork would reach that one gateway session; a handler "
                "with fork_after_init starts the agent's gateway sandbox in RUN"
            )
        snapshot = None
        if ctx.sandbox is not None:
            snapshot = await self.manager.snapshot(ctx.sandbox)
            ctx.sandbox = None
        try:
            state, artifacts = copy.deepcopy(ctx.state), copy.deepcopy(ctx.artifacts)
        except Exception as exc:
            await _remove(snapshot)
            raise ForkStateError(
                f"INIT left ctx.state or ctx.artifacts that cannot be copied for the group's other members ({exc}); "
                "a handler with fork_after_init keeps plain data there (docs/handlers.md)"
            ) from exc
        with self._lock:
            late = self._closed
            if not late:
                template = Template(snapshot, state, artifacts, ctx._take_cleanups())
                self._template = template
                self._made.append(template)
                self.inits += 1
        if late:
            await _remove(snapshot)
            raise SandboxError(f"group {self.group_id!r} ended while its INIT was snapshotted; the snapshot is removed")
        return template

    async def _fork(self, ctx: JobContext, template: Template, copy_state: bool) -> None:
        """Give a member the template's state (a copy of its own) and a fork of its snapshot."""
        if copy_state:
            ctx.state.update(copy.deepcopy(template.state))
            ctx.artifacts.update(copy.deepcopy(template.artifacts))
        if template.snapshot is None:
            return
        try:
            await ctx._start_fork(template.snapshot)
        except SandboxError:
            with self._lock:
                if self._template is template:  # the next member to reach INIT initialises again
                    self._template = None
            raise
        with self._lock:
            self.forks += 1

    async def aclose(self) -> None:
        """The group ended: remove its snapshots and run the cleanups of its INITs (errors are logged)."""
        with self._lock:
            self._closed = True
            made, self._made = self._made, []
            self._template = None
        for template in reversed(made):  # the most recent first, as a job's release does
            await _remove(template.snapshot)
            for callback in reversed(template.cleanups):
                try:
                    outcome = callback()
                    if inspect.isawaitable(outcome):
                        await outcome
                except Exception:
                    log.exception("a cleanup of group %s's INIT failed", self.group_id)


async def _remove(snapshot: Snapshot | None) -> None:
    if snapshot is not None:
        await asyncio.to_thread(snapshot.remove)
