"""Weight versions and the weight update sequence: reload the engines, set the version, roll back on failure.

`WeightVersions` is the pool's record of every weight version set so far (how far apart two versions are,
whether a version may come next). `WeightUpdate` is what `POST /weights/update` and `/weights/swap`
(api/weights.py) run once LLM dispatching is paused and drained: with `reload`, each engine loads the new
weights from a checkpoint directory and resets its prefix cache (vLLM's development endpoints,
`llm/vllm_admin.py`); when one fails, the engines that did load it get their previous checkpoint back and
the version stays as it was; then the version (and with `servers`, the backend set) is set on the pool.
Refusals are `WeightUpdateConflict` (the router's 409) and `WeightReloadFailed` (its 502).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from prorl_server.llm.errors import LLMError
from prorl_server.llm.vllm_admin import Reloaded, reload_weights, restore_weights

if TYPE_CHECKING:
    from prorl_server.llm.backend import Backend
    from prorl_server.llm.backend_pool import BackendPool
    from prorl_server.llm.engine_freeze import EngineFreeze
    from prorl_server.protocol import UpdateRequest

_SHOWN_FAILURES = 8  # failed backends a WeightReloadFailed names one by one


class WeightUpdateConflict(LLMError):
    """The update cannot happen now or with this version (not paused, calls in flight, a version that goes
    backwards, another reload under way, a resume meanwhile); nothing changed."""


class WeightReloadFailed(LLMError):
    """Some engines did not reload the checkpoint; the version is unchanged (and the others rolled back)."""


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

    def distance(self, old: str | int, new: str | int) -> int | None:
        """How many versions `new` is ahead of `old` (negative when behind): their difference for two
        integers, else how far apart they are in the order versions were set or registered. None when
        either is unknown."""
        if _is_int(old) and _is_int(new):
            return int(new) - int(old)
        with self._lock:
            used = list(self._used)
        positions = [next((i for i, v in enumerate(used) if type(v) is type(x) and v == x), None) for x in (old, new)]
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
        if conflict := self.pool.version_conflict(version):
            raise WeightUpdateConflict(conflict)

    async def apply(self, body: UpdateRequest, what: str) -> None:
        """Without `reload`, set the version; with it, reload every engine first (WeightReloadFailed if one
        fails), then check again that nothing was resumed meanwhile and set the version. One reload at a time
        (WeightUpdateConflict otherwise)."""
        if body.reload is None:
            self._set(body)
            return
        if self.lock.locked():
            raise WeightUpdateConflict("another weight update is reloading the engines; wait for its answer")
        async with self.lock:
            loaded = await self._reload(body)
            gate = self.pool.gate
            if not gate.paused or gate.in_flight:
                raise WeightUpdateConflict(
                    f"LLM dispatching was resumed while {len(loaded)} engine(s) loaded {body.reload.path!r}; "
                    f"the weight version is unchanged: pause, then {what} again"
                )
            for backend in self._set(body):
                self.pool.notes(backend).weights_path = body.reload.path

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
            rolled_back = await self._roll_back(loaded, previous, reload.timeout_s) if loaded else ""
            raise WeightReloadFailed(
                f"{len(failed)} of {len(addresses)} LLM backend(s) did not reload their weights, so the weight "
                f"version is unchanged: {_shown(failed)}{rolled_back}"
            )
        return loaded

    async def _roll_back(self, loaded: list[Reloaded], previous: dict[str, str | None], timeout_s: float) -> str:
        """Give the engines in `loaded` their previous checkpoint back (prefix caches reset); a clause for the
        failure's message."""
        pool = self.pool
        known = {b.address: b for b in pool.backends()}

        async def restore_all() -> list[tuple[bool, str]]:
            calls = (
                restore_weights(pool.client, r.address, previous[r.address], timeout_s, reset=True) for r in loaded
            )
            return await asyncio.gather(*calls)

        outcomes = await self.run(restore_all())
        stuck = []
        for reloaded, (ok, sentence) in zip(loaded, outcomes, strict=True):
            if ok and reloaded.address in known:
                pool.notes(known[reloaded.address]).weights_path = previous[reloaded.address]
            elif not ok:
                stuck.append(f"{reloaded.address}: {sentence}")
        restored = len(loaded) - len(stuck)
        clause = f"; the {len(loaded)} that did load it were rolled back"
        if stuck:
            clause += f" ({restored} to their previous weights; not: {_shown(stuck)})"
        else:
            clause += f" to their previous weights: {_shown([r.address for r in loaded])}"
        return clause


def _shown(items: list[str]) -> str:
    more = len(items) - _SHOWN_FAILURES
    return " | ".join(items[:_SHOWN_FAILURES]) + (f" | and {more} more" if more > 0 else "")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
