"""Weight versions and the weight update sequence: reload the engines, set the version, roll back on failure.

`WeightVersions` is the pool's record of every weight version set so far (how far apart two versions are,
whether a version may come next). `WeightUpdate` is what `POST /weights/update` and `/weights/swap`
(api/weights.py) run once LLM dispatching is paused and drained: with `reload`, each engine loads the new
weights from a checkpoint directory and resets its prefix cache (vLLM's development endpoints,
`llm/vllm_admin.py`); when one fails, the engines that did load it get their previous checkpoint back and
the version stays as it was; then the version (and with `servers`, the backend set) is set on the pool.
While the same pause lasts, `POST /weights/rollback` undoes the last update (`WeightUpdate.rollback`): the
engines that reloaded get their previous checkpoint back, and the backend set and version return to what
they were. Where a pause is in that sequence is a `PauseStep`:

    DISPATCHING ─pause─▶ PAUSED ─update─▶ UPDATED ─rollback─▶ ROLLED_BACK
                                             ▲                     │
                                             └──────update─────────┘
    any step ─resume (the route, the lease, a swap's own)─▶ DISPATCHING

Refusals are `WeightUpdateConflict` (the router's 409), `WeightReloadFailed` and `WeightRestoreFailed`
(its 502).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from prorl_server.llm.errors import LLMError
from prorl_server.llm.vllm_admin import Reloaded, reload_weights, restore_weights

if TYPE_CHECKING:
    from prorl_server.llm.backend import Backend
    from prorl_server.llm.backend_pool import BackendPool, PoolSnapshot
    from prorl_server.llm.engine_freeze import EngineFreeze
    from prorl_server.protocol import UpdateRequest

_SHOWN_FAILURES = 8  # failed backends a WeightReloadFailed names one by one


class WeightUpdateConflict(LLMError):
    """The update cannot happen now or with this version (not paused, calls in flight, a version that goes
    backwards, another reload under way, a resume meanwhile); nothing changed."""

    http_status = 409


class WeightReloadFailed(LLMError):
    """Some engines did not reload the checkpoint; the version is unchanged (and the others rolled back)."""

    http_status = 502


class WeightRestoreFailed(LLMError):
    """A rollback set the version and the backends back, but some engines did not load their previous
    checkpoint back (the message names them)."""

    http_status = 502


class PauseStep(StrEnum):
    """Where the weight update sequence is (the module docstring draws the moves)."""

    DISPATCHING = "dispatching"  # not paused
    PAUSED = "paused"  # no update in this pause yet
    UPDATED = "updated"  # its last update may be rolled back
    ROLLED_BACK = "rolled_back"  # its last update was rolled back


@dataclass(slots=True)
class Undo:
    """What one update changed, to undo it while its pause lasts (`WeightUpdate.rollback`)."""

    pause: int  # the pause it happened in (`WeightPauseGate.pauses`)
    version: str | int  # the version it set
    before: PoolSnapshot  # the version and backends before it, their checkpoints included
    reloaded: list[Reloaded]  # the engines that loaded its checkpoint
    timeout_s: float  # its reload's, for loading the previous checkpoints back
    rolled_back: bool = False


class WeightVersions:
    """Every weight version set or registered so far, oldest first, and the one last set (`current`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: list[str | int] = []
        self.current: str | int | None = None

    def registered(self, version: str | int | None) -> None:
        """A backend was registered at `version` (remembered once)."""
        if version is None:
            return
        with self._lock:
            if version not in self._used:
                self._used.append(version)

    def set(self, version: str | int) -> None:
        """`version` is the weights of every backend from now on."""
        with self._lock:
            self._used.append(version)
            self.current = version

    def unset(self, version: str | int, previous: str | int | None) -> None:
        """Undo the last `set(version)` (a rollback): `version` is no longer used, so it may be set again,
        and `previous` is current again."""
        with self._lock:
            for i in range(len(self._used) - 1, -1, -1):
                if _same(self._used[i], version):
                    del self._used[i]
                    break
            self.current = previous

    def distance(self, old: str | int, new: str | int) -> int | None:
        """How many versions `new` is ahead of `old` (negative when behind): their difference for two
        integers, else how far apart they are in the order versions were set or registered. None when
        either is unknown."""
        if _is_int(old) and _is_int(new):
            return int(new) - int(old)
        with self._lock:
            used = list(self._used)
        positions = [next((i for i, v in enumerate(used) if _same(v, x)), None) for x in (old, new)]
        if None in positions:
            return None
        return positions[1] - positions[0]

    def conflict(self, version: str | int) -> str | None:
        """Why `version` may not be the next weight version (None when it may): an integer must be greater
        than every integer version set before, a string must differ from every version set before (as text,
        since the version names the prefix-cache salt)."""
        with self._lock:
            used = list(self._used)
        if isinstance(version, int):
            ints = [v for v in used if isinstance(v, int)]
            if ints and version <= max(ints):
                return f"weight version {version} does not increase (the latest integer version is {max(ints)})"
        if any(str(v) == str(version) for v in used):
            return f"weight version {version!r} was already used"
        return None


class WeightUpdate:
    """The update sequence on `pool`, while dispatching is paused. Engine calls go through `run` (the server
    runs them on its health-check loop, whose HTTP connections it closes when it stops); `lock` is held
    while engines reload (one reload at a time; the pause lease waits for it); `servers_changed` is told
    when `servers` replaced the backend set (the server probes them)."""

    def __init__(
        self,
        pool: BackendPool,
        engine_freeze: EngineFreeze,
        run: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]],
        lock: asyncio.Lock,
        servers_changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.pool = pool
        self.engine_freeze = engine_freeze
        self.run = run
        self.lock = lock
        self.servers_changed = servers_changed
        self.last: Undo | None = None  # the last update that went through, and how to undo it

    def step(self) -> PauseStep:
        """Where the sequence is now (no await in here: routes and the lease run on one loop)."""
        gate, last = self.pool.gate, self.last
        if not gate.paused:
            return PauseStep.DISPATCHING
        if last is None or last.pause != gate.pauses:
            return PauseStep.PAUSED
        return PauseStep.ROLLED_BACK if last.rolled_back else PauseStep.UPDATED

    def check_paused(self, what: str) -> None:
        """WeightUpdateConflict unless dispatching is paused and no call is in flight."""
        gate = self.pool.gate
        if not gate.paused:
            raise WeightUpdateConflict(f"LLM dispatching is not paused: POST /weights/pause first, then {what}")
        if in_flight := gate.in_flight:
            raise WeightUpdateConflict(
                f"{in_flight} LLM call(s) still in flight; POST /weights/pause answers once they are done"
            )

    def check_version(self, version: str | int) -> None:
        """WeightUpdateConflict when `version` may not come next."""
        if conflict := self.pool.versions.conflict(version):
            raise WeightUpdateConflict(conflict)

    async def apply(self, body: UpdateRequest, what: str) -> None:
        """Without `reload`, set the version; with it, reload every engine first (WeightReloadFailed if one
        fails), then check again that nothing was resumed meanwhile and set the version. One at a time while
        engines reload (WeightUpdateConflict otherwise). What it changed is kept for `rollback`."""
        if self.lock.locked():
            raise WeightUpdateConflict("another weight update is reloading the engines; wait for its answer")
        before, pause = self.pool.snapshot(), self.pool.gate.pauses
        if body.reload is None:
            self._set(body)
            self.last = Undo(pause, body.version, before, [], 0.0)
            return
        async with self.lock:
            loaded = await self._reload(body)
            gate = self.pool.gate
            if not gate.paused or gate.in_flight or gate.pauses != pause:
                raise WeightUpdateConflict(
                    f"LLM dispatching was resumed while {len(loaded)} engine(s) loaded {body.reload.path!r}; "
                    f"the weight version is unchanged: pause, then {what} again"
                )
            for backend in self._set(body):
                self.pool.notes(backend).weights_path = body.reload.path
            self.last = Undo(pause, body.version, before, loaded, body.reload.timeout_s)

    async def rollback(self) -> Undo:
        """Undo the last update of the current pause: the engines that reloaded its checkpoint load their
        previous one again (prefix caches reset, unless a keep pause froze them), then the backend set, each
        backend's version and the current version go back to what they were, and the undone version may be
        used again. WeightUpdateConflict when there is nothing to undo (nothing changed then);
        WeightRestoreFailed naming the engines that did not load their previous checkpoint back (the
        version and backends are back anyway)."""
        undo = self.check_rollback()
        async with self.lock:
            undo.rolled_back = True  # before any await: a second rollback meanwhile is refused
            previous = {r.address: self._checkpoint_before(undo, r.address) for r in undo.reloaded}
            stuck = await self._roll_back(undo.reloaded, previous, undo.timeout_s) if undo.reloaded else []
            if self.pool.restore(undo.before, undo.version):
                self.servers_changed()
            if undo.before.version is not None:
                self.pool.gate.note_version(undo.before.version)  # kept calls go on under it
        if stuck:
            raise WeightRestoreFailed(
                f"the weight version is back to {undo.before.version!r}, but {len(stuck)} of "
                f"{len(undo.reloaded)} LLM backend(s) did not load their previous weights back: {_shown(stuck)}"
            )
        return undo

    def check_rollback(self) -> Undo:
        """The update `rollback` would undo; WeightUpdateConflict saying why there is none now."""
        step = self.step()
        if step is not PauseStep.UPDATED:
            raise WeightUpdateConflict(self._nothing_to_undo(step))
        self.check_paused("roll back")
        if self.lock.locked():
            raise WeightUpdateConflict("a weight update is reloading the engines; wait for its answer")
        assert self.last is not None
        return self.last

    def _nothing_to_undo(self, step: PauseStep) -> str:
        if step is PauseStep.DISPATCHING:
            return "LLM dispatching is not paused: a rollback undoes an update of the current pause, before its resume"
        if step is PauseStep.PAUSED:
            return "no weight update in this pause to roll back (POST /weights/update first)"
        assert self.last is not None
        return (
            f"the update to weight version {self.last.version!r} was rolled back already; the version is "
            f"{self.pool.current_version!r}"
        )

    @staticmethod
    def _checkpoint_before(undo: Undo, address: str) -> str | None:
        """The checkpoint the engine at `address` held before `undo`'s update (None: the one it started with)."""
        notes = undo.before.notes.get(address)
        return notes.weights_path if notes is not None else None

    def _set(self, body: UpdateRequest) -> list[Backend]:
        """Check and set the version (no await in between: routes run on one loop, so this is atomic)."""
        pool = self.pool
        self.check_version(body.version)
        servers = None if body.servers is None else [(s.address, s.tags) for s in body.servers]
        backends = pool.set_weight_version(body.version, servers)
        pool.gate.note_version(body.version)  # the calls a keep pause froze go on under it
        if servers is not None:
            self.servers_changed()
        return backends

    async def _reload(self, body: UpdateRequest) -> list[Reloaded]:
        """Every target engine loads `body.reload.path` and resets its prefix cache, all at once;
        WeightReloadFailed naming the ones that failed. Each failed engine is given its previous checkpoint
        back, and so is each engine that did load it, so that all of them serve the weights of the version
        that stays."""
        assert body.reload is not None
        reload, pool = body.reload, self.pool
        known = {b.address: b for b in pool.backends()}
        if body.servers is None:
            addresses = list(known)
        else:
            addresses = list(dict.fromkeys(s.address.rstrip("/") for s in body.servers))
        previous = {a: pool.notes(known[a]).weights_path if a in known else None for a in addresses}

        async def reload_all() -> list[Reloaded | BaseException]:
            calls = (
                reload_weights(
                    pool.client,
                    a,
                    reload.path,
                    previous=previous[a],
                    timeout_s=reload.timeout_s,
                    reset_prefix=not self.engine_freeze.frozen,
                )
                for a in addresses
            )
            return await asyncio.gather(*calls, return_exceptions=True)

        outcomes = await self.run(reload_all())
        loaded = [o for o in outcomes if isinstance(o, Reloaded)]
        for address, outcome in zip(addresses, outcomes, strict=True):
            if isinstance(outcome, Reloaded) and address in known:
                pool.notes(known[address]).weights_path = reload.path  # what the engine holds now, whatever follows
            elif isinstance(outcome, BaseException) and not isinstance(outcome, LLMError):
                raise outcome
        failed = [str(o) for o in outcomes if isinstance(o, LLMError)]
        if failed:
            rolled_back = ""
            if loaded:
                rolled_back = _rolled_back(loaded, await self._roll_back(loaded, previous, reload.timeout_s))
            raise WeightReloadFailed(
                f"{len(failed)} of {len(addresses)} LLM backend(s) did not reload their weights, so the weight "
                f"version is unchanged: {_shown(failed)}{rolled_back}"
            )
        return loaded

    async def _roll_back(self, loaded: list[Reloaded], previous: dict[str, str | None], timeout_s: float) -> list[str]:
        """Give the engines in `loaded` their previous checkpoint back (prefix caches reset, unless a keep
        pause froze the engines: vLLM refuses that while frozen requests hold blocks); each engine that did
        not load it back, with why."""
        pool = self.pool
        known = {b.address: b for b in pool.backends()}
        reset = not self.engine_freeze.frozen

        async def restore_all() -> list[tuple[bool, str]]:
            calls = (
                restore_weights(pool.client, r.address, previous[r.address], timeout_s, reset=reset) for r in loaded
            )
            return await asyncio.gather(*calls)

        outcomes = await self.run(restore_all())
        stuck = []
        for reloaded, (ok, sentence) in zip(loaded, outcomes, strict=True):
            if ok and reloaded.address in known:
                pool.notes(known[reloaded.address]).weights_path = previous[reloaded.address]
            elif not ok:
                stuck.append(f"{reloaded.address}: {sentence}")
        return stuck


def _rolled_back(loaded: list[Reloaded], stuck: list[str]) -> str:
    """A clause for a failed reload's message: the engines that did load the checkpoint were rolled back."""
    clause = f"; the {len(loaded)} that did load it were rolled back"
    if stuck:
        return clause + f" ({len(loaded) - len(stuck)} to their previous weights; not: {_shown(stuck)})"
    return clause + f" to their previous weights: {_shown([r.address for r in loaded])}"


def _shown(items: list[str]) -> str:
    more = len(items) - _SHOWN_FAILURES
    return " | ".join(items[:_SHOWN_FAILURES]) + (f" | and {more} more" if more > 0 else "")


def _same(a: str | int, b: str | int) -> bool:
    return type(a) is type(b) and a == b


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
